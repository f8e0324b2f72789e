//! The plots of `revault-bench index` reports (one line per report: segment and chunk
//! mode), for docs/benchmarks.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::plot::{lines_chart, register_font};

/// A report's unit and its points as (logical TiB, value) for each plotted field.
fn read(path: &Path, field: &str, scale: f64) -> Result<(String, Vec<(f64, f64)>)> {
    let r: Value = serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a bench index report", path.display()))?;
    let unit = r["unit"].as_str().unwrap_or("?").to_string();
    let pts = r["points"]
        .as_array()
        .with_context(|| format!("{}: no points", path.display()))?
        .iter()
        .map(|p| {
            (
                p["logical_tib"].as_f64().unwrap_or(0.0),
                p[field].as_f64().unwrap_or(0.0) * scale,
            )
        })
        .collect();
    Ok((format!("{unit} mode"), pts))
}

/// Plots every report (`*.json`) in `dir` into `dir/index-*.png`, one line per report.
pub fn plot_dir(dir: &Path) -> Result<()> {
    register_font()?;
    let mut reports: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    reports.sort();
    let plots = [
        (
            "index-lookups.png",
            "Lookups as the store grows",
            "fingerprints_per_sec",
            1e-6,
            "million fingerprints / s",
        ),
        (
            "index-ram.png",
            "Index memory",
            "index_ram_bytes",
            1.0 / (1u64 << 20) as f64,
            "MiB",
        ),
        (
            "index-dedup.png",
            "Duplicates found, relative to an exact index",
            "dedup_vs_exact",
            100.0,
            "%",
        ),
    ];
    for (file, caption, field, scale, ylabel) in plots {
        let series = reports
            .iter()
            .map(|p| read(p, field, scale))
            .collect::<Result<Vec<_>>>()?;
        lines_chart(
            &dir.join(file),
            caption,
            "logical TiB backed up",
            ylabel,
            &series,
        )?;
    }
    Ok(())
}
