//! `revault pull`: restore a version from the worker to a file, a directory
//! or stdout. By default the worker sends the stored blocks and the version
//! is assembled here ([`revault_engine::transfer`]): a fraction of the bytes
//! crosses the network and the decoding runs on this side. With `--transfer
//! bytes` (or a worker without block transfer) the worker assembles the
//! version and sends every byte, a directory version as a tar stream that is
//! extracted on the fly ([`revault_engine::extract_tar`]). Either way a
//! directory is written by the engine's one directory writer, which never
//! writes outside the target, whatever the version holds.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use revault_engine::{
    extract_tar, transfer,
    transfer::{Destination, Receiver},
};

use super::{check, runtime, series_path, ChannelRead, Conn, ServerArgs, QUEUE};
use crate::output::{self, mib, rate};

#[derive(Args, Clone, Debug)]
pub struct PullArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[arg(long)]
    pub series: String,
    /// A version number or `latest`.
    #[arg(long, default_value = "latest")]
    pub version: String,
    /// Restore cache on the server: auto (default), faa, opt, lru-container, lru-chunk or dasm.
    #[arg(long)]
    pub cache: Option<String>,
    /// Restore memory on the server, MiB.
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// Output: `-` (stdout, default), a FILE (written under a temporary name,
    /// renamed when complete), or a DIR (existing, or ending in `/`) to
    /// extract a directory version into.
    #[arg(short = 'o', long = "output", default_value = "-")]
    pub output: String,
    /// How the version travels: `blocks` (default: the stored, compressed
    /// blocks, assembled here within the restore memory) or `bytes` (the
    /// server assembles and sends every byte).
    #[arg(long, value_enum, default_value = "blocks")]
    pub transfer: Transfer,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    Blocks,
    Bytes,
}

enum Target {
    Stdout,
    File(PathBuf),
    /// A device or FIFO (e.g. /dev/null): written in place, never replaced.
    Special(PathBuf),
    Dir(PathBuf),
}

/// Extracts the server's tar stream into `dir` through the engine's
/// directory writer (permissions and mtimes always, ownership when running
/// as root), then reads the rest of the body (the end-of-archive padding) so
/// the whole download completes. Returns the entries' warnings.
fn extract(mut r: ChannelRead, dir: &Path) -> io::Result<Vec<String>> {
    let warnings = extract_tar("the download", &mut r, dir).map_err(io::Error::other)?;
    io::copy(&mut r, &mut io::sink())?;
    Ok(warnings)
}

fn partial_name(p: &Path) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pull".into());
    p.with_file_name(format!(".{name}.revault-partial"))
}

/// A file, stdout or a device to write the version to. A file is written
/// under a partial name beside it and renamed when complete.
struct OutFile {
    file: File,
    /// (partial name, final name).
    rename: Option<(PathBuf, PathBuf)>,
}

impl OutFile {
    /// Opens the target; a directory target comes back as `Err(dir)`.
    fn open(target: Target) -> io::Result<Result<OutFile, PathBuf>> {
        Ok(Ok(match target {
            // The raw descriptor: `io::stdout()` is line-buffered, which
            // scans and re-buffers binary data.
            Target::Stdout => OutFile {
                file: File::from(io::stdout().as_fd().try_clone_to_owned()?),
                rename: None,
            },
            Target::Special(p) => OutFile {
                file: std::fs::OpenOptions::new().write(true).open(p)?,
                rename: None,
            },
            Target::File(p) => {
                let tmp = partial_name(&p);
                OutFile {
                    file: File::create(&tmp)?,
                    rename: Some((tmp, p)),
                }
            }
            Target::Dir(d) => return Ok(Err(d)),
        }))
    }

    /// Syncs a file and renames it into place (removing it if that fails).
    fn complete(&self) -> io::Result<()> {
        let Some((tmp, p)) = &self.rename else {
            return Ok(());
        };
        let done = self.file.sync_all().and_then(|_| std::fs::rename(tmp, p));
        if done.is_err() {
            self.discard();
        }
        done
    }

    /// Removes a partial file.
    fn discard(&self) {
        if let Some((tmp, _)) = &self.rename {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Where the body goes. Bytes for a file, stdout or a device are written
/// from the download loop itself, each piece as it arrives: handing every
/// piece (tens of KiB over loopback) to a writer thread cost more CPU than
/// the writes, and a piece written and dropped at once lets the HTTP client
/// reuse its read buffer instead of faulting in fresh pages. A write that
/// blocks (a slow pipe) holds one of the two runtime threads, which is the
/// backpressure we want. A tar stream for a directory is extracted on a
/// blocking thread fed through a bounded channel. A block stream goes
/// to a [`Receiver`], which decodes it on its own thread.
enum Sink {
    Direct(OutFile),
    Extract {
        tx: mpsc::Sender<io::Result<Bytes>>,
        task: tokio::task::JoinHandle<io::Result<Vec<String>>>,
    },
    Blocks {
        rx: Box<Receiver>,
        /// The output file (its handle kept to sync it); none for a directory.
        out: Option<OutFile>,
    },
}

/// What a completed sink wrote: a block stream knows the version's size and
/// what a directory restore could not reproduce.
#[derive(Default)]
struct Written {
    bytes: Option<u64>,
    warnings: Vec<String>,
}

impl Sink {
    /// The sink for the server's bytes (a tar stream for a directory).
    fn bytes(target: Target) -> io::Result<Sink> {
        Ok(match OutFile::open(target)? {
            Ok(out) => Sink::Direct(out),
            Err(d) => {
                let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(QUEUE);
                let task = tokio::task::spawn_blocking(move || extract(ChannelRead::new(rx), &d));
                Sink::Extract { tx, task }
            }
        })
    }

    /// The sink for a block-transfer stream.
    fn blocks(target: Target) -> io::Result<Sink> {
        let (dest, out) = match OutFile::open(target)? {
            Ok(out) => {
                let w = io::BufWriter::with_capacity(1 << 20, out.file.try_clone()?);
                (Destination::Writer(Box::new(w)), Some(out))
            }
            Err(d) => (Destination::Dir(d), None),
        };
        Ok(Sink::Blocks {
            rx: Box::new(Receiver::new(dest)),
            out,
        })
    }

    async fn write(&mut self, b: Bytes) -> io::Result<()> {
        match self {
            Sink::Direct(out) => out.file.write_all(&b),
            Sink::Blocks { rx, .. } => rx.feed(&b).map_err(io::Error::other),
            // A closed channel means the extraction failed; `abandon` says why.
            Sink::Extract { tx, .. } => tx
                .send(Ok(b))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the extraction stopped")),
        }
    }

    /// Completes the output: synced and renamed into place, or extracted.
    async fn finish(self) -> io::Result<Written> {
        match self {
            Sink::Direct(out) => out.complete().map(|_| Written::default()),
            Sink::Extract { tx, task } => {
                drop(tx);
                let warnings = task.await.map_err(io::Error::other)??;
                Ok(Written {
                    bytes: None,
                    warnings,
                })
            }
            Sink::Blocks { rx, out } => match rx.finish() {
                Ok(r) => {
                    if let Some(out) = &out {
                        out.complete()?;
                    }
                    Ok(Written {
                        bytes: Some(r.header.logical_bytes),
                        warnings: r.warnings,
                    })
                }
                Err(e) => {
                    if let Some(out) = &out {
                        out.discard();
                    }
                    Err(io::Error::other(e))
                }
            },
        }
    }

    /// Gives up: removes a partial file, or ends an extraction with `why`
    /// and joins it. Returns the error to report: the extraction's own if
    /// it had stopped first (writing to it fails only then), else `why`.
    async fn abandon(self, why: io::Error) -> io::Error {
        match self {
            Sink::Direct(out) | Sink::Blocks { out: Some(out), .. } => {
                out.discard();
                why
            }
            Sink::Blocks { out: None, .. } => why,
            Sink::Extract { tx, task } => {
                let _ = tx
                    .send(Err(io::Error::new(why.kind(), why.to_string())))
                    .await;
                drop(tx);
                match task.await {
                    Ok(Err(own)) => own,
                    _ => why,
                }
            }
        }
    }
}

pub fn pull(a: PullArgs, json: bool, quiet: bool) -> Result<()> {
    let path = series_path(&a.series)?;
    let version = a.version.clone();
    if version != "latest" && version.parse::<u32>().map(|n| n == 0).unwrap_or(true) {
        bail!("--version {version:?}: expected a version number (1, 2, ...) or `latest`");
    }
    let target = if a.output == "-" {
        Target::Stdout
    } else if a.output.ends_with('/') || Path::new(&a.output).is_dir() {
        Target::Dir(PathBuf::from(&a.output))
    } else if std::fs::metadata(&a.output).is_ok_and(|m| !m.is_file()) {
        Target::Special(PathBuf::from(&a.output))
    } else {
        Target::File(PathBuf::from(&a.output))
    };
    let conn = Conn::new(&a.server)?;
    let started = Instant::now();
    let rt = runtime()?;
    let (kind, number, restored, received, blocks, report, written_as) = rt.block_on(async {
        conn.wait_until_ready(false, quiet).await?;
        let mut q: Vec<(&str, String)> = Vec::new();
        if let Some(c) = &a.cache {
            q.push(("cache", c.clone()));
        }
        if let Some(m) = a.cache_mib {
            q.push(("cacheMib", m.to_string()));
        }
        let mut req = conn
            .req(reqwest::Method::GET, &format!("{path}/versions/{version}"))
            .query(&q);
        if a.transfer == Transfer::Blocks {
            // A server without block transfer answers with the bytes.
            req = req.header(
                reqwest::header::ACCEPT,
                format!("{}, */*;q=0.1", transfer::MEDIA_TYPE),
            );
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("connecting to {}", conn.base))?;
        let resp = check(resp).await?;
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let kind = header("x-revault-kind");
        let number = header("x-revault-version");
        let restore_id = header("x-revault-restore-id");
        let total = resp.content_length();
        let blocks = header("content-type") == transfer::MEDIA_TYPE;
        // As `revault restore`: a directory version asked for at a new path not named like a
        // tar file is extracted there.
        let target = match target {
            Target::File(p) if kind == "tree" && !p.exists() && !output::named_like_tar(&a.output) => {
                Target::Dir(p)
            }
            t => t,
        };
        let written_as = match &target {
            Target::Stdout => "to stdout".to_string(),
            Target::Special(p) => format!("written into {}", p.display()),
            Target::Dir(p) => format!("extracted into directory {}", p.display()),
            Target::File(p) if kind == "tree" => format!("written as a tar archive to {}", p.display()),
            Target::File(p) => format!("written to file {}", p.display()),
        };
        if kind == "stream" && matches!(target, Target::Dir(_)) {
            bail!(
                "{} version {number} is a single stream, not a directory; pull it to a file (-o FILE)",
                a.series
            );
        }
        let pb = output::progress(total, quiet, &format!("pull {} v{number}", a.series));
        let mut sink = if blocks { Sink::blocks(target) } else { Sink::bytes(target) }
            .with_context(|| format!("writing {}", a.output))?;
        let mut body = resp.bytes_stream();
        let mut received = 0u64;
        let (mut broke, mut write_err) = (None, None);
        while let Some(item) = body.next().await {
            match item {
                Ok(b) => {
                    received += b.len() as u64;
                    if let Err(e) = sink.write(b).await {
                        write_err = Some(e);
                        break;
                    }
                    match &sink {
                        Sink::Blocks { rx, .. } => {
                            if let Some(h) = rx.header() {
                                pb.set_length(h.logical_bytes);
                            }
                            pb.set_position(rx.written());
                        }
                        _ => pb.set_position(received),
                    }
                }
                Err(e) => {
                    broke = Some(format!("the download broke off after {received} bytes: {e}"));
                    break;
                }
            }
        }
        pb.finish_and_clear();
        if let Some(msg) = broke {
            sink.abandon(io::Error::other(msg.clone())).await;
            bail!("{msg}; nothing was written under the output name");
        }
        let done = match write_err {
            None => sink.finish().await,
            Some(e) => Err(sink.abandon(e).await),
        };
        let written = done.with_context(|| format!("writing {}", a.output))?;
        for w in &written.warnings {
            eprintln!("warning: {w}");
        }
        // Bytes of the version written (a block stream's wire bytes are fewer).
        let restored = written.bytes.unwrap_or(received);
        if let Some(t) = total {
            if received != t {
                bail!("the download ended after {received} of {t} bytes");
            }
        }
        // The server's report: container reads, speed factor, ...
        let report = match conn
            .req(reqwest::Method::GET, &format!("/v1/restores/{restore_id}"))
            .send()
            .await
        {
            Ok(r) => match check(r).await {
                Ok(r) => r.json::<serde_json::Value>().await.ok(),
                Err(_) => None,
            },
            Err(_) => None,
        };
        Ok::<_, anyhow::Error>((kind, number, restored, received, blocks, report, written_as))
    })?;
    let secs = started.elapsed().as_secs_f64();
    let report = report.unwrap_or(serde_json::Value::Null);
    if report["state"] == "failed" {
        bail!(
            "the server reported the restore as failed: {}",
            report["error"]["message"]
        );
    }
    if json {
        let out = serde_json::json!({
            "series": a.series,
            "version": number.parse::<u64>().ok(),
            "kind": kind,
            "bytes": restored,
            "transfer": if blocks { "blocks" } else { "bytes" },
            "wireBytes": received,
            "seconds": secs,
            "output": a.output,
            "server": report,
        });
        if a.output == "-" {
            eprintln!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            output::json(&out);
        }
    } else {
        eprintln!(
            "{} version {} {written_as}: {} MiB in {:.2}s ({} MiB/s), {} container reads, speed factor {}",
            a.series,
            number,
            mib(restored),
            secs,
            rate(restored, secs),
            report["containerReads"],
            report["speedFactor"]
                .as_f64()
                .map(|s| format!("{s:.2}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    Ok(())
}
