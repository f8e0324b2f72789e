//! `revault-bench index`: the sampled fingerprint index as a store grows, without the bytes.
//!
//! Grows a throw-away store to the logical size asked for with a synthetic fingerprint stream,
//! through the sampled index and the real commit path (`revault_engine::bench_index`), and
//! reports a point per store size: lookup speed, the index's memory and disk, and how much of
//! the exact dedup it finds. Writes `OUT/<unit>.json` and plots every report in `OUT`
//! (src/plot_index.rs), so a segment run and a chunk run into one directory share plots.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use revault_engine::{
    bench_index, DedupUnit, IndexBenchOptions, IndexBenchPoint, InitOptions, OpenMode, Store,
};

use crate::plot_index::plot_dir;

#[derive(clap::Args)]
pub struct IndexArgs {
    /// Dedup unit: segment (~1 MiB; the default mode) or chunk (~8 KiB).
    #[arg(long, default_value = "segment")]
    unit: String,
    /// Grow the store to this many TiB of backed-up (logical) data.
    #[arg(long)]
    logical_tib: f64,
    /// The index's memory budget, in MiB.
    #[arg(long, default_value_t = 256)]
    index_mib: u64,
    /// Series backed up round-robin (families of four share content).
    #[arg(long, default_value_t = 16)]
    series: u32,
    /// Store sizes reported, evenly spaced up to --logical-tib.
    #[arg(long, default_value_t = 10)]
    points: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory of the report and the plots.
    #[arg(long)]
    out: PathBuf,
    /// Where the throw-away store goes (WORK/revault-bench-index-<unit>, about 200 bytes of
    /// metadata per unit stored; removed at the end). Default: the temporary directory.
    #[arg(long)]
    work: Option<PathBuf>,
}

pub fn index(a: IndexArgs, json: bool) -> Result<()> {
    let unit: DedupUnit = a.unit.parse()?;
    if !(a.logical_tib > 0.0 && a.logical_tib.is_finite()) {
        bail!(
            "--logical-tib must be a positive number of TiB (got {})",
            a.logical_tib
        );
    }
    if a.index_mib == 0 || a.series == 0 || a.points == 0 {
        bail!("--index-mib, --series and --points must be at least 1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let dir = a
        .work
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("revault-bench-index-{unit}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Store::init(&dir, &InitOptions::default())?;
    let mut store = Store::open(&dir, OpenMode::ReadWrite, "revault-bench index")?;
    let opts = IndexBenchOptions {
        unit,
        logical_tib: a.logical_tib,
        budget_bytes: (a.index_mib << 20) as usize,
        series: a.series,
        volume_bytes: None,
        points: a.points,
        seed: a.seed,
    };
    let report = bench_index(&mut store, &opts, |p| {
        eprintln!(
            "{:.2} TiB logical: {:.0} lookups/s ({:.0}/s with commits), index {:.1} MiB in memory, dedup {:.4} of exact",
            p.logical_tib,
            p.fingerprints_per_sec,
            p.ingest_fingerprints_per_sec,
            p.index_ram_bytes as f64 / (1u64 << 20) as f64,
            p.dedup_vs_exact
        );
    })?;
    drop(store);
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(a.out.join(format!("{unit}.json")), &text)?;
    plot_dir(&a.out)?;
    if json {
        println!("{text}");
        return Ok(());
    }
    print!("{}", table(&report.points));
    println!(
        "{} units of {} KiB, {} series, index budget {} MiB, {:.0} s; plots in {}",
        report.unit,
        report.unit_bytes >> 10,
        report.series,
        report.budget_bytes >> 20,
        report.seconds,
        a.out.display()
    );
    Ok(())
}

/// The points as a Markdown table (what docs/benchmarks.md quotes).
fn table(points: &[IndexBenchPoint]) -> String {
    let mut t = String::from(
        "| logical TiB | unique TiB | lookups/s | with commits/s | index RAM MiB | index disk MiB | dedup vs exact | sampling |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for p in points {
        t += &format!(
            "| {:.2} | {:.3} | {:.0} | {:.0} | {:.1} | {:.1} | {:.4} | 1/{:.0} |\n",
            p.logical_tib,
            p.unique_tib,
            p.fingerprints_per_sec,
            p.ingest_fingerprints_per_sec,
            p.index_ram_bytes as f64 / (1u64 << 20) as f64,
            p.index_disk_bytes as f64 / (1u64 << 20) as f64,
            p.dedup_vs_exact,
            1.0 / p.sampling_rate
        );
    }
    t
}
