//! `revault-bench schemes`: every (dedup unit × rewrite policy) into a fresh
//! store, every version restored with every cache; knob sweeps of each policy
//! (dedup ratio against speed factor of the latest version, like Fig. 6 of the
//! LBW paper); container reads per cache against memory. CSV, a markdown
//! report (src/report.rs) and PNG plots (src/plot.rs).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use indicatif::ProgressBar;
use serde::Serialize;

use revault_engine::{
    backup, restore, BackupOptions, BackupReport, CachePolicy, DedupUnit, RestoreOptions,
    RestoreReport, RestoreTarget, RewriteSettings, Store, VersionSel, MIB,
};

use crate::harness::{
    fresh_store, inputs, mib_s, progress, reverse_dedup, source, write_csv, SERIES,
};
use crate::report::report;
use crate::{plot, print_json};

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
) -> Result<(Store, Vec<BackupReport>)> {
    let (unit, reverse) = unit_of(&s.unit)?;
    let store = fresh_store(dir, container_mib)?;
    reverse_dedup(&store, reverse)?;
    let mut reps = Vec::new();
    for v in versions {
        let opts = BackupOptions {
            unit: Some(unit),
            rewrite: Some(s.rewrite.clone()),
            ..Default::default()
        };
        reps.push(backup(&store, SERIES, source(v)?, &opts)?);
        pb.inc(1);
    }
    Ok((store, reps))
}

fn restore_once(
    store: &Store,
    version: u32,
    cache: CachePolicy,
    mib: u64,
) -> Result<RestoreReport> {
    let opts = RestoreOptions {
        cache,
        cache_bytes: mib * MIB,
        ..Default::default()
    };
    let mut sink = std::io::sink();
    Ok(restore(
        store,
        SERIES,
        VersionSel::Number(version),
        &opts,
        RestoreTarget::Writer(&mut sink),
    )?)
}

#[derive(Serialize, Clone)]
pub struct SchemeRow {
    pub unit: String,
    pub policy: String,
    pub version: u32,
    pub cache: String,
    pub logical_bytes: u64,
    pub container_reads: u64,
    pub speed_factor: f64,
    pub read_amplification: f64,
    pub restore_mib_s: f64,
    pub backup_mib_s: f64,
    pub rewritten_bytes: u64,
}

#[derive(Serialize, Clone)]
pub struct StoreRow {
    pub scheme: String,
    pub dedup_ratio: f64,
    pub dedup_ratio_compressed: f64,
    pub stored_mib: f64,
    pub on_disk_mib: f64,
    pub avg_container_mib: f64,
    /// Latest version, FAA (the papers' restore engine).
    pub latest_speed_factor: f64,
    /// Latest version, the default cache (auto: faa or opt).
    pub latest_speed_factor_default: f64,
}

#[derive(Serialize, Clone)]
pub struct KnobRow {
    pub unit: String,
    pub policy: String,
    pub knob: String,
    pub value: f64,
    pub dedup_ratio: f64,
    /// Latest version, FAA (the papers' restore engine).
    pub latest_speed_factor: f64,
}

#[derive(Serialize, Clone)]
pub struct MemoryRow {
    pub scheme: String,
    pub cache: String,
    pub memory_mib: u64,
    pub container_reads: u64,
    pub speed_factor: f64,
    pub peak_cache_mib: f64,
}

/// One setting of a policy's knob: (knob name, value, the settings).
type Knob = (String, f64, RewriteSettings);

/// The dedup-ratio loss at which the LBW paper compares policies (§6).
pub const SAME_LOSS: f64 = 0.07;

/// Per unit/policy: the speed factor at `SAME_LOSS` dedup loss, interpolated
/// between the two sweep points around it (none if the sweep never gets
/// there), with those points.
pub fn at_same_loss(knobs: &[KnobRow], stores: &[StoreRow]) -> Vec<(String, Option<f64>, String)> {
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
pub const PAPERS_CACHE: CachePolicy = CachePolicy::Faa;

/// Each policy's knob and the values a sweep walks through.
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

/// What a run measures, from its arguments: the schemes, the knob sweeps and
/// the dedup units they run on, and which scheme's store the cache memory
/// comparison uses.
struct Plan {
    schemes: Vec<Scheme>,
    sweeps: Vec<(String, Vec<Knob>)>,
    sweep_units: Vec<&'static str>,
    memory_scheme: usize,
}

impl Plan {
    fn new(a: &SchemesArgs) -> Result<Plan> {
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
        let sweeps: Vec<(String, Vec<Knob>)> = if a.no_sweep {
            Vec::new()
        } else {
            a.policies
                .iter()
                .map(|p| (p.clone(), knob_values(p)))
                .filter(|(_, k)| !k.is_empty())
                .collect()
        };
        let sweep_units: Vec<&'static str> = ["chunk", "segment-rev"]
            .into_iter()
            .filter(|u| a.units.iter().any(|x| x == u))
            .collect();
        // The most fragmented store (chunk dedup, no rewriting) is kept for the
        // memory comparison.
        let memory_scheme = schemes
            .iter()
            .position(|s| s.unit == "chunk" && s.rewrite == RewriteSettings::None)
            .unwrap_or(0);
        Ok(Plan {
            schemes,
            sweeps,
            sweep_units,
            memory_scheme,
        })
    }

    /// Backups and restores in all, for the progress bar.
    fn steps(&self, a: &SchemesArgs, versions: usize) -> u64 {
        let n = versions as u64;
        self.schemes.len() as u64 * (n + n * CachePolicy::ALL.len() as u64)
            + self.sweeps.iter().map(|(_, k)| k.len() as u64).sum::<u64>()
                * self.sweep_units.len() as u64
                * (n + 1)
            + (CachePolicy::ALL.len() * a.memory.len()) as u64
    }
}

/// Everything a run measured, as the CSV files hold it.
#[derive(Default)]
struct Results {
    rows: Vec<SchemeRow>,
    stores: Vec<StoreRow>,
    knobs: Vec<KnobRow>,
    memory: Vec<MemoryRow>,
}

pub fn schemes(a: SchemesArgs, json: bool) -> Result<()> {
    let versions = inputs(&a.series_dir, a.versions)?;
    let plan = Plan::new(&a)?;
    std::fs::create_dir_all(&a.out)?;
    let stores_dir = a.out.join("stores");
    let pb = progress(plan.steps(&a, versions.len()), json);
    let mut results = Results::default();
    for (si, s) in plan.schemes.iter().enumerate() {
        pb.set_message(format!("scheme {}", s.label));
        let dir = stores_dir.join(s.label.replace('/', "-"));
        measure_scheme(
            &a,
            s,
            si == plan.memory_scheme,
            &dir,
            &versions,
            &pb,
            &mut results,
        )?;
        std::fs::remove_dir_all(&dir).ok();
    }
    results.knobs = sweep_knobs(&a, &plan, &stores_dir.join("sweep"), &versions, &pb)?;
    pb.finish_and_clear();
    std::fs::remove_dir_all(&stores_dir).ok();
    write_results(&a, &versions, &results, json)
}

/// One scheme: the whole series backed up into a fresh store in `dir`, every
/// version restored with every cache; with `memory`, the latest version also
/// restored with every cache at every memory size.
fn measure_scheme(
    a: &SchemesArgs,
    s: &Scheme,
    memory: bool,
    dir: &Path,
    versions: &[PathBuf],
    pb: &ProgressBar,
    results: &mut Results,
) -> Result<()> {
    let (store, reps) = build(dir, a.container_mib, s, versions, pb)?;
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
            results.rows.push(SchemeRow {
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
    results.stores.push(StoreRow {
        scheme: s.label.clone(),
        dedup_ratio: t.logical_bytes as f64 / t.unit_vbytes.max(1) as f64,
        dedup_ratio_compressed: t.logical_bytes as f64 / t.container_bytes.max(1) as f64,
        stored_mib: t.unit_vbytes as f64 / MIB as f64,
        on_disk_mib: t.container_bytes as f64 / MIB as f64,
        avg_container_mib: t.container_vbytes as f64 / t.containers.max(1) as f64 / MIB as f64,
        latest_speed_factor: latest_sf,
        latest_speed_factor_default: latest_sf_default,
    });
    if memory {
        pb.set_message("cache memory sweep");
        let latest = reps.last().expect("versions").version;
        for cache in CachePolicy::ALL {
            for &m in &a.memory {
                let r = restore_once(&store, latest, cache, m);
                // A cache smaller than a container cannot run; record nothing.
                if let Ok(r) = r {
                    results.memory.push(MemoryRow {
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
    Ok(())
}

/// The knob sweeps: for each unit and policy, the series backed up at every
/// knob value into a fresh store in `dir`, and the latest version restored
/// with the papers' cache.
fn sweep_knobs(
    a: &SchemesArgs,
    plan: &Plan,
    dir: &Path,
    versions: &[PathBuf],
    pb: &ProgressBar,
) -> Result<Vec<KnobRow>> {
    let mut knob_rows = Vec::new();
    for unit in &plan.sweep_units {
        for (policy, knobs) in &plan.sweeps {
            for (knob, value, settings) in knobs {
                pb.set_message(format!("sweep {unit}/{policy} {value}"));
                let s = Scheme {
                    unit: unit.to_string(),
                    rewrite: settings.clone(),
                    label: format!("{unit}/{policy}"),
                };
                let (store, reps) = build(dir, a.container_mib, &s, versions, pb)?;
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
                std::fs::remove_dir_all(dir).ok();
            }
        }
    }
    Ok(knob_rows)
}

/// The CSV files, the markdown report and the plots; the report (or, with
/// `json`, the store, knob and memory rows) on stdout.
fn write_results(a: &SchemesArgs, versions: &[PathBuf], r: &Results, json: bool) -> Result<()> {
    write_csv(&a.out.join("schemes.csv"), &r.rows)?;
    write_csv(&a.out.join("stores.csv"), &r.stores)?;
    write_csv(&a.out.join("knobs.csv"), &r.knobs)?;
    write_csv(&a.out.join("memory.csv"), &r.memory)?;
    let report = report(a, versions, &r.rows, &r.stores, &r.knobs, &r.memory);
    std::fs::write(a.out.join("report.md"), &report)?;
    plot::register_font()?;
    plot::plot_per_version(
        &a.out.join("speed_factor_per_version.png"),
        &r.rows,
        "speed factor (MiB per container read)",
        |r| r.speed_factor,
    )?;
    plot::plot_per_version(
        &a.out.join("restore_per_version.png"),
        &r.rows,
        "restore MiB/s (FAA)",
        |r| r.restore_mib_s,
    )?;
    plot::plot_tradeoff(&a.out.join("tradeoff.png"), &r.knobs, &r.stores)?;
    plot::plot_memory(&a.out.join("memory.png"), &r.memory)?;
    if json {
        print_json(
            &serde_json::json!({ "stores": r.stores, "knobs": r.knobs, "memory": r.memory }),
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
