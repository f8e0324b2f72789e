//! The markdown report of `revault-bench schemes` (report.md, and stdout
//! without `--json`).

use std::fmt::Write as _;
use std::path::PathBuf;

use revault_engine::{CachePolicy, MIB};

use crate::schemes::{
    at_same_loss, KnobRow, MemoryRow, SchemeRow, SchemesArgs, StoreRow, PAPERS_CACHE, SAME_LOSS,
};

/// The series and settings, the per-scheme table, container reads per cache,
/// and (when measured) the knob sweeps and the cache memory comparison.
pub fn report(
    a: &SchemesArgs,
    versions: &[PathBuf],
    rows: &[SchemeRow],
    stores: &[StoreRow],
    knobs: &[KnobRow],
    memory: &[MemoryRow],
) -> String {
    let mut s = String::new();
    let logical: u64 = rows
        .iter()
        .filter(|r| r.cache == PAPERS_CACHE.name())
        .take(versions.len())
        .map(|r| r.logical_bytes)
        .sum();
    let _ = writeln!(
        s,
        "Series: {} ({} versions, {:.0} MiB logical); {} MiB containers; restore memory {} MiB.\n",
        a.series_dir.display(),
        versions.len(),
        logical as f64 / MIB as f64,
        a.container_mib,
        a.cache_mib
    );
    let _ = writeln!(s, "| scheme | dedup | with compression | stored MiB | avg container MiB | latest speed factor (FAA) | latest speed factor (auto, default) |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for r in stores {
        let _ = writeln!(
            s,
            "| {} | {:.2}x | {:.2}x | {:.1} | {:.2} | {:.2} | {:.2} |",
            r.scheme,
            r.dedup_ratio,
            r.dedup_ratio_compressed,
            r.stored_mib,
            r.avg_container_mib,
            r.latest_speed_factor,
            r.latest_speed_factor_default
        );
    }
    let latest = rows.iter().map(|r| r.version).max().unwrap_or(0);
    let _ = writeln!(
        s,
        "\nLatest version, container reads by cache ({} MiB):\n",
        a.cache_mib
    );
    let caches: Vec<&str> = CachePolicy::ALL.iter().map(|c| c.name()).collect();
    let _ = writeln!(s, "| scheme | {} |", caches.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(caches.len()));
    for st in stores {
        let cells: Vec<String> = caches
            .iter()
            .map(|c| {
                rows.iter()
                    .find(|r| {
                        format!("{}/{}", r.unit, r.policy) == st.scheme
                            && r.version == latest
                            && r.cache == *c
                    })
                    .map(|r| format!("{} ({:.2})", r.container_reads, r.speed_factor))
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        let _ = writeln!(s, "| {} | {} |", st.scheme, cells.join(" | "));
    }
    if !knobs.is_empty() {
        let _ = writeln!(
            s,
            "\nAt the same dedup-ratio loss ({:.0}% below the unit's no-rewrite dedup, interpolated \
             along each knob sweep; FAA {} MiB):\n",
            SAME_LOSS * 100.0,
            a.cache_mib
        );
        let _ = writeln!(
            s,
            "| unit/policy | latest speed factor | measured points around it |"
        );
        let _ = writeln!(s, "|---|---:|---|");
        for (key, sf, note) in at_same_loss(knobs, stores) {
            let sf = sf.map_or("not reached".to_string(), |v| format!("{v:.2}"));
            let _ = writeln!(s, "| {key} | {sf} | {note} |");
        }
        let _ = writeln!(
            s,
            "\nKnob sweeps (dedup ratio → latest speed factor, FAA {} MiB):\n",
            a.cache_mib
        );
        let _ = writeln!(s, "| unit/policy | knob | value | dedup | speed factor |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|");
        for k in knobs {
            let _ = writeln!(
                s,
                "| {}/{} | {} | {} | {:.2}x | {:.2} |",
                k.unit, k.policy, k.knob, k.value, k.dedup_ratio, k.latest_speed_factor
            );
        }
    }
    if !memory.is_empty() {
        let _ = writeln!(
            s,
            "\nContainer reads of the latest version against restore memory ({}):\n",
            memory[0].scheme
        );
        let mems = &a.memory;
        let _ = writeln!(
            s,
            "| cache | {} |",
            mems.iter()
                .map(|m| format!("{m} MiB"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "---:|".repeat(mems.len()));
        for c in &caches {
            let cells: Vec<String> = mems
                .iter()
                .map(|m| {
                    memory
                        .iter()
                        .find(|r| r.cache == *c && r.memory_mib == *m)
                        .map(|r| r.container_reads.to_string())
                        .unwrap_or_else(|| "-".into())
                })
                .collect();
            let _ = writeln!(s, "| {} | {} |", c, cells.join(" | "));
        }
    }
    s
}
