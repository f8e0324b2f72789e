//! Offline commands on a local store directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use revault_engine::{
    backup, restore, BackupOptions, Compression, DedupUnit, InitOptions, OpenMode, RestoreOptions,
    RestoreTarget, Source, Store, StoreConfig, StreamSource, TreeSource, VersionSel, MIB,
};

use crate::output::{self, mib, rate, ratio, Table};
use crate::remote_cli::Opened;
use crate::restore_out::{restore_to_file, Destination};
use crate::{Cli, Cmd};

#[derive(Args)]
pub struct StoreArg {
    /// Store directory.
    #[arg(long, env = "REVAULT_STORE")]
    pub store: PathBuf,
}

#[derive(Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Uncompressed data per container, MiB.
    #[arg(long, default_value_t = 4)]
    pub container_mib: u64,
    /// `zstd`, `zstd:LEVEL` (1-19) or `none`.
    #[arg(long, default_value = "zstd:3")]
    pub compression: String,
    /// Average chunk size, KiB (min = avg/4, max = avg*8).
    #[arg(long, default_value_t = 8)]
    pub chunk_kib: u32,
    /// Average segment size, KiB (min = avg/4, max = avg*4).
    #[arg(long, default_value_t = 1024)]
    pub segment_kib: u32,
    /// Keep containers in another directory (e.g. an HDD) than the metadata.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub remote: crate::remote_cli::RemoteInitArgs,
}

#[derive(Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub version: NewVersionArgs,
    #[command(flatten)]
    pub rewrite: RewriteArgs,
    /// A file, a directory, or `-` for stdin.
    pub input: String,
}

/// The series a backup adds a version to, and how: the same flags for a
/// local store (`backup`) and a worker (`push`).
#[derive(Args, Clone, Debug)]
pub struct NewVersionArgs {
    /// Series name, NAMESPACE/NAME.
    #[arg(long)]
    pub series: String,
    /// Dedup unit of a new series: `segment` (default) or `chunk`.
    #[arg(long)]
    pub unit: Option<String>,
    /// Backup time (RFC 3339), e.g. for importing old backups; default now.
    #[arg(long)]
    pub time: Option<String>,
}

impl NewVersionArgs {
    /// The unit and the time (Unix seconds), checked.
    pub fn parse(&self) -> Result<(Option<DedupUnit>, Option<i64>)> {
        let unit = self
            .unit
            .as_deref()
            .map(str::parse::<DedupUnit>)
            .transpose()?;
        let time_unix = self.time.as_deref().map(parse_time).transpose()?;
        Ok((unit, time_unix))
    }
}

/// Rewrite selection flags; a policy given here is stored with the series.
#[derive(Args, Clone)]
pub struct RewriteArgs {
    /// Rewrite policy: none, capping, cbr, fcrc or lbw (default: the series' stored policy).
    #[arg(long)]
    pub rewrite: Option<String>,
    /// capping: segment size in containers.
    #[arg(long, default_value_t = 5)]
    pub capping_segment: u32,
    /// capping: old containers a segment may read (capping level).
    #[arg(long, default_value_t = 4)]
    pub capping_level: u32,
    /// cbr: stream context, MiB.
    #[arg(long, default_value_t = 5.0)]
    pub cbr_stream_mib: f64,
    /// cbr: disk context, MiB.
    #[arg(long, default_value_t = 2.0)]
    pub cbr_disk_mib: f64,
    /// cbr: minimal rewrite utility (0..1).
    #[arg(long, default_value_t = 0.7)]
    pub cbr_min_utility: f64,
    /// cbr: rewrite limit, fraction of chunks seen.
    #[arg(long, default_value_t = 0.05)]
    pub cbr_limit: f64,
    /// fcrc: segment size in containers.
    #[arg(long, default_value_t = 5)]
    pub fcrc_segment: u32,
    /// lbw: window size in containers.
    #[arg(long, default_value_t = 8)]
    pub lbw_window: u32,
    /// fcrc and lbw: dedup-ratio loss budget, percent.
    #[arg(long, default_value_t = 7.0)]
    pub loss: f64,
    /// fcrc and lbw: old-container reads allowed per segment or window.
    #[arg(long, default_value_t = 4)]
    pub cap: u32,
}

impl RewriteArgs {
    pub fn settings(&self) -> Result<Option<revault_engine::RewriteSettings>> {
        use revault_engine::RewriteSettings as R;
        let Some(p) = self.rewrite.as_deref() else {
            return Ok(None);
        };
        let s = match p {
            "none" => R::None,
            "capping" => R::Capping {
                segment: self.capping_segment,
                level: self.capping_level,
            },
            "cbr" => R::Cbr {
                stream_context_mib: self.cbr_stream_mib,
                disk_context_mib: self.cbr_disk_mib,
                min_utility: self.cbr_min_utility,
                limit: self.cbr_limit,
            },
            "fcrc" => R::Fcrc {
                segment: self.fcrc_segment,
                loss: self.loss / 100.0,
                cap: self.cap,
            },
            "lbw" => R::Lbw {
                window: self.lbw_window,
                loss: self.loss / 100.0,
                cap: self.cap,
            },
            other => return Err(R::default_for(other).unwrap_err().into()),
        };
        s.validate()?;
        Ok(Some(s))
    }
}

#[derive(Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[arg(long)]
    pub series: String,
    /// A version number or `latest`.
    #[arg(long, default_value = "latest")]
    pub version: String,
    /// Restore memory, MiB: the forward assembly area or the cache.
    #[arg(long, default_value_t = 64)]
    pub cache_mib: u64,
    /// Restore cache: auto (default: faa or opt, whichever the recipe says
    /// reads fewer containers), faa, opt, lru-container, lru-chunk or dasm.
    #[arg(long, default_value = "auto")]
    pub cache: String,
    /// Read every chunk the version repeats from its container again instead
    /// of keeping it in memory between uses (to measure what reuse saves).
    #[arg(long)]
    pub no_reuse: bool,
    /// Output: `-` (stdout, default), a FILE, or a DIR. A directory version is
    /// extracted into a DIR that exists, ends in `/`, or is a new path not named
    /// `*.tar*`; to stdout or a `*.tar` file it is a tar stream.
    #[arg(short = 'o', long = "output", default_value = "-")]
    pub output: String,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// List this series' versions instead of all series.
    #[arg(long)]
    pub series: Option<String>,
}

#[derive(Args)]
pub struct SeriesArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[arg(long)]
    pub series: String,
}

#[derive(clap::Subcommand)]
pub enum RetentionCmd {
    /// Store the retention of a series (creating it if it has no versions yet).
    Set(RetentionSetArgs),
    /// Show a series' retention.
    Show(SeriesArgs),
}

#[derive(Args)]
pub struct RetentionSetArgs {
    #[command(flatten)]
    pub series: SeriesArgs,
    /// Keep the newest N versions.
    #[arg(long)]
    pub keep: Option<u32>,
    /// Keep versions less than this duration older than the newest one (e.g. `30d`, `12h`).
    #[arg(long)]
    pub keep_within: Option<String>,
    /// Keep the newest version of each of the last N hours that have one.
    #[arg(long)]
    pub keep_hourly: Option<u32>,
    /// Keep the newest version of each of the last N days that have one.
    #[arg(long)]
    pub keep_daily: Option<u32>,
    /// Keep the newest version of each of the last N ISO weeks (Monday to Sunday) that have one.
    #[arg(long)]
    pub keep_weekly: Option<u32>,
    /// Keep the newest version of each of the last N months that have one.
    #[arg(long)]
    pub keep_monthly: Option<u32>,
    /// Keep the newest version of each of the last N years that have one.
    #[arg(long)]
    pub keep_yearly: Option<u32>,
    /// The time zone whose days, weeks, months and years the calendar rules count (an IANA
    /// name such as `Europe/Berlin`; default UTC).
    #[arg(long)]
    pub timezone: Option<String>,
    /// Versions in the live window (inline-deduplicated, fastest to restore).
    #[arg(long, default_value_t = 1)]
    pub live: u32,
    /// Slide and apply retention automatically after every backup (`--auto`, or
    /// `--auto=false` to leave it to `revault slide` and `revault expire`). Not
    /// given: the series keeps its setting; a new series is automatic.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub auto: Option<bool>,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["version", "before", "apply_retention"])))]
pub struct ExpireArgs {
    #[command(flatten)]
    pub series: SeriesArgs,
    /// Delete this version.
    #[arg(long)]
    pub version: Option<u32>,
    /// Delete every version older than this time (RFC 3339); the newest is kept.
    #[arg(long)]
    pub before: Option<String>,
    /// Delete what the series' retention no longer keeps.
    #[arg(long)]
    pub apply_retention: bool,
}

#[derive(Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Re-mark every series and sweep every container.
    #[arg(long)]
    pub full: bool,
    /// Compact containers whose live fraction is below this.
    #[arg(long, default_value_t = 0.5)]
    pub compact_below: f64,
}

pub fn run(cli: Cli) -> Result<()> {
    let json = cli.json;
    let quiet = cli.quiet || json;
    match cli.cmd {
        Cmd::Init(a) => init(a, json),
        Cmd::Backup(a) => cmd_backup(a, json, quiet),
        Cmd::Restore(a) => cmd_restore(a, json, quiet),
        Cmd::List(a) => list(a, json),
        Cmd::Stats(a) => stats(a, json),
        Cmd::Check(a) => check(a, json),
        Cmd::Retention(c) => crate::retention_cli::run(c, json),
        Cmd::Slide(a) => slide(a, json),
        Cmd::Expire(a) => expire(a, json),
        Cmd::Gc(a) => gc(a, json),
        Cmd::Recover(a) => crate::remote_cli::recover(a, json),
        Cmd::Remote(c) => crate::remote_cli::remote(c, json),
    }
}

pub(crate) fn open(store: &StoreArg, mode: OpenMode, what: &str) -> Result<Opened> {
    crate::remote_cli::open(store, mode, what)
}

fn init(a: InitArgs, json: bool) -> Result<()> {
    let mut config = StoreConfig {
        container_bytes: a.container_mib * MIB,
        compression: a.compression.parse::<Compression>()?,
        ..Default::default()
    };
    let kib = 1024u32;
    config.chunk.avg = a.chunk_kib * kib;
    config.chunk.min = a.chunk_kib * kib / 4;
    config.chunk.max = a.chunk_kib * kib * 8;
    config.segment.avg = a.segment_kib * kib;
    config.segment.min = a.segment_kib * kib / 4;
    config.segment.max = a.segment_kib * kib * 4;
    let existed = a.store.store.exists();
    Store::init(
        &a.store.store,
        &InitOptions {
            config: config.clone(),
            data_dir: a.data_dir,
        },
    )?;
    let remote = match &a.remote.remote {
        Some(_) => crate::remote_cli::init_remote_or_undo(&a.store.store, existed, &a.remote)?,
        None => None,
    };
    if json {
        output::json(
            &serde_json::json!({ "store": a.store.store, "config": config, "remote": remote }),
        );
    } else {
        if let Some(r) = &remote {
            crate::remote_cli::print_init(&a.remote, r);
        }
        println!(
            "initialised store {} ({} MiB containers, {} compression, {} KiB chunks, {} KiB segments)",
            a.store.store.display(),
            a.container_mib,
            config.compression,
            a.chunk_kib,
            a.segment_kib
        );
    }
    Ok(())
}

fn parse_time(s: &str) -> Result<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .with_context(|| format!("--time {s:?}: expected RFC 3339, e.g. 2026-01-31T02:00:00Z"))?;
    Ok(t.unix_timestamp())
}

pub fn format_time(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// The source for an input argument, and its size when known up front.
pub fn open_input(input: &str) -> Result<(Box<dyn Source>, Option<u64>)> {
    if input == "-" {
        return Ok((Box::new(StreamSource::new("stdin", std::io::stdin())), None));
    }
    let p = Path::new(input);
    let m = std::fs::metadata(p).with_context(|| format!("cannot read {input}"))?;
    if m.is_dir() {
        Ok((Box::new(TreeSource::new(p)?), None))
    } else {
        let f = File::open(p).with_context(|| format!("cannot read {input}"))?;
        Ok((
            Box::new(StreamSource::new(input.to_string(), f)),
            Some(m.len()),
        ))
    }
}

fn cmd_backup(a: BackupArgs, json: bool, quiet: bool) -> Result<()> {
    let (unit, time_unix) = a.version.parse()?;
    let series = &a.version.series;
    let (source, size) = open_input(&a.input)?;
    let store = open(
        &a.store,
        OpenMode::ReadWrite,
        &format!("revault backup {series}"),
    )?;
    let pb = output::progress(size, quiet, &format!("backup {series}"));
    let pb2 = pb.clone();
    let opts = BackupOptions {
        unit,
        rewrite: a.rewrite.settings()?,
        time_unix,
        progress: Some(Arc::new(move |n| pb2.set_position(n))),
        cancel: None,
        on_commit: None,
        new_series_retention: None,
        version: None,
    };
    let rep = backup(&store, series, source, &opts);
    pb.finish_and_clear();
    let rep = rep?;
    store.durable(|| format!("version {} of {series}", rep.version))?;
    if json {
        output::json(&rep);
    } else {
        println!(
            "{} version {}: {} MiB in {:.2}s ({} MiB/s), {} new units, {} MiB new data ({} MiB on disk)",
            rep.series,
            rep.version,
            mib(rep.logical_bytes),
            rep.seconds,
            rate(rep.logical_bytes, rep.seconds),
            rep.new_units,
            mib(rep.new_vbytes),
            mib(rep.new_container_bytes)
        );
    }
    if let Some(why) = &rep.retention_error {
        // Committed all the same; no scheduler runs offline, so say so.
        eprintln!(
            "warning: version {} is committed, but automatic retention failed: {why}; run `revault slide` and `revault expire --apply-retention` once the cause is fixed",
            rep.version
        );
    }
    Ok(())
}

fn cmd_restore(a: RestoreArgs, json: bool, quiet: bool) -> Result<()> {
    let sel: VersionSel = a.version.parse()?;
    let cache: revault_engine::CachePolicy = a.cache.parse()?;
    let store = open(&a.store, OpenMode::ReadOnly, "revault restore")?;
    let s = store.series(&a.series)?;
    let v = store.resolve_version(&s, &sel)?;
    let pb = output::progress(
        Some(v.logical_bytes),
        quiet,
        &format!("restore {} v{}", s.name, v.number),
    );
    let pb2 = pb.clone();
    let opts = RestoreOptions {
        cache,
        cache_bytes: a.cache_mib * MIB,
        reuse: !a.no_reuse,
        progress: Some(Arc::new(move |n| pb2.set_position(n))),
        cancel: None,
    };
    let sel = VersionSel::Number(v.number);
    let dest = Destination::of(&a.output, v.kind);
    let rep = match &dest {
        Destination::Stdout => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            restore(&store, &a.series, sel, &opts, RestoreTarget::Writer(&mut w))
        }
        Destination::InPlace => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&a.output)
                .with_context(|| format!("cannot open {}", a.output))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            restore(&store, &a.series, sel, &opts, RestoreTarget::Writer(&mut w))
        }
        Destination::Dir => restore(
            &store,
            &a.series,
            sel,
            &opts,
            RestoreTarget::Dir(Path::new(&a.output)),
        ),
        Destination::File | Destination::Tar => {
            restore_to_file(&store, &a.series, &a.output, sel, &opts)
        }
    };
    pb.finish_and_clear();
    let rep = rep?;
    if json {
        output::json(&rep);
    } else {
        for w in &rep.warnings {
            eprintln!("warning: {w}");
        }
        eprintln!(
            "{} version {} {}: {} MiB in {:.2}s ({} MiB/s), {} container reads, speed factor {}, chain depth {}",
            rep.series,
            rep.version,
            dest.describe(&a.output),
            mib(rep.logical_bytes),
            rep.seconds,
            rate(rep.logical_bytes, rep.seconds),
            rep.container_reads,
            rep.speed_factor.map(|s| format!("{s:.2}")).unwrap_or_else(|| "-".into()),
            rep.chain_depth
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct SeriesRow {
    series: String,
    unit: DedupUnit,
    versions: usize,
    latest: Option<u32>,
    latest_time: Option<String>,
    logical_bytes: u64,
}

fn list(a: ListArgs, json: bool) -> Result<()> {
    let store = open(&a.store, OpenMode::ReadOnly, "revault list")?;
    if let Some(name) = a.series {
        let s = store.series(&name)?;
        let vs = store.versions(&s)?;
        if json {
            output::json(&serde_json::json!({ "series": s, "versions": vs }));
            return Ok(());
        }
        let mut t = Table::new(&[
            "version",
            "time",
            "kind",
            "form",
            "logical MiB",
            "new MiB",
            "on disk MiB",
            "chunks",
        ]);
        for v in vs {
            t.row(vec![
                v.number.to_string(),
                format_time(v.time_unix),
                format!("{:?}", v.kind).to_lowercase(),
                format!("{:?}", v.form).to_lowercase(),
                mib(v.logical_bytes),
                mib(v.new_vbytes),
                mib(v.new_container_bytes),
                v.chunks.to_string(),
            ]);
        }
        print!("{}", t.render());
        return Ok(());
    }
    let mut rows = Vec::new();
    for s in store.list_series()? {
        let vs = store.versions(&s)?;
        rows.push(SeriesRow {
            series: s.name.clone(),
            unit: s.unit,
            versions: vs.len(),
            latest: vs.last().map(|v| v.number),
            latest_time: vs.last().map(|v| format_time(v.time_unix)),
            logical_bytes: vs.iter().map(|v| v.logical_bytes).sum(),
        });
    }
    if json {
        output::json(&rows);
        return Ok(());
    }
    let mut t = Table::new(&[
        "series",
        "unit",
        "versions",
        "latest",
        "latest time",
        "logical MiB",
    ]);
    for r in rows {
        t.row(vec![
            r.series,
            r.unit.to_string(),
            r.versions.to_string(),
            r.latest
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            r.latest_time.unwrap_or_else(|| "-".into()),
            mib(r.logical_bytes),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Also count chunk data stored more than once (what the store holds
    /// beyond exact chunk dedup, and where): reads every unit record.
    #[arg(long)]
    pub repeats: bool,
}

#[derive(Serialize)]
struct StatsOut {
    #[serde(flatten)]
    totals: revault_engine::Totals,
    /// Logical / unique bytes (before compression).
    dedup_ratio: f64,
    /// Logical / bytes on disk (after compression).
    total_ratio: f64,
    metadata_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    repeats: Option<revault_engine::RepeatReport>,
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|it| {
            it.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn stats(a: StatsArgs, json: bool) -> Result<()> {
    let store = open(&a.store, OpenMode::ReadOnly, "revault stats")?;
    let t = store.totals()?;
    let out = StatsOut {
        totals: t,
        dedup_ratio: t.dedup_ratio(),
        total_ratio: t.total_ratio(),
        metadata_bytes: dir_size(&store.root().join(revault_engine::META_DIR)),
        repeats: if a.repeats {
            Some(revault_engine::repeats(&store)?)
        } else {
            None
        },
    };
    if json {
        output::json(&out);
    } else {
        println!("versions            {}", t.versions);
        println!("logical             {} MiB", mib(t.logical_bytes));
        println!(
            "stored, unique      {} MiB  (dedup {})",
            mib(t.unit_vbytes),
            ratio(t.logical_bytes, t.unit_vbytes)
        );
        println!(
            "stored, on disk     {} MiB  (with compression {})",
            mib(t.container_bytes),
            ratio(t.logical_bytes, t.container_bytes)
        );
        println!(
            "containers          {} ({} MiB of data, {} MiB live)",
            t.containers,
            mib(t.container_vbytes),
            mib(t.unit_vbytes)
        );
        println!("units               {}", t.units);
        println!(
            "recipes + catalogs  {} MiB",
            mib(t.recipe_bytes + t.catalog_bytes)
        );
        println!("metadata (RocksDB)  {} MiB", mib(out.metadata_bytes));
        if let Some(r) = &out.repeats {
            let [c2, c3, c45, c6] = r.repeat_bytes_by_copies;
            println!(
                "stored more than once {} MiB of {} MiB ({:.1}% over exact chunk dedup)",
                mib(r.repeat_bytes),
                mib(r.stored_bytes),
                100.0 * (r.excess_ratio() - 1.0)
            );
            println!(
                "  in live units     {} MiB; inside one unit {} MiB",
                mib(r.repeat_bytes_in_live_units),
                mib(r.repeat_bytes_same_unit)
            );
            println!(
                "  by copies         2: {} MiB, 3: {} MiB, 4-5: {} MiB, 6+: {} MiB",
                mib(c2),
                mib(c3),
                mib(c45),
                mib(c6)
            );
        }
    }
    Ok(())
}

fn check(a: StoreArg, json: bool) -> Result<()> {
    let store = open(&a, OpenMode::ReadOnly, "revault check")?;
    let rep = revault_engine::check(&store)?;
    if json {
        output::json(&rep);
    } else {
        for w in &rep.warnings {
            eprintln!("warning: {w}");
        }
        for e in &rep.errors {
            eprintln!("problem: {e}");
        }
        println!(
            "checked {} series, {} versions, {} units, {} containers ({} MiB verified): {}",
            rep.series,
            rep.versions,
            rep.units,
            rep.containers,
            mib(rep.bytes_verified),
            if rep.ok {
                "ok".to_string()
            } else {
                format!("{} problems", rep.errors.len())
            }
        );
    }
    if !rep.ok {
        bail!(
            "store {} failed its check: {}",
            a.store.display(),
            rep.errors[0]
        );
    }
    Ok(())
}

fn gc(a: GcArgs, json: bool) -> Result<()> {
    if !(0.0..=1.0).contains(&a.compact_below) {
        bail!("--compact-below is a fraction between 0 and 1");
    }
    let store = open(&a.store, OpenMode::ReadWrite, "revault gc")?;
    let opts = revault_engine::GcOptions {
        compact_below: a.compact_below,
        full: a.full,
    };
    let rep = revault_engine::gc(&store, &opts)?;
    store.durable(|| "the gc".into())?;
    if json {
        output::json(&rep);
    } else {
        println!(
            "gc: marked {} of {} series, swept {} containers: freed {} units and {} containers ({} MiB), compacted {} (trimmed {} units, wrote {} MiB), removed {} orphan files, in {:.2}s",
            rep.groups_marked,
            rep.groups,
            rep.containers_swept,
            rep.units_freed,
            rep.containers_freed,
            mib(rep.bytes_freed),
            rep.containers_compacted,
            rep.units_trimmed,
            mib(rep.bytes_written),
            rep.orphans.orphan_files,
            rep.seconds
        );
        if rep.orphans.quarantined_files > 0 {
            eprintln!(
                "warning: moved {} files ({} MiB) that no record names and no commit freed to {}: the metadata may have lost writes; they were not deleted (docs/retention.md)",
                rep.orphans.quarantined_files,
                mib(rep.orphans.quarantined_bytes),
                store.data_dir().join(revault_engine::QUARANTINE).display()
            );
        }
    }
    Ok(())
}

fn slide(a: SeriesArgs, json: bool) -> Result<()> {
    let store = open(
        &a.store,
        OpenMode::ReadWrite,
        &format!("revault slide {}", a.series),
    )?;
    let rep = revault_engine::slide(&store, &a.series)?;
    store.durable(|| format!("the slide of {}", a.series))?;
    if json {
        output::json(&rep);
    } else if rep.slid.is_empty() {
        println!("{}: nothing left the live window", rep.series);
    } else {
        println!(
            "{}: slid versions {:?}: {} chunks now reference the next version, {} stay direct; trimmed {} units, freed {}, moved {}; wrote {} MiB, freed {} containers ({} MiB) in {:.2}s",
            rep.series,
            rep.slid,
            rep.indirect_chunks,
            rep.direct_chunks,
            rep.units_trimmed,
            rep.units_freed,
            rep.units_moved,
            mib(rep.bytes_written),
            rep.containers_freed,
            mib(rep.bytes_freed),
            rep.seconds
        );
    }
    Ok(())
}

fn expire(a: ExpireArgs, json: bool) -> Result<()> {
    use revault_engine::ExpireSel;
    let sel = if let Some(v) = a.version {
        ExpireSel::Version(v)
    } else if let Some(t) = &a.before {
        ExpireSel::Before(parse_time(t)?)
    } else {
        ExpireSel::Retention
    };
    let store = open(
        &a.series.store,
        OpenMode::ReadWrite,
        &format!("revault expire {}", a.series.series),
    )?;
    let rep = revault_engine::expire(&store, &a.series.series, &sel)?;
    store.durable(|| format!("the expiry of {:?} of {}", rep.expired, a.series.series))?;
    if json {
        output::json(&rep);
    } else {
        println!(
            "{}: expired versions {:?} ({} MiB logical); freed {} units and {} containers ({} MiB) in {:.3}s",
            rep.series,
            rep.expired,
            mib(rep.logical_bytes_expired),
            rep.units_freed,
            rep.containers_freed,
            mib(rep.bytes_freed),
            rep.seconds
        );
    }
    Ok(())
}
