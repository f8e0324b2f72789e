//! Restore: recipe → extents → forward assembly area (FAA) → output.
//!
//! The version's recipe is resolved into *extents*: runs of bytes in one
//! container's data space, or runs of zeros. The FAA (the restore memory
//! budget) is filled one window at a time: the extents of the window are
//! grouped by container, each container is read once for the window (one
//! read spanning the blocks it needs; the *container reads* we count), blocks
//! are checksummed and decompressed in parallel, and bytes are copied to their
//! places in the window, which is then written out. The next window's
//! containers are announced to the kernel (`posix_fadvise(WILLNEED)`) before
//! the current window is assembled, so disk reads overlap with assembly.
//!
//! Speed factor = MiB restored per container read (Cao et al., FAST '19).

pub mod cache;
pub(crate) mod faa;
pub mod reuse;
pub mod transfer;

use crate::recipe::load_catalog;
use crate::recipe::recipe_entries;
use crate::recipe::Extents;
use crate::restore::faa::run_faa;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::config::MIB;
use crate::error::{Error, Result};
use crate::format::records::{SeriesRecord, VersionKind, VersionRecord};
use crate::meta::MetaRead;
use crate::restore::cache::CachePolicy;
use crate::store::{resolve_version_in, series_in, ReadView, Store, VersionSel};

pub const DEFAULT_CACHE_BYTES: u64 = 64 * MIB;

#[derive(Clone)]
pub struct RestoreOptions {
    /// Restore memory: the forward assembly area, or the cache of `cache`.
    pub cache_bytes: u64,
    pub cache: CachePolicy,
    /// Serve chunks the version repeats from memory (`reuse.rs`); off only
    /// to measure what it saves.
    pub reuse: bool,
    pub progress: Option<crate::progress::Progress>,
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            cache_bytes: DEFAULT_CACHE_BYTES,
            cache: CachePolicy::default(),
            reuse: true,
            progress: None,
            cancel: None,
        }
    }
}

pub enum RestoreTarget<'a> {
    /// Recreate a directory version as files (a stream version as one file in it
    /// is refused: use `Writer`).
    Dir(&'a Path),
    /// The version as bytes: a stream version as-is, a tree version as tar.
    Writer(&'a mut dyn Write),
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RestoreReport {
    pub series: String,
    pub version: u32,
    pub kind: Option<VersionKind>,
    pub logical_bytes: u64,
    pub container_reads: u64,
    /// Stored (compressed) bytes read from container files.
    pub bytes_read: u64,
    /// Uncompressed bytes decoded from blocks.
    pub bytes_decoded: u64,
    /// Bytes decoded per byte restored (1.0 means nothing wasted).
    pub read_amplification: f64,
    /// MiB restored per container read; absent when nothing was read.
    pub speed_factor: Option<f64>,
    /// Levels of indirect references followed (0 for a live version).
    pub chain_depth: u32,
    /// The cache that ran (what `auto` chose, when it was asked for).
    pub cache: String,
    /// Whether `cache` was chosen by `auto`.
    pub cache_auto: bool,
    pub cache_bytes: u64,
    /// The most memory the cache held (never more than `cache_bytes`).
    pub peak_cache_bytes: u64,
    /// Bytes of chunks the version repeats that were served from memory
    /// rather than read again (see `reuse.rs`), and the most it held for that
    /// (part of `peak_cache_bytes`).
    pub reused_bytes: u64,
    pub reuse_peak_bytes: u64,
    pub seconds: f64,
    pub warnings: Vec<String>,
}

pub fn restore(
    store: &Store,
    series: &str,
    sel: VersionSel,
    opts: &RestoreOptions,
    target: RestoreTarget<'_>,
) -> Result<RestoreReport> {
    let started = Instant::now();
    // One snapshot for the whole restore; containers it uses stay on disk
    // until it ends, whatever slides, expiries and gc commit meanwhile.
    let view = store.read_view();
    let (s, v, mut rep) = begin(&view, series, &sel, opts)?;
    // Every cache runs on the version's resolved chunk positions, less those
    // the reuse plan serves from memory (chunks the version repeats). `auto`
    // counts on the recipe which of faa and opt reads fewer containers, and
    // with how much of the budget given to reuse (none, or one of a few
    // shares): the fewest container reads wins.
    let mut policy = opts.cache;
    let parts = recipe_entries(&view, &s, &v)?;
    let (all, depth) = crate::recipe::archival::resolve_positions(&view, &s, &v, parts)?;
    rep.chain_depth = depth;
    let budget = rep.cache_bytes;
    // lru-chunk is a chunk cache itself: reuse would only take its memory.
    let next = (opts.reuse && policy != CachePolicy::LruChunk).then(|| reuse::next_uses(&all));
    let plan = |share| {
        let next = next.as_deref()?;
        let p = reuse::plan(&all, next, reuse::budget_of(budget, share));
        (!p.is_empty()).then_some(p)
    };
    let mut chosen: Option<(reuse::Plan, Vec<crate::recipe::archival::Loc>)> = None;
    if policy == CachePolicy::Auto {
        rep.cache_auto = true;
        let cb = store.config().container_bytes;
        let (engine, mut fewest) = cache::choose(&all, budget, cb);
        policy = engine;
        for p in reuse::AUTO_SHARES.into_iter().filter_map(plan) {
            let locs = p.engine_locs(&all);
            let (engine, reads) = cache::choose(&locs, budget - p.peak_bytes, cb);
            if reads < fewest {
                (policy, fewest) = (engine, reads);
                chosen = Some((p, locs));
            }
        }
    } else if let Some(p) = plan(reuse::DEFAULT_SHARE) {
        let locs = p.engine_locs(&all);
        chosen = Some((p, locs));
    }
    drop(next);
    let (reuse_plan, locs) = match chosen {
        Some((p, locs)) => (Some(p), locs),
        None => (None, all),
    };
    if let Some(p) = &reuse_plan {
        rep.reused_bytes = p.served_bytes;
        rep.reuse_peak_bytes = p.peak_bytes;
    }
    let engine_budget = budget - rep.reuse_peak_bytes;
    rep.cache = policy.name().to_string();
    let run = |out: &mut dyn Write, rep: &mut RestoreReport| -> Result<()> {
        let mut out = Progressed {
            out,
            done: 0,
            next: PROGRESS_STEP,
            progress: opts.progress.clone(),
        };
        match &reuse_plan {
            None => run_engine(&view, policy, locs, engine_budget, opts, &mut out, rep)?,
            Some(p) => {
                let mut w = reuse::ReuseWriter::new(&mut out, p);
                run_engine(&view, policy, locs, engine_budget, opts, &mut w, rep)?;
                w.finish()?;
            }
        }
        rep.peak_cache_bytes += rep.reuse_peak_bytes;
        Ok(())
    };
    match (v.kind, target) {
        (VersionKind::Stream, RestoreTarget::Writer(w)) => {
            run(w, &mut rep)?;
            w.flush().map_err(|e| Error::Io { context: "writing restored data".into(), source: e })?;
        }
        (VersionKind::Stream, RestoreTarget::Dir(p)) => {
            return Err(Error::Invalid(format!(
                "{} version {} is a single stream, not a directory; restore it to a file (-o FILE) instead of {}",
                s.name,
                v.number,
                p.display()
            )))
        }
        (VersionKind::Tree, target) => {
            let entries = load_catalog(&view, &s, &v)?;
            match target {
                RestoreTarget::Dir(p) => {
                    let mut w = crate::source::tree::TreeWriter::new(p, entries)?;
                    run(&mut w, &mut rep)?;
                    rep.warnings = w.finish()?;
                }
                RestoreTarget::Writer(out) => {
                    let mut w = crate::source::tree::TarWriter::new(out, entries);
                    run(&mut w, &mut rep)?;
                    w.finish()?;
                }
            }
        }
    }
    conclude(&mut rep, started);
    Ok(rep)
}

/// Restores `locs` with `policy`'s container engine under `budget` bytes.
fn run_engine(
    view: &ReadView<'_>,
    policy: CachePolicy,
    locs: Vec<crate::recipe::archival::Loc>,
    budget: u64,
    opts: &RestoreOptions,
    out: &mut dyn Write,
    rep: &mut RestoreReport,
) -> Result<()> {
    match policy {
        CachePolicy::Faa | CachePolicy::Auto => {
            let extents = Extents::resolved(crate::recipe::archival::loc_extents(&locs));
            drop(locs); // before the FAA allocates its area
            let opts = RestoreOptions {
                cache_bytes: budget,
                ..opts.clone()
            };
            run_faa(view, extents, &opts, out, rep)
        }
        policy => {
            let st = cache::run(view.store(), policy, &locs, budget, out)?;
            rep.container_reads = st.reads;
            rep.bytes_read = st.bytes_read;
            rep.bytes_decoded = st.decoded;
            rep.peak_cache_bytes = st.peak;
            Ok(())
        }
    }
}

/// The series and version a restore reads, and the report it starts.
pub(crate) fn begin(
    view: &ReadView<'_>,
    series: &str,
    sel: &VersionSel,
    opts: &RestoreOptions,
) -> Result<(SeriesRecord, VersionRecord, RestoreReport)> {
    let s = series_in(view, series)?;
    let v = resolve_version_in(view, &s, sel)?;
    let rep = RestoreReport {
        series: s.name.clone(),
        version: v.number,
        kind: Some(v.kind),
        logical_bytes: v.logical_bytes,
        cache_bytes: opts.cache_bytes.max(MIB),
        ..Default::default()
    };
    Ok((s, v, rep))
}

/// Fills in a finished restore's time and derived figures.
pub(crate) fn conclude(rep: &mut RestoreReport, started: Instant) {
    rep.seconds = started.elapsed().as_secs_f64();
    rep.read_amplification = if rep.logical_bytes > 0 {
        rep.bytes_decoded as f64 / rep.logical_bytes as f64
    } else {
        0.0
    };
    rep.speed_factor = (rep.container_reads > 0)
        .then(|| rep.logical_bytes as f64 / MIB as f64 / rep.container_reads as f64);
}

const PROGRESS_STEP: u64 = 4 << 20;

/// Counts restored bytes for the progress callback.
struct Progressed<'a> {
    out: &'a mut dyn Write,
    done: u64,
    next: u64,
    progress: Option<crate::progress::Progress>,
}

impl Write for Progressed<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.done += n as u64;
        if self.done >= self.next {
            self.next = self.done + PROGRESS_STEP;
            if let Some(p) = &self.progress {
                p(self.done);
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
