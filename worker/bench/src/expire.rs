//! `revault-bench expire`: the cost of expiring the oldest version as the
//! store grows (10, 20, 40 versions), beside a full mark-and-sweep of the
//! same store, on a synthetic series (src/gen.rs).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use serde::Serialize;

use revault_engine::{backup, expire, gc, BackupOptions, DedupUnit, ExpireSel, GcOptions, MIB};

use crate::gen::{generate, GenFormat, GenOptions, GenVersion};
use crate::harness::{fresh_store, median, progress, reverse_dedup, source, write_csv, SERIES};
use crate::{plot, print_json};

#[derive(Args)]
pub struct ExpireArgs {
    #[arg(long)]
    pub out: PathBuf,
    /// Store sizes, in versions.
    #[arg(long, value_delimiter = ',', default_value = "10,20,40")]
    pub counts: Vec<u32>,
    /// Size of each synthetic version, MiB.
    #[arg(long, default_value_t = 24.0)]
    pub initial_mib: f64,
    /// Expiries measured per store size (median reported; at least 1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
}

#[derive(Serialize, Clone)]
struct ExpireRow {
    versions: u32,
    store_mib: f64,
    expire_oldest_ms: f64,
    gc_incremental_ms: f64,
    full_mark_sweep_ms: f64,
}

pub fn expire_bench(a: ExpireArgs, json: bool) -> Result<()> {
    let max = *a.counts.iter().max().context("--counts is empty")?;
    std::fs::create_dir_all(&a.out)?;
    let series_dir = a.out.join("series");
    let gen = GenOptions {
        versions: max + a.repeat,
        initial_mib: a.initial_mib,
        format: GenFormat::Tar,
        ..Default::default()
    };
    let pb = progress(
        u64::from(max + a.repeat)
            + a.counts
                .iter()
                .map(|c| u64::from(c + a.repeat))
                .sum::<u64>(),
        json,
    );
    pb.set_message("generating the series");
    let vs = generate(&series_dir, &gen, |_| pb.inc(1))?;
    let mut rows = Vec::new();
    for &n in &a.counts {
        pb.set_message(format!("store of {n} versions"));
        let dir = a.out.join("store");
        rows.push(measure(
            &dir,
            &vs[..(n + a.repeat) as usize],
            n,
            a.repeat,
            &pb,
        )?);
        std::fs::remove_dir_all(&dir).ok();
    }
    pb.finish_and_clear();
    std::fs::remove_dir_all(&series_dir).ok();
    write_results(&a.out, &rows, json)
}

/// A fresh store in `dir` holding `versions` (`n` plus the `repeat` that the
/// repeated expiries take away), with reverse dedup as the product runs it;
/// then `repeat` times: expire the oldest version, and gc after it; then
/// `repeat` full mark-and-sweeps. Medians of each.
fn measure(
    dir: &Path,
    versions: &[GenVersion],
    n: u32,
    repeat: u32,
    pb: &ProgressBar,
) -> Result<ExpireRow> {
    let store = fresh_store(dir, 4)?;
    reverse_dedup(&store, true)?;
    for v in versions {
        backup(
            &store,
            SERIES,
            source(&v.path)?,
            &BackupOptions {
                unit: Some(DedupUnit::Segment),
                ..Default::default()
            },
        )?;
        pb.inc(1);
    }
    let mut exp = Vec::new();
    let mut inc = Vec::new();
    for _ in 0..repeat {
        let s = store.series(SERIES)?;
        let oldest = store
            .versions(&s)?
            .first()
            .map(|v| v.number)
            .context("no versions")?;
        let t = Instant::now();
        expire(&store, SERIES, &ExpireSel::Version(oldest))?;
        exp.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        gc(&store, &GcOptions::default())?;
        inc.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut full = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        gc(
            &store,
            &GcOptions {
                full: true,
                ..Default::default()
            },
        )?;
        full.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(ExpireRow {
        versions: n,
        store_mib: store.totals()?.container_bytes as f64 / MIB as f64,
        expire_oldest_ms: median(exp),
        gc_incremental_ms: median(inc),
        full_mark_sweep_ms: median(full),
    })
}

/// expire.csv and expire.png in `out`; a table (or, with `json`, the rows)
/// on stdout.
fn write_results(out: &Path, rows: &[ExpireRow], json: bool) -> Result<()> {
    write_csv(&out.join("expire.csv"), rows)?;
    plot::register_font()?;
    let series = vec![
        (
            "expire oldest".to_string(),
            rows.iter()
                .map(|r| (f64::from(r.versions), r.expire_oldest_ms))
                .collect(),
        ),
        (
            "gc after it".to_string(),
            rows.iter()
                .map(|r| (f64::from(r.versions), r.gc_incremental_ms))
                .collect(),
        ),
        (
            "full mark-and-sweep".to_string(),
            rows.iter()
                .map(|r| (f64::from(r.versions), r.full_mark_sweep_ms))
                .collect(),
        ),
    ];
    plot::lines_chart(
        &out.join("expire.png"),
        "deleting the oldest version as the store grows",
        "versions stored",
        "milliseconds",
        &series,
    )?;
    if json {
        print_json(&rows);
    } else {
        println!(
            "| versions | store MiB | expire oldest ms | gc after it ms | full mark-and-sweep ms |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for r in rows {
            println!(
                "| {} | {:.0} | {:.1} | {:.1} | {:.1} |",
                r.versions,
                r.store_mib,
                r.expire_oldest_ms,
                r.gc_incremental_ms,
                r.full_mark_sweep_ms
            );
        }
    }
    Ok(())
}
