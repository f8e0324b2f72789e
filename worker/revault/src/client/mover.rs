//! `revault move`: copies a series, every version with its number, time and kind, from one
//! worker to another, checks that each version restores from the destination byte for byte as
//! it does from the source, and then (unless told to keep it) deletes the source's copy.
//!
//! This is what draining a worker is made of: the operator runs it with `--keep-source`, moves
//! its placement record to the destination, and deletes the source's copy itself, so the record
//! always names a worker that holds the whole series.
//!
//! A move that stops half-way (a Job killed, a worker restarted) is run again: versions the
//! destination already holds are checked, not copied again. Backups commit whole, so the
//! destination holds either all of a version or none of it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::{check, runtime, series_path, Conn, Sent, ServerArgs};
use crate::output;

#[derive(Args, Clone, Debug)]
pub struct MoveArgs {
    /// Series name, NAMESPACE/NAME.
    pub series: String,
    /// The worker that holds the series, e.g. https://revault-ssd-node-a.revault-system.svc:8420
    #[arg(long)]
    pub from: String,
    /// The worker to move it to.
    #[arg(long)]
    pub to: String,
    /// File holding the bearer token, accepted by both workers. Default: REVAULT_TOKEN.
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    /// Trust this CA certificate (PEM) for https workers.
    #[arg(long)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// How long to wait for a worker that is starting.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub wait_ready: Duration,
    /// Leave the source's copy in place (the operator deletes it once the series' placement
    /// names the destination).
    #[arg(long)]
    pub keep_source: bool,
    /// Delete from the destination the versions of an earlier, unfinished copy that the source
    /// no longer holds (expired there meanwhile): for a destination that is not the series'
    /// home yet. The operator passes it.
    #[arg(long)]
    pub prune_destination: bool,
}

/// One version as the source lists it.
#[derive(Clone, Debug)]
struct Listed {
    number: u32,
    time: String,
    kind: String,
    logical_bytes: u64,
}

/// A series as one worker lists it: its unit, retention and versions (oldest first); `None`
/// when the worker does not hold it.
struct Held {
    detail: Value,
    versions: Vec<Listed>,
}

fn conn(a: &MoveArgs, server: &str) -> Result<Conn> {
    Conn::new(&ServerArgs {
        server: server.to_string(),
        token_file: a.token_file.clone(),
        ca_cert: a.ca_cert.clone(),
        wait_ready: a.wait_ready,
    })
}

pub fn move_series(a: MoveArgs, json_out: bool, quiet: bool) -> Result<()> {
    let path = series_path(&a.series)?;
    let (src, dst) = (conn(&a, &a.from)?, conn(&a, &a.to)?);
    if src.base == dst.base {
        bail!("--from and --to name the same worker ({})", src.base);
    }
    let started = Instant::now();
    let report = runtime()?.block_on(run(&a, &path, &src, &dst, quiet))?;
    let secs = started.elapsed().as_secs_f64();
    if json_out {
        let mut out = report;
        out["clientSeconds"] = secs.into();
        output::json(&out);
    } else {
        println!(
            "{}: {} versions on {} ({} copied, {} already there), each restores as from {}; {}",
            a.series,
            report["versions"],
            dst.base,
            report["copied"],
            report["alreadyThere"],
            src.base,
            if a.keep_source {
                "the source's copy is kept"
            } else {
                "the source's copy is deleted"
            }
        );
    }
    Ok(())
}

async fn run(a: &MoveArgs, path: &str, src: &Conn, dst: &Conn, quiet: bool) -> Result<Value> {
    src.wait_until_ready(!a.keep_source, quiet).await?;
    dst.wait_until_ready(true, quiet).await?;
    refuse_buckets(src, &a.series).await?;
    let Some(from) = held(src, path).await? else {
        bail!("{} does not hold series {}", src.base, a.series);
    };
    let mut there = held(dst, path)
        .await?
        .map(|h| h.versions)
        .unwrap_or_default();
    if a.prune_destination {
        there = prune(dst, path, &from.versions, there).await?;
    }
    let todo = still_to_copy(&a.series, &from.versions, &there, &dst.base)?;
    let unit = from.detail["unit"]
        .as_str()
        .unwrap_or("segment")
        .to_string();
    let mut sums = std::collections::BTreeMap::new();
    for v in &todo {
        let sum = copy_version(src, dst, path, v, &unit)
            .await
            .with_context(|| format!("copying version {} of {}", v.number, a.series))?;
        sums.insert(v.number, sum);
        if !quiet {
            eprintln!("copied version {} ({} bytes)", v.number, v.logical_bytes);
        }
    }
    copy_retention(src, dst, path, &from.detail).await?;
    for v in &from.versions {
        verify_version(src, dst, path, v, sums.get(&v.number).copied())
            .await
            .with_context(|| {
                format!(
                    "checking version {} of {} on {}",
                    v.number, a.series, dst.base
                )
            })?;
    }
    // Sealed before the last look: from here on the source refuses every backup of the series,
    // naming the destination, so none can be acknowledged there after that look.
    if !a.keep_source {
        set_moved_to(src, path, Some(&dst.base))
            .await
            .with_context(|| {
                format!(
                    "sealing {} on {} (a backup of it running there? run again once it ended)",
                    a.series, src.base
                )
            })?;
    }
    // A backup the source took meanwhile would be left behind: the caller stops backups first.
    let now = held(src, path)
        .await?
        .map(|h| h.versions)
        .unwrap_or_default();
    if now.last().map(|v| v.number) != from.versions.last().map(|v| v.number) {
        if !a.keep_source {
            set_moved_to(src, path, None).await?;
        }
        bail!(
            "series {} gained a version on {} during the move: stop its backups and run the move again",
            a.series,
            src.base
        );
    }
    if !a.keep_source {
        drop_source(src, path, &from.versions)
            .await
            .with_context(|| {
                format!(
                    "deleting the moved versions of {} from {}",
                    a.series, src.base
                )
            })?;
    }
    Ok(json!({
        "series": a.series,
        "from": src.base,
        "to": dst.base,
        "versions": from.versions.len(),
        "copied": todo.len(),
        "alreadyThere": from.versions.len() - todo.len(),
        "logicalBytes": from.versions.iter().map(|v| v.logical_bytes).sum::<u64>(),
        "sourceKept": a.keep_source,
    }))
}

/// Sends a request built on `c`, naming the worker when it cannot be reached.
async fn send(c: &Conn, r: reqwest::RequestBuilder) -> Result<reqwest::Response> {
    r.send()
        .await
        .with_context(|| format!("reaching {}", c.base))
}

/// Seals the series on `c` as moved to `to` (its backups are refused, naming `to`), or unseals
/// it with `None`.
async fn set_moved_to(c: &Conn, path: &str, to: Option<&str>) -> Result<()> {
    let resp = send(
        c,
        c.req(reqwest::Method::PUT, &format!("{path}/moved-to"))
            .json(&json!({ "movedTo": to })),
    )
    .await?;
    check(resp).await?;
    Ok(())
}

/// Deletes from the destination the versions the source no longer lists; returns the rest.
async fn prune(dst: &Conn, path: &str, from: &[Listed], there: Vec<Listed>) -> Result<Vec<Listed>> {
    let (kept, gone): (Vec<Listed>, Vec<Listed>) = there
        .into_iter()
        .partition(|t| from.iter().any(|f| f.number == t.number));
    delete_versions(dst, path, &gone).await.with_context(|| {
        format!(
            "deleting versions no longer on the source from {}",
            dst.base
        )
    })?;
    Ok(kept)
}

/// Deletes from the source the versions that were moved, one by one: a version pushed there
/// meanwhile is never deleted with them, and is reported.
async fn drop_source(src: &Conn, path: &str, moved: &[Listed]) -> Result<()> {
    delete_versions(src, path, moved).await?;
    let left = held(src, path)
        .await?
        .map(|h| h.versions)
        .unwrap_or_default();
    if !left.is_empty() {
        let nums: Vec<String> = left.iter().map(|v| v.number.to_string()).collect();
        bail!(
            "the source still holds version(s) {} (pushed during the move): they were not moved",
            nums.join(", ")
        );
    }
    Ok(())
}

/// Deletes these versions from `c`, one by one; one already gone is not an error.
async fn delete_versions(c: &Conn, path: &str, versions: &[Listed]) -> Result<()> {
    for v in versions {
        let resp = send(
            c,
            c.req(
                reqwest::Method::DELETE,
                &format!("{path}/versions/{}", v.number),
            ),
        )
        .await?;
        if resp.status() != reqwest::StatusCode::NOT_FOUND {
            check(resp)
                .await
                .with_context(|| format!("deleting version {}", v.number))?;
        }
    }
    Ok(())
}

/// An object bucket's versions are other objects, with keys beside them: not a series to move.
async fn refuse_buckets(src: &Conn, series: &str) -> Result<()> {
    let resp = send(
        src,
        src.req(reqwest::Method::GET, &format!("/v1/buckets/{series}")),
    )
    .await?;
    if resp.status().is_success() {
        bail!(
            "{series} on {} is an object bucket: moving buckets is not built",
            src.base
        );
    }
    Ok(())
}

/// The series as `c` holds it, `None` when it holds none.
async fn held(c: &Conn, path: &str) -> Result<Option<Held>> {
    let resp = send(c, c.req(reqwest::Method::GET, path)).await?;
    if resp.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    let detail: Value = check(resp)
        .await?
        .json()
        .await
        .context("reading the series")?;
    let mut versions = Vec::new();
    for v in detail["versionList"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let (Some(number), Some(time), Some(kind), Some(logical_bytes)) = (
            v["number"].as_u64(),
            v["time"].as_str(),
            v["kind"].as_str(),
            v["logicalBytes"].as_u64(),
        ) else {
            bail!(
                "{} listed a version without number, time, kind or size: {v}",
                c.base
            );
        };
        versions.push(Listed {
            number: u32::try_from(number).context("version number")?,
            time: time.to_string(),
            kind: kind.to_string(),
            logical_bytes,
        });
    }
    versions.sort_by_key(|v| v.number);
    Ok(Some(Held { detail, versions }))
}

/// The source's versions the destination lacks. What the destination holds must be versions of
/// the source (same number, size and time) — a copy begun before — and nothing it lacks may be
/// numbered below its newest, since numbers are never taken again.
fn still_to_copy(
    series: &str,
    from: &[Listed],
    there: &[Listed],
    dst: &str,
) -> Result<Vec<Listed>> {
    for t in there {
        match from.iter().find(|f| f.number == t.number) {
            Some(f) if f.logical_bytes == t.logical_bytes && same_time(&f.time, &t.time) => {}
            _ => bail!(
                "{dst} already holds version {} of {series}, which is not the source's: \
                 delete the series there first if that copy is not needed",
                t.number
            ),
        }
    }
    let newest = there.last().map_or(0, |t| t.number);
    let todo: Vec<Listed> = from
        .iter()
        .filter(|f| !there.iter().any(|t| t.number == f.number))
        .cloned()
        .collect();
    if let Some(gap) = todo.iter().find(|f| f.number < newest) {
        bail!(
            "{dst} lacks version {} of {series} but holds the newer {newest}: it cannot take it any more",
            gap.number
        );
    }
    Ok(todo)
}

/// Times as the workers print them (RFC 3339, whole seconds): compared as instants.
fn same_time(a: &str, b: &str) -> bool {
    match (
        humantime::parse_rfc3339_weak(a),
        humantime::parse_rfc3339_weak(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

fn content_type(kind: &str) -> &'static str {
    if kind == "tree" {
        "application/x-tar"
    } else {
        "application/octet-stream"
    }
}

/// Streams version `v` from `src` into `dst` under its own number, time and kind; returns the
/// BLAKE3 of the bytes that went through.
async fn copy_version(
    src: &Conn,
    dst: &Conn,
    path: &str,
    v: &Listed,
    unit: &str,
) -> Result<[u8; 32]> {
    let resp = send(
        src,
        src.req(
            reqwest::Method::GET,
            &format!("{path}/versions/{}", v.number),
        ),
    )
    .await?;
    let resp = check(resp).await?;
    let hasher = Arc::new(Mutex::new(blake3::Hasher::new()));
    let h2 = hasher.clone();
    let sent = Sent::default();
    let body = reqwest::Body::wrap_stream(sent.counting(resp.bytes_stream().map(move |b| {
        if let Ok(b) = &b {
            h2.lock().unwrap().update(b);
        }
        b
    })));
    let q = [
        ("version", v.number.to_string()),
        ("time", v.time.clone()),
        ("unit", unit.to_string()),
    ];
    let upload = dst
        .req(reqwest::Method::PUT, &format!("{path}/versions"))
        .query(&q)
        .header(reqwest::header::CONTENT_TYPE, content_type(&v.kind))
        .body(body);
    // The destination may queue the copy for a backup slot like any backup.
    let resp = dst.send_watched(upload, path, &sent).await?;
    let rep: Value = check(resp)
        .await?
        .json()
        .await
        .context("reading the destination's report")?;
    let (number, bytes) = (rep["version"].as_u64(), rep["logicalBytes"].as_u64());
    if number != Some(u64::from(v.number)) || bytes != Some(v.logical_bytes) {
        bail!(
            "{} stored version {number:?} of {bytes:?} bytes, not version {} of {} bytes",
            dst.base,
            v.number,
            v.logical_bytes
        );
    }
    let sum = *hasher.lock().unwrap().finalize().as_bytes();
    Ok(sum)
}

/// The BLAKE3 of version `number` as `c` restores it.
async fn restored_sum(c: &Conn, path: &str, number: u32) -> Result<[u8; 32]> {
    let resp = send(
        c,
        c.req(reqwest::Method::GET, &format!("{path}/versions/{number}")),
    )
    .await?;
    let mut body = check(resp).await?.bytes_stream();
    let mut h = blake3::Hasher::new();
    while let Some(b) = body.next().await {
        h.update(&b.with_context(|| format!("reading version {number} from {}", c.base))?);
    }
    Ok(*h.finalize().as_bytes())
}

/// The destination restores version `v` byte for byte as the source does (`copied`: the sum of
/// the bytes this run copied, so the source is read once).
async fn verify_version(
    src: &Conn,
    dst: &Conn,
    path: &str,
    v: &Listed,
    copied: Option<[u8; 32]>,
) -> Result<()> {
    let want = match copied {
        Some(s) => s,
        None => restored_sum(src, path, v.number).await?,
    };
    if restored_sum(dst, path, v.number).await? != want {
        bail!("it does not restore byte for byte as from the source");
    }
    Ok(())
}

/// The series' retention (keep rules, live window, automatic slides), set once every version is
/// there so that no rule expires a version before it is copied.
async fn copy_retention(src: &Conn, dst: &Conn, path: &str, detail: &Value) -> Result<()> {
    let retention = &detail["retention"];
    if retention.is_null() {
        return Ok(());
    }
    let resp = send(
        dst,
        dst.req(reqwest::Method::PUT, &format!("{path}/retention"))
            .json(retention),
    )
    .await?;
    check(resp)
        .await
        .with_context(|| format!("setting the retention copied from {}", src.base))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(number: u32, bytes: u64) -> Listed {
        Listed {
            number,
            time: "2026-11-29T10:00:00Z".into(),
            kind: "stream".into(),
            logical_bytes: bytes,
        }
    }

    #[test]
    fn a_copy_begun_before_is_continued() {
        let from = [v(2, 10), v(5, 20), v(9, 30)];
        let todo = still_to_copy("ns/a", &from, &[v(2, 10)], "dst").unwrap();
        assert_eq!(todo.iter().map(|v| v.number).collect::<Vec<_>>(), [5, 9]);
        assert!(still_to_copy("ns/a", &from, &from, "dst")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_destination_with_other_data_is_refused() {
        let from = [v(2, 10), v(5, 20)];
        let e = still_to_copy("ns/a", &from, &[v(2, 11)], "dst").unwrap_err();
        assert!(e.to_string().contains("not the source's"), "{e}");
        let e = still_to_copy("ns/a", &from, &[v(3, 10)], "dst").unwrap_err();
        assert!(e.to_string().contains("version 3"), "{e}");
        let e = still_to_copy("ns/a", &from, &[v(5, 20)], "dst").unwrap_err();
        assert!(e.to_string().contains("lacks version 2"), "{e}");
    }
}
