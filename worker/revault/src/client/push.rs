//! `revault push`: stream a file, stdin or a directory (as a tar built on the
//! fly) to the worker as the next version of a series.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use indicatif::ProgressBar;
use tokio::sync::mpsc;

use super::{check, runtime, series_path, ChannelWrite, Conn, Sent, ServerArgs, QUEUE};
use crate::cli::NewVersionArgs;
use crate::output::{self, mib, rate};

#[derive(Args, Clone, Debug)]
pub struct PushArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub version: NewVersionArgs,
    /// A file, a directory (sent as a tar stream), or `-` for stdin.
    pub input: String,
}

enum Input {
    Stdin,
    File(PathBuf, u64),
    Dir(PathBuf),
}

/// Copies `r` into the body queue, counting bytes for the progress bar.
fn pump(mut r: impl Read, w: &mut ChannelWrite, pb: &ProgressBar) -> io::Result<()> {
    loop {
        match w.fill_from(&mut r)? {
            0 => break,
            n => pb.inc(n as u64),
        }
    }
    w.flush()
}

/// Counts bytes written through it (the tar stream's progress).
struct Counting<'a, W: Write> {
    w: W,
    pb: &'a ProgressBar,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.w.write(b)?;
        self.pb.inc(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// Writes `dir` as a tar stream: modes, owners, mtimes, symlinks kept.
pub fn write_tar(dir: &Path, out: impl Write) -> io::Result<()> {
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Complete);
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)?;
    b.into_inner()?.flush()
}

fn produce(input: Input, tx: mpsc::Sender<io::Result<Bytes>>, pb: ProgressBar) {
    let mut w = ChannelWrite::new(tx.clone());
    let r = match input {
        Input::Stdin => pump(io::stdin().lock(), &mut w, &pb),
        Input::File(p, _) => File::open(&p).and_then(|f| pump(f, &mut w, &pb)),
        Input::Dir(p) => write_tar(&p, Counting { w: &mut w, pb: &pb }),
    };
    if let Err(e) = r {
        // The body ends with an error: the server sees it cut short and
        // creates no version.
        let _ = tx.blocking_send(Err(e));
    }
}

/// Waits, within --wait-ready, while a backup of the series runs on the worker: it would refuse
/// this one (409 `series_busy`), and the one running may be an earlier attempt of this very
/// backup (a Job's pod that failed) that the worker drops once it notices its client is gone.
/// A backup that only waits for a slot is no reason to wait: this one takes over from it. Past
/// the deadline, or when the worker cannot say, the push goes ahead and the worker answers.
async fn wait_while_series_busy(conn: &Conn, path: &str, series: &str, quiet: bool) {
    let deadline = tokio::time::Instant::now() + conn.wait_ready;
    let mut backoff = Duration::from_millis(500);
    let mut said = false;
    loop {
        let progress = match conn
            .req(reqwest::Method::GET, &format!("{path}/backup"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r.json::<serde_json::Value>().await.ok(),
            _ => None,
        };
        let Some(p) = progress.filter(|p| p["running"] == true && p["queued"] == false) else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        if !said && !quiet {
            eprintln!(
                "waiting: series {series} has a backup in progress on {} (since {}, {} MiB so far)",
                conn.base,
                p["startedAt"].as_str().unwrap_or("?"),
                mib(p["logicalBytes"].as_u64().unwrap_or(0)),
            );
            said = true;
        }
        tokio::time::sleep(backoff.min(deadline - now)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

pub fn push(a: PushArgs, json: bool, quiet: bool) -> Result<()> {
    let NewVersionArgs { series, unit, time } = &a.version;
    let path = series_path(series)?;
    let input = if a.input == "-" {
        Input::Stdin
    } else {
        let m = std::fs::metadata(&a.input).with_context(|| format!("cannot read {}", a.input))?;
        if m.is_dir() {
            Input::Dir(PathBuf::from(&a.input))
        } else {
            Input::File(PathBuf::from(&a.input), m.len())
        }
    };
    // Bad flags fail here, before anything is sent; the server gets them as given.
    a.version.parse()?;
    let conn = Conn::new(&a.server)?;
    let (ct, size) = match &input {
        Input::Dir(_) => ("application/x-tar", None),
        Input::File(_, n) => ("application/octet-stream", Some(*n)),
        Input::Stdin => ("application/octet-stream", None),
    };
    let pb = output::progress(size, quiet, &format!("push {series}"));
    let started = Instant::now();
    let rt = runtime()?;
    let rep: serde_json::Value = rt.block_on(async {
        conn.wait_until_ready(true, quiet).await?;
        wait_while_series_busy(&conn, &path, series, quiet).await;
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(QUEUE);
        let pb2 = pb.clone();
        let producer = std::thread::Builder::new()
            .name("revault-push".into())
            .spawn(move || produce(input, tx, pb2))
            .context("starting the reader thread")?;
        let sent = Sent::default();
        let body = reqwest::Body::wrap_stream(
            sent.counting(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|x| (x, rx))
            })),
        );
        let mut q: Vec<(&str, String)> = Vec::new();
        if let Some(u) = unit {
            q.push(("unit", u.clone()));
        }
        if let Some(t) = time {
            q.push(("time", t.clone()));
        }
        let mut req = conn
            .req(reqwest::Method::PUT, &format!("{path}/versions"))
            .query(&q)
            .header(reqwest::header::CONTENT_TYPE, ct);
        if let Some(n) = size {
            req = req.header(reqwest::header::CONTENT_LENGTH, n);
        }
        let resp = conn.send_watched(req.body(body), &path, &sent).await?;
        let resp = check(resp).await?;
        let v: serde_json::Value = resp.json().await.context("reading the server's report")?;
        let _ = tokio::task::spawn_blocking(move || producer.join()).await;
        Ok::<_, anyhow::Error>(v)
    })?;
    pb.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    if json {
        let mut out = rep.clone();
        out["clientSeconds"] = secs.into();
        output::json(&out);
    } else {
        let bytes = rep["logicalBytes"].as_u64().unwrap_or(0);
        println!(
            "{} version {}: {} MiB in {:.2}s ({} MiB/s), {} MiB new data ({} MiB on disk)",
            rep["series"].as_str().unwrap_or(series),
            rep["version"],
            mib(bytes),
            secs,
            rate(bytes, secs),
            mib(rep["newBytes"].as_u64().unwrap_or(0)),
            mib(rep["storedBytes"].as_u64().unwrap_or(0)),
        );
    }
    if rep["version"].as_u64().is_none() {
        bail!("the server's report has no version: {rep}");
    }
    Ok(())
}
