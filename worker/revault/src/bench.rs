//! `revault bench`: the measurements behind docs/benchmarks.md and
//! docs/performance.md, run on a user's own series.
//!
//! - `schemes`: every (dedup unit × rewrite policy) into a fresh store, every
//!   version restored with every cache; knob sweeps of each policy (dedup ratio
//!   against speed factor of the latest version, like Fig. 6 of the LBW
//!   paper); container reads per cache against memory. CSV, a markdown report
//!   and PNG plots.
//! - `expire`: the cost of expiring the oldest version as the store grows
//!   (10, 20, 40 versions), beside a full mark-and-sweep of the same store.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use serde::Serialize;

use revault_engine::backup::{backup, BackupOptions};
use revault_engine::caches::CachePolicy;
use revault_engine::config::RewriteSettings;
use revault_engine::config::{DedupUnit, StoreConfig, MIB};
use revault_engine::expire::{expire, ExpireSel};
use revault_engine::format::records::Retention;
use revault_engine::gc::{gc, GcOptions};
use revault_engine::gen::{generate, GenFormat, GenOptions};
use revault_engine::restore::{restore, RestoreOptions, RestoreTarget};
use revault_engine::retention::set_retention;
use revault_engine::source::{Source, StreamSource};
use revault_engine::store::{InitOptions, OpenMode, Store, VersionSel};
use revault_engine::tree::TreeSource;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Every dedup unit x rewrite policy x restore cache on a series.
    Schemes(SchemesArgs),
    /// Expiry cost as the store grows, beside a full mark-and-sweep.
    Expire(ExpireArgs),
}

#[derive(Args)]
pub struct SchemesArgs {
    /// A directory of versions (files or directories), in name order.
    #[arg(long)]
    pub series_dir: PathBuf,
    /// Where CSV, the markdown report and PNG plots go.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 4)]
    pub container_mib: u64,
    /// Restore memory for the per-scheme comparisons.
    #[arg(long, default_value_t = 32)]
    pub cache_mib: u64,
    /// Units: segment, chunk, and segment-rev (segment with reverse dedup, live window 1).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "segment,chunk,segment-rev"
    )]
    pub units: Vec<String>,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,capping,cbr,fcrc,lbw"
    )]
    pub policies: Vec<String>,
    /// Restore memory sizes for the cache comparison, MiB.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128")]
    pub memory: Vec<u64>,
    /// Skip the knob sweeps (dedup ratio against speed factor).
    #[arg(long)]
    pub no_sweep: bool,
    /// Use only the first N versions.
    #[arg(long)]
    pub versions: Option<usize>,
}

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
    /// Expiries measured per store size (median reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
}

pub fn run(cmd: BenchCmd, json: bool) -> Result<()> {
    match cmd {
        BenchCmd::Schemes(a) => schemes(a, json),
        BenchCmd::Expire(a) => expire_bench(a, json),
    }
}

fn inputs(dir: &Path, limit: Option<usize>) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    v.sort();
    if let Some(n) = limit {
        v.truncate(n);
    }
    if v.len() < 2 {
        bail!(
            "{} holds {} versions; a series needs at least two",
            dir.display(),
            v.len()
        );
    }
    Ok(v)
}

fn source(p: &Path) -> Result<Box<dyn Source>> {
    if p.is_dir() {
        Ok(Box::new(TreeSource::new(p)?))
    } else {
        let f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
        Ok(Box::new(StreamSource::new(p.display().to_string(), f)))
    }
}

fn fresh_store(dir: &Path, container_mib: u64) -> Result<Store> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let config = StoreConfig {
        container_bytes: container_mib * MIB,
        ..Default::default()
    };
    Store::init(
        dir,
        &InitOptions {
            config,
            data_dir: None,
        },
    )?;
    Ok(Store::open(dir, OpenMode::ReadWrite, "revault bench")?)
}

/// A scheme: a dedup unit (with or without reverse dedup) and a policy.
#[derive(Clone)]
struct Scheme {
    unit: String,
    rewrite: RewriteSettings,
    label: String,
}

fn unit_of(name: &str) -> Result<(DedupUnit, bool)> {
    Ok(match name {
        "segment" => (DedupUnit::Segment, false),
        "chunk" => (DedupUnit::Chunk, false),
        "segment-rev" => (DedupUnit::Segment, true),
        other => bail!("unit {other:?}: expected segment, chunk or segment-rev"),
    })
}

/// Backs up every version into a fresh store; returns per-version backup
/// reports and the store's dedup ratios.
fn build(
    dir: &Path,
    container_mib: u64,
    s: &Scheme,
    versions: &[PathBuf],
    pb: &ProgressBar,
) -> Result<(Store, Vec<revault_engine::backup::BackupReport>)> {
    let (unit, reverse) = unit_of(&s.unit)?;
    let store = fresh_store(dir, container_mib)?;
    if reverse {
        set_retention(
            &store,
            "bench/s",
            Retention {
                live: 1,
                auto: true,
                ..Default::default()
            },
        )?;
    }
    let mut reps = Vec::new();
    for v in versions {
        let opts = BackupOptions {
            unit: Some(unit),
            rewrite: Some(s.rewrite.clone()),
            ..Default::default()
        };
        reps.push(backup(&store, "bench/s", source(v)?, &opts)?);
        pb.inc(1);
    }
    Ok((store, reps))
}

fn restore_once(
    store: &Store,
    version: u32,
    cache: CachePolicy,
    mib: u64,
) -> Result<revault_engine::restore::RestoreReport> {
    let opts = RestoreOptions {
        cache,
        cache_bytes: mib * MIB,
        ..Default::default()
    };
    let mut sink = std::io::sink();
    Ok(restore(
        store,
        "bench/s",
        VersionSel::Number(version),
        &opts,
        RestoreTarget::Writer(&mut sink),
    )?)
}

#[derive(Serialize, Clone)]
struct SchemeRow {
    unit: String,
    policy: String,
    version: u32,
    cache: String,
    logical_bytes: u64,
    container_reads: u64,
    speed_factor: f64,
    read_amplification: f64,
    restore_mib_s: f64,
    backup_mib_s: f64,
    rewritten_bytes: u64,
}

#[derive(Serialize, Clone)]
struct StoreRow {
    scheme: String,
    dedup_ratio: f64,
    dedup_ratio_compressed: f64,
    stored_mib: f64,
    on_disk_mib: f64,
    avg_container_mib: f64,
    /// Latest version, FAA (the papers' restore engine).
    latest_speed_factor: f64,
    /// Latest version, the default cache (auto: faa or opt).
    latest_speed_factor_default: f64,
}

#[derive(Serialize, Clone)]
struct KnobRow {
    unit: String,
    policy: String,
    knob: String,
    value: f64,
    dedup_ratio: f64,
    /// Latest version, FAA (the papers' restore engine).
    latest_speed_factor: f64,
}

#[derive(Serialize, Clone)]
struct MemoryRow {
    scheme: String,
    cache: String,
    memory_mib: u64,
    container_reads: u64,
    speed_factor: f64,
    peak_cache_mib: f64,
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / MIB as f64 / secs
    } else {
        0.0
    }
}

/// Each policy's knob and the values a sweep walks through.
/// One setting of a policy's knob: (knob name, value, the settings).
type Knob = (String, f64, RewriteSettings);

/// The dedup-ratio loss at which the LBW paper compares policies (§6).
const SAME_LOSS: f64 = 0.07;

/// Per unit/policy: the speed factor at `SAME_LOSS` dedup loss, interpolated
/// between the two sweep points around it (none if the sweep never gets
/// there), with those points.
fn at_same_loss(knobs: &[KnobRow], stores: &[StoreRow]) -> Vec<(String, Option<f64>, String)> {
    let mut keys: Vec<(String, String)> = knobs
        .iter()
        .map(|k| (k.unit.clone(), k.policy.clone()))
        .collect();
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    let mut out = Vec::new();
    for (unit, policy) in keys {
        let Some(base) = stores
            .iter()
            .find(|r| r.scheme == format!("{unit}/none"))
            .map(|r| r.dedup_ratio)
        else {
            continue;
        };
        let mut pts: Vec<(f64, f64)> = knobs
            .iter()
            .filter(|k| k.unit == unit && k.policy == policy)
            .map(|k| (1.0 - k.dedup_ratio / base, k.latest_speed_factor))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let below = pts.iter().rev().find(|p| p.0 <= SAME_LOSS).copied();
        let above = pts.iter().find(|p| p.0 >= SAME_LOSS).copied();
        let sf = match (below, above) {
            (Some(b), Some(a)) if a.0 > b.0 => {
                Some(b.1 + (a.1 - b.1) * (SAME_LOSS - b.0) / (a.0 - b.0))
            }
            (Some(b), Some(_)) => Some(b.1),
            _ => None,
        };
        let note = [below, above]
            .iter()
            .flatten()
            .map(|p| format!("{:.1}% loss: {:.2}", p.0 * 100.0, p.1))
            .collect::<Vec<_>>()
            .join(", ");
        out.push((format!("{unit}/{policy}"), sf, note));
    }
    out
}

/// The restore cache of the rewrite papers' comparisons (Cao et al. FAST '19
/// restore with a forward assembly area): knob sweeps, per-version plots.
const PAPERS_CACHE: CachePolicy = CachePolicy::Faa;

fn knob_values(policy: &str) -> Vec<Knob> {
    match policy {
        "capping" => [1u32, 2, 4, 6, 8, 12, 16, 32]
            .iter()
            .map(|&t| {
                (
                    "capping level".into(),
                    f64::from(t),
                    RewriteSettings::Capping {
                        segment: 5,
                        level: t,
                    },
                )
            })
            .collect(),
        "cbr" => [0.002, 0.005, 0.01, 0.02, 0.05, 0.1]
            .iter()
            .map(|&l| {
                let s = RewriteSettings::Cbr {
                    stream_context_mib: 5.0,
                    disk_context_mib: 2.0,
                    min_utility: 0.7,
                    limit: l,
                };
                ("rewrite limit".into(), l, s)
            })
            .collect(),
        // The loss budget is per version, against the previous version's
        // unique chunks: on a low-churn series the total loss is far smaller,
        // so the sweep goes high enough to reach the papers' 7% overall.
        "fcrc" => [0.03, 0.07, 0.2, 0.4, 0.6, 0.8, 0.9]
            .iter()
            .map(|&x| {
                (
                    "dedup loss".into(),
                    x,
                    RewriteSettings::Fcrc {
                        segment: 5,
                        loss: x,
                        cap: 4,
                    },
                )
            })
            .collect(),
        "lbw" => [0.03, 0.07, 0.2, 0.4, 0.6, 0.8, 0.9]
            .iter()
            .map(|&x| {
                (
                    "dedup loss".into(),
                    x,
                    RewriteSettings::Lbw {
                        window: 8,
                        loss: x,
                        cap: 4,
                    },
                )
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn progress(total: u64, json: bool) -> ProgressBar {
    let pb = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    pb.set_style(
        ProgressStyle::with_template("{msg:30} [{bar:30}] {pos}/{len} {elapsed_precise} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

fn schemes(a: SchemesArgs, json: bool) -> Result<()> {
    let versions = inputs(&a.series_dir, a.versions)?;
    std::fs::create_dir_all(&a.out)?;
    let stores_dir = a.out.join("stores");
    let mut schemes = Vec::new();
    for u in &a.units {
        unit_of(u)?;
        for p in &a.policies {
            let rewrite = RewriteSettings::default_for(p)?;
            schemes.push(Scheme {
                unit: u.clone(),
                rewrite,
                label: format!("{u}/{p}"),
            });
        }
    }
    let n = versions.len() as u64;
    let sweeps: Vec<(String, Vec<Knob>)> = if a.no_sweep {
        Vec::new()
    } else {
        a.policies
            .iter()
            .map(|p| (p.clone(), knob_values(p)))
            .filter(|(_, k)| !k.is_empty())
            .collect()
    };
    let sweep_units: Vec<&str> = ["chunk", "segment-rev"]
        .into_iter()
        .filter(|u| a.units.iter().any(|x| x == u))
        .collect();
    let total = schemes.len() as u64 * (n + n * CachePolicy::ALL.len() as u64)
        + sweeps.iter().map(|(_, k)| k.len() as u64).sum::<u64>()
            * sweep_units.len() as u64
            * (n + 1)
        + (CachePolicy::ALL.len() * a.memory.len()) as u64;
    let pb = progress(total, json);

    let mut rows: Vec<SchemeRow> = Vec::new();
    let mut store_rows: Vec<StoreRow> = Vec::new();
    let mut memory_rows: Vec<MemoryRow> = Vec::new();
    // The most fragmented store (chunk dedup, no rewriting) is kept for the
    // memory comparison.
    let memory_scheme = schemes
        .iter()
        .position(|s| s.unit == "chunk" && s.rewrite == RewriteSettings::None)
        .unwrap_or(0);
    for (si, s) in schemes.iter().enumerate() {
        pb.set_message(format!("scheme {}", s.label));
        let dir = stores_dir.join(s.label.replace('/', "-"));
        let (store, reps) = build(&dir, a.container_mib, s, &versions, &pb)?;
        let t = store.totals()?;
        let mut latest_sf = 0.0;
        // The default cache (auto: faa or opt, chosen per restore) on the
        // latest version.
        let latest_sf_default = match reps.last() {
            Some(b) => restore_once(&store, b.version, CachePolicy::default(), a.cache_mib)?
                .speed_factor
                .unwrap_or(0.0),
            None => 0.0,
        };
        for (i, b) in reps.iter().enumerate() {
            for cache in CachePolicy::ALL {
                let r = restore_once(&store, b.version, cache, a.cache_mib)?;
                if i + 1 == reps.len() && cache == PAPERS_CACHE {
                    latest_sf = r.speed_factor.unwrap_or(0.0);
                }
                rows.push(SchemeRow {
                    unit: s.unit.clone(),
                    policy: s.rewrite.name().into(),
                    version: b.version,
                    cache: cache.name().into(),
                    logical_bytes: r.logical_bytes,
                    container_reads: r.container_reads,
                    speed_factor: r.speed_factor.unwrap_or(0.0),
                    read_amplification: r.read_amplification,
                    restore_mib_s: mib_s(r.logical_bytes, r.seconds),
                    backup_mib_s: mib_s(b.logical_bytes, b.seconds),
                    rewritten_bytes: b.rewritten_bytes,
                });
                pb.inc(1);
            }
        }
        store_rows.push(StoreRow {
            scheme: s.label.clone(),
            dedup_ratio: t.logical_bytes as f64 / t.unit_vbytes.max(1) as f64,
            dedup_ratio_compressed: t.logical_bytes as f64 / t.container_bytes.max(1) as f64,
            stored_mib: t.unit_vbytes as f64 / MIB as f64,
            on_disk_mib: t.container_bytes as f64 / MIB as f64,
            avg_container_mib: t.container_vbytes as f64 / t.containers.max(1) as f64 / MIB as f64,
            latest_speed_factor: latest_sf,
            latest_speed_factor_default: latest_sf_default,
        });
        if si == memory_scheme {
            pb.set_message("cache memory sweep");
            let latest = reps.last().expect("versions").version;
            for cache in CachePolicy::ALL {
                for &m in &a.memory {
                    let r = restore_once(&store, latest, cache, m);
                    // A cache smaller than a container cannot run; record nothing.
                    if let Ok(r) = r {
                        memory_rows.push(MemoryRow {
                            scheme: s.label.clone(),
                            cache: cache.name().into(),
                            memory_mib: m,
                            container_reads: r.container_reads,
                            speed_factor: r.speed_factor.unwrap_or(0.0),
                            peak_cache_mib: r.peak_cache_bytes as f64 / MIB as f64,
                        });
                    }
                    pb.inc(1);
                }
            }
        }
        drop(store);
        std::fs::remove_dir_all(&dir).ok();
    }

    let mut knob_rows: Vec<KnobRow> = Vec::new();
    for unit in &sweep_units {
        for (policy, knobs) in &sweeps {
            for (knob, value, settings) in knobs {
                pb.set_message(format!("sweep {unit}/{policy} {value}"));
                let s = Scheme {
                    unit: unit.to_string(),
                    rewrite: settings.clone(),
                    label: format!("{unit}/{policy}"),
                };
                let dir = stores_dir.join("sweep");
                let (store, reps) = build(&dir, a.container_mib, &s, &versions, &pb)?;
                let t = store.totals()?;
                let r = restore_once(
                    &store,
                    reps.last().expect("versions").version,
                    PAPERS_CACHE,
                    a.cache_mib,
                )?;
                pb.inc(1);
                knob_rows.push(KnobRow {
                    unit: unit.to_string(),
                    policy: policy.clone(),
                    knob: knob.clone(),
                    value: *value,
                    dedup_ratio: t.logical_bytes as f64 / t.unit_vbytes.max(1) as f64,
                    latest_speed_factor: r.speed_factor.unwrap_or(0.0),
                });
                drop(store);
                std::fs::remove_dir_all(&dir).ok();
            }
        }
    }
    pb.finish_and_clear();
    std::fs::remove_dir_all(&stores_dir).ok();

    write_csv(&a.out.join("schemes.csv"), &rows)?;
    write_csv(&a.out.join("stores.csv"), &store_rows)?;
    write_csv(&a.out.join("knobs.csv"), &knob_rows)?;
    write_csv(&a.out.join("memory.csv"), &memory_rows)?;
    let report = report(&a, &versions, &rows, &store_rows, &knob_rows, &memory_rows);
    std::fs::write(a.out.join("report.md"), &report)?;
    register_font()?;
    plot_per_version(
        &a.out.join("speed_factor_per_version.png"),
        &rows,
        "speed factor (MiB per container read)",
        |r| r.speed_factor,
    )?;
    plot_per_version(
        &a.out.join("restore_per_version.png"),
        &rows,
        "restore MiB/s (FAA)",
        |r| r.restore_mib_s,
    )?;
    plot_tradeoff(&a.out.join("tradeoff.png"), &knob_rows, &store_rows)?;
    plot_memory(&a.out.join("memory.png"), &memory_rows)?;
    if json {
        crate::output::json(
            &serde_json::json!({ "stores": store_rows, "knobs": knob_rows, "memory": memory_rows }),
        );
    } else {
        print!("{report}");
        println!(
            "\nwrote {}/{{schemes,stores,knobs,memory}}.csv, report.md and PNG plots",
            a.out.display()
        );
    }
    Ok(())
}

fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let mut out = String::new();
    for (i, r) in rows.iter().enumerate() {
        let v = serde_json::to_value(r)?;
        let obj = v.as_object().expect("rows are structs");
        if i == 0 {
            out.push_str(&obj.keys().cloned().collect::<Vec<_>>().join(","));
            out.push('\n');
        }
        let cells: Vec<String> = obj
            .values()
            .map(|x| match x {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n
                    .as_f64()
                    .map(|f| {
                        if f.fract() == 0.0 {
                            format!("{f:.0}")
                        } else {
                            format!("{f:.4}")
                        }
                    })
                    .unwrap_or_default(),
                other => other.to_string(),
            })
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

fn report(
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

fn register_font() -> Result<()> {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    for c in candidates {
        if let Ok(bytes) = std::fs::read(c) {
            // plotters keeps fonts for the life of the process.
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, leaked)
                .map_err(|_| anyhow::anyhow!("{c} is not a usable font"))?;
            return Ok(());
        }
    }
    bail!("no font for the plots: install fonts-dejavu-core (hack/install-tools.sh does)")
}

const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn lines_chart(
    path: &Path,
    caption: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let root = BitMapBackend::new(path, (1100, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = ys.fold(0f64, f64::max) * 1.1 + 1e-9;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1.max(x0 + 1.0), 0f64..y1)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        draw_line(&mut chart, i, name, pts)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One line with its points marked, in the `i`-th colour, named in the legend.
fn draw_line(chart: &mut Chart, i: usize, name: &str, pts: &[(f64, f64)]) -> Result<()> {
    let c = COLORS[i % COLORS.len()];
    chart
        .draw_series(LineSeries::new(pts.to_vec(), c.stroke_width(2)))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))?;
    Ok(())
}

/// One panel per dedup unit, one line per rewrite policy (FAA restores).
fn plot_per_version(
    path: &Path,
    rows: &[SchemeRow],
    ylabel: &str,
    f: impl Fn(&SchemeRow) -> f64,
) -> Result<()> {
    let mut units: Vec<String> = rows.iter().map(|r| r.unit.clone()).collect();
    let mut seen = std::collections::HashSet::new();
    units.retain(|u| seen.insert(u.clone()));
    let mut policies: Vec<String> = rows.iter().map(|r| r.policy.clone()).collect();
    let mut seen = std::collections::HashSet::new();
    policies.retain(|p| seen.insert(p.clone()));
    let dflt: Vec<&SchemeRow> = rows
        .iter()
        .filter(|r| r.cache == PAPERS_CACHE.name())
        .collect();
    let y1 = dflt.iter().map(|r| f(r)).fold(0f64, f64::max) * 1.15 + 1e-9;
    let x1 = dflt
        .iter()
        .map(|r| f64::from(r.version))
        .fold(1f64, f64::max);
    let root = BitMapBackend::new(path, (560 * units.len().max(1) as u32, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&format!("{ylabel} per version"), ("sans-serif", 24))?;
    for (panel, unit) in root
        .split_evenly((1, units.len().max(1)))
        .iter()
        .zip(&units)
    {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("unit: {unit}"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(1f64..x1.max(2.0), 0f64..y1)?;
        chart
            .configure_mesh()
            .x_desc("version")
            .y_desc(ylabel)
            .label_style(("sans-serif", 13))
            .draw()?;
        for (i, p) in policies.iter().enumerate() {
            let pts: Vec<(f64, f64)> = dflt
                .iter()
                .filter(|r| &r.unit == unit && &r.policy == p)
                .map(|r| (f64::from(r.version), f(r)))
                .collect();
            draw_line(&mut chart, i, p, &pts)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .position(SeriesLabelPosition::LowerLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn plot_tradeoff(path: &Path, knobs: &[KnobRow], stores: &[StoreRow]) -> Result<()> {
    let mut names: Vec<String> = knobs
        .iter()
        .map(|k| format!("{}/{}", k.unit, k.policy))
        .collect();
    names.sort();
    names.dedup();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = names
        .into_iter()
        .map(|n| {
            let mut pts: Vec<(f64, f64)> = knobs
                .iter()
                .filter(|k| format!("{}/{}", k.unit, k.policy) == n)
                .map(|k| (k.dedup_ratio, k.latest_speed_factor))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (n, pts)
        })
        .collect();
    for s in stores.iter().filter(|s| s.scheme.ends_with("/none")) {
        series.push((
            s.scheme.clone(),
            vec![(s.dedup_ratio, s.latest_speed_factor)],
        ));
    }
    if series.is_empty() {
        return Ok(());
    }
    lines_chart(
        path,
        "dedup ratio against speed factor of the latest version",
        "dedup ratio",
        "speed factor",
        &series,
    )
}

fn plot_memory(path: &Path, memory: &[MemoryRow]) -> Result<()> {
    let series: Vec<(String, Vec<(f64, f64)>)> = CachePolicy::ALL
        .iter()
        .map(|c| {
            let pts = memory
                .iter()
                .filter(|m| m.cache == c.name())
                .map(|m| (m.memory_mib as f64, m.container_reads as f64))
                .collect();
            (c.name().to_string(), pts)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    if series.is_empty() {
        return Ok(());
    }
    lines_chart(
        path,
        "container reads of the latest version against restore memory",
        "restore memory (MiB)",
        "container reads",
        &series,
    )
}

#[derive(Serialize, Clone)]
struct ExpireRow {
    versions: u32,
    store_mib: f64,
    expire_oldest_ms: f64,
    gc_incremental_ms: f64,
    full_mark_sweep_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn expire_bench(a: ExpireArgs, json: bool) -> Result<()> {
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
        let store = fresh_store(&dir, 4)?;
        set_retention(
            &store,
            "bench/s",
            Retention {
                live: 1,
                auto: true,
                ..Default::default()
            },
        )?;
        // n versions plus the ones the repeated expiries take away.
        for v in &vs[..(n + a.repeat) as usize] {
            backup(
                &store,
                "bench/s",
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
        for _ in 0..a.repeat {
            let s = store.series("bench/s")?;
            let oldest = store
                .versions(&s)?
                .first()
                .map(|v| v.number)
                .context("no versions")?;
            let t = Instant::now();
            expire(&store, "bench/s", &ExpireSel::Version(oldest))?;
            exp.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            gc(&store, &GcOptions::default())?;
            inc.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut full = Vec::new();
        for _ in 0..a.repeat {
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
        rows.push(ExpireRow {
            versions: n,
            store_mib: store.totals()?.container_bytes as f64 / MIB as f64,
            expire_oldest_ms: median(exp),
            gc_incremental_ms: median(inc),
            full_mark_sweep_ms: median(full),
        });
        drop(store);
        std::fs::remove_dir_all(&dir).ok();
    }
    pb.finish_and_clear();
    std::fs::remove_dir_all(&series_dir).ok();
    write_csv(&a.out.join("expire.csv"), &rows)?;
    register_font()?;
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
    lines_chart(
        &a.out.join("expire.png"),
        "deleting the oldest version as the store grows",
        "versions stored",
        "milliseconds",
        &series,
    )?;
    if json {
        crate::output::json(&rows);
    } else {
        println!(
            "| versions | store MiB | expire oldest ms | gc after it ms | full mark-and-sweep ms |"
        );
        println!("|---:|---:|---:|---:|---:|");
        for r in &rows {
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
