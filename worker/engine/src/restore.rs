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

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rayon::prelude::*;
use serde::Serialize;

use crate::caches::CachePolicy;
use crate::config::MIB;
use crate::error::{corrupt_meta, Error, Result};
use crate::format::catalog;
use crate::format::container::{decode_block, BlockInfo, ContainerFile, ContainerId};
use crate::format::keys::{part_key, CF_CATALOGS, CF_RECIPES};
use crate::format::recipe::{decode_part, Entry};
use crate::format::records::{RecipeForm, SeriesRecord, VersionKind, VersionRecord};
use crate::meta::MetaRead;
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    Stored {
        container: ContainerId,
        vaddr: u64,
        len: u64,
    },
    Zero {
        len: u64,
    },
}

impl Extent {
    pub fn len(&self) -> u64 {
        match *self {
            Extent::Stored { len, .. } | Extent::Zero { len } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Extends `self` with `next` when they are contiguous.
    fn absorb(&mut self, next: &Extent) -> bool {
        match (self, next) {
            (Extent::Zero { len }, Extent::Zero { len: l2 }) => {
                *len += l2;
                true
            }
            (
                Extent::Stored {
                    container,
                    vaddr,
                    len,
                },
                Extent::Stored {
                    container: c2,
                    vaddr: v2,
                    len: l2,
                },
            ) if container == c2 && *vaddr + *len == *v2 => {
                *len += l2;
                true
            }
            _ => false,
        }
    }
}

pub(crate) fn push_extent(out: &mut Vec<Extent>, e: Extent) {
    if e.is_empty() {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.absorb(&e) {
            return;
        }
    }
    out.push(e);
}

/// Reads a version's recipe parts.
pub(crate) fn recipe_entries(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<Vec<Entry>>> {
    let what = format!("{} version {}", series.name, v.number);
    let parts = version_parts(r, CF_RECIPES, "recipe", series, v, v.recipe_parts)?
        .iter()
        .map(|part| decode_part(&what, part))
        .collect::<Result<Vec<_>>>()?;
    // The readers expand entries per unit and per position: a recipe claiming more positions
    // than its version holds is refused before it is expanded into unbounded memory.
    let claimed = (parts.iter().flatten()).try_fold(0u64, |n, e| n.checked_add(e.min_positions()));
    if claimed.is_none_or(|n| n > v.chunks) {
        return Err(corrupt_meta(
            format!("recipe of {what}"),
            format!(
                "it covers more than the version's {} chunk positions",
                v.chunks
            ),
        ));
    }
    Ok(parts)
}

/// The stored parts of a version's recipe or catalog, in order.
fn version_parts(
    r: &impl MetaRead,
    cf: &str,
    kind: &str,
    s: &SeriesRecord,
    v: &VersionRecord,
    count: u32,
) -> Result<Vec<Vec<u8>>> {
    (0..count)
        .map(|i| {
            r.get_raw(cf, &part_key(s.id, v.number, i))?.ok_or_else(|| {
                corrupt_meta(
                    format!("{kind} of {} version {}", s.name, v.number),
                    format!("part {i} is missing"),
                )
            })
        })
        .collect()
}

/// Resolves a live recipe part into extents.
fn live_part_extents(r: &impl MetaRead, entries: &[Entry], out: &mut Vec<Extent>) -> Result<()> {
    let mut ids = Vec::new();
    for e in entries {
        if let Entry::Units { first, count } = *e {
            ids.extend(first..first + count);
        }
    }
    let units = crate::archive::load_with_links(r, &ids)?;
    let mut locs = Vec::new();
    for e in entries {
        match *e {
            Entry::Units { first, count } => {
                for id in first..first + count {
                    locs.clear();
                    let n = units.get(&id).map(|u| u.chunks.len()).unwrap_or(0);
                    crate::archive::unit_locs(&units, id, 0, n, &mut locs)?;
                    for l in &locs {
                        push_extent(out, l.extent());
                    }
                }
            }
            Entry::Zero { len, count } => push_extent(
                out,
                Extent::Zero {
                    len: u64::from(len) * count,
                },
            ),
            _ => {
                return Err(corrupt_meta(
                    "recipe",
                    "a live recipe holds a chunk reference",
                ))
            }
        }
    }
    Ok(())
}

/// The extents of a version, produced a recipe part at a time.
pub(crate) struct Extents {
    parts: VecDeque<Vec<Entry>>,
    ready: VecDeque<Extent>,
    /// Fully resolved extents (archival versions).
    resolved: bool,
}

impl Extents {
    /// Extents resolved up front (an archival version, or positions `auto` resolved).
    fn resolved(extents: Vec<Extent>) -> Self {
        Extents {
            parts: VecDeque::new(),
            ready: extents.into(),
            resolved: true,
        }
    }

    fn next(&mut self, r: &impl MetaRead) -> Result<Option<Extent>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.resolved {
                return Ok(None);
            }
            let Some(part) = self.parts.pop_front() else {
                return Ok(None);
            };
            let mut v = Vec::new();
            live_part_extents(r, &part, &mut v)?;
            self.ready.extend(v);
        }
    }
}

pub(crate) fn version_extents(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
) -> Result<(Extents, u32)> {
    let parts = recipe_entries(r, series, v)?;
    match v.form {
        RecipeForm::Live => Ok((
            Extents {
                parts: parts.into(),
                ready: VecDeque::new(),
                resolved: false,
            },
            0,
        )),
        RecipeForm::Archival => {
            let (extents, depth) = crate::archive::resolve_archival(r, series, v, parts)?;
            Ok((Extents::resolved(extents), depth))
        }
    }
}

/// Open containers shared by the restore threads.
#[derive(Default)]
pub(crate) struct ContainerCache {
    map: Mutex<HashMap<ContainerId, Arc<ContainerFile>>>,
}

impl ContainerCache {
    pub fn get(&self, store: &Store, id: ContainerId) -> Result<Arc<ContainerFile>> {
        if let Some(c) = self.map.lock().get(&id) {
            return Ok(c.clone());
        }
        let c = Arc::new(ContainerFile::open(store.data_dir(), id, false)?);
        let mut m = self.map.lock();
        if m.len() >= 1024 {
            m.clear();
        }
        m.insert(id, c.clone());
        Ok(c)
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub bytes_read: AtomicU64,
    pub decoded: AtomicU64,
}

/// A piece of the FAA to fill from a container: (destination, data-space address).
pub(crate) type Piece<'a> = (&'a mut [u8], u64);

/// The blocks of `cf` holding `[vaddr, vaddr+len)`; an error naming the
/// container when the range lies outside its data.
pub(crate) fn blocks_of(cf: &ContainerFile, vaddr: u64, len: u64) -> Result<Range<usize>> {
    let blocks = &cf.footer.blocks;
    let r = cf.footer.blocks_for(vaddr, len);
    if r.is_empty()
        || r.end > blocks.len()
        || blocks[r.end - 1].vbase + u64::from(blocks[r.end - 1].vlen) < vaddr + len
    {
        return Err(Error::CorruptContainer {
            container: cf.id.to_string(),
            detail: format!("data range {vaddr}+{len} is outside the container"),
        });
    }
    Ok(r)
}

/// Fills the pieces from one container with a single read.
fn fill_from_container(cf: &ContainerFile, pieces: Vec<Piece<'_>>, c: &Counters) -> Result<()> {
    let mut lo = usize::MAX;
    let mut hi = 0;
    for (dst, vaddr) in &pieces {
        let r = blocks_of(cf, *vaddr, dst.len() as u64)?;
        lo = lo.min(r.start);
        hi = hi.max(r.end);
    }
    let mut stored = Vec::new();
    let n = cf.read_blocks(lo..hi, &mut stored)?;
    c.reads.fetch_add(1, Ordering::Relaxed);
    c.bytes_read.fetch_add(n, Ordering::Relaxed);
    let base = cf.footer.blocks[lo].offset;
    let blocks: Vec<(&BlockInfo, &[u8])> = cf.footer.blocks[lo..hi]
        .iter()
        .map(|b| {
            let s = (b.offset - base) as usize;
            (b, &stored[s..s + b.stored_len as usize])
        })
        .collect();
    fill_pieces(cf.id, &blocks, pieces, &c.decoded)
}

/// Decodes (checksum first) the blocks the pieces overlap and copies each
/// piece out of them. `blocks` are (block, its stored bytes) in data-space
/// order; blocks no piece overlaps are skipped. A piece not wholly covered
/// by the blocks is an error naming the container, never a hole.
pub(crate) fn fill_pieces(
    id: ContainerId,
    blocks: &[(&BlockInfo, &[u8])],
    mut pieces: Vec<Piece<'_>>,
    decoded: &AtomicU64,
) -> Result<()> {
    pieces.sort_unstable_by_key(|p| p.1);
    let want: u64 = pieces.iter().map(|p| p.0.len() as u64).sum();
    let mut copied = 0u64;
    let mut plain = Vec::new();
    let mut first_piece = 0;
    for &(b, stored) in blocks {
        let bend = b.vbase + u64::from(b.vlen);
        // Skip pieces that end before this block.
        while first_piece < pieces.len()
            && pieces[first_piece].1 + pieces[first_piece].0.len() as u64 <= b.vbase
        {
            first_piece += 1;
        }
        let needed = pieces[first_piece..]
            .iter()
            .take_while(|p| p.1 < bend)
            .any(|p| p.1 + p.0.len() as u64 > b.vbase);
        if !needed {
            continue;
        }
        plain.resize(b.vlen as usize, 0);
        decode_block(id, b, stored, &mut plain)?;
        decoded.fetch_add(u64::from(b.vlen), Ordering::Relaxed);
        for (dst, vaddr) in pieces[first_piece..].iter_mut() {
            if *vaddr >= bend {
                break;
            }
            let pend = *vaddr + dst.len() as u64;
            if pend <= b.vbase {
                continue;
            }
            let from = (*vaddr).max(b.vbase);
            let to = pend.min(bend);
            dst[(from - *vaddr) as usize..(to - *vaddr) as usize]
                .copy_from_slice(&plain[(from - b.vbase) as usize..(to - b.vbase) as usize]);
            copied += to - from;
        }
    }
    if copied != want {
        return Err(Error::CorruptContainer {
            container: id.to_string(),
            detail: format!(
                "{} of {want} bytes asked of it are not in its blocks",
                want - copied
            ),
        });
    }
    Ok(())
}

/// Asks the kernel to start reading what a window will need.
pub(crate) fn prefetch(store: &Store, cache: &ContainerCache, window: &[Extent]) {
    let mut spans: HashMap<ContainerId, (u64, u64)> = HashMap::new();
    for e in window {
        if let Extent::Stored {
            container,
            vaddr,
            len,
        } = *e
        {
            let s = spans.entry(container).or_insert((u64::MAX, 0));
            s.0 = s.0.min(vaddr);
            s.1 = s.1.max(vaddr + len);
        }
    }
    for (id, (lo, hi)) in spans {
        let Ok(cf) = cache.get(store, id) else {
            continue;
        };
        let r = cf.footer.blocks_for(lo, hi - lo);
        if r.is_empty() {
            continue;
        }
        let b0 = &cf.footer.blocks[r.start];
        let b1 = &cf.footer.blocks[r.end - 1];
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on a valid fd.
        unsafe {
            libc::posix_fadvise(
                cf.file.as_raw_fd(),
                b0.offset as libc::off_t,
                (b1.offset + u64::from(b1.stored_len) - b0.offset) as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }
}

/// Pulls the next window (at most `cap` bytes) of extents, splitting the last.
pub(crate) fn take_window(
    r: &impl MetaRead,
    ex: &mut Extents,
    carry: &mut Option<Extent>,
    cap: u64,
) -> Result<Vec<Extent>> {
    let mut w = Vec::new();
    let mut used = 0u64;
    while used < cap {
        let e = match carry.take() {
            Some(e) => e,
            None => match ex.next(r)? {
                Some(e) => e,
                None => break,
            },
        };
        let room = cap - used;
        if e.len() <= room {
            used += e.len();
            w.push(e);
        } else {
            let (a, b) = match e {
                Extent::Zero { len } => {
                    (Extent::Zero { len: room }, Extent::Zero { len: len - room })
                }
                Extent::Stored {
                    container,
                    vaddr,
                    len,
                } => (
                    Extent::Stored {
                        container,
                        vaddr,
                        len: room,
                    },
                    Extent::Stored {
                        container,
                        vaddr: vaddr + room,
                        len: len - room,
                    },
                ),
            };
            used += room;
            w.push(a);
            *carry = Some(b);
        }
    }
    Ok(w)
}

/// Streams a version's bytes through the FAA into `out`.
fn run_faa(
    view: &ReadView<'_>,
    mut ex: Extents,
    opts: &RestoreOptions,
    out: &mut dyn Write,
    rep: &mut RestoreReport,
) -> Result<()> {
    let store = view.store();
    let cap = opts.cache_bytes.max(MIB);
    let cache = ContainerCache::default();
    let counters = Counters::default();
    let mut carry = None;
    let mut faa: Vec<u8> = Vec::new();
    let mut next = take_window(view, &mut ex, &mut carry, cap)?;
    let mut written = 0u64;
    while !next.is_empty() {
        let window = std::mem::take(&mut next);
        next = take_window(view, &mut ex, &mut carry, cap)?;
        prefetch(store, &cache, &next);
        if let Some(c) = &opts.cancel {
            if c.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
        }
        let total: u64 = window.iter().map(|e| e.len()).sum();
        if faa.len() < total as usize {
            faa.resize(total as usize, 0);
        }
        let area = &mut faa[..total as usize];
        // Cut the area into one slice per extent and group them by container.
        let mut groups: HashMap<ContainerId, Vec<Piece<'_>>> = HashMap::new();
        let mut rest: &mut [u8] = area;
        for e in &window {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(e.len() as usize);
            rest = tail;
            match *e {
                Extent::Zero { .. } => head.fill(0),
                Extent::Stored {
                    container, vaddr, ..
                } => groups.entry(container).or_default().push((head, vaddr)),
            }
        }
        groups.into_par_iter().try_for_each(|(id, pieces)| {
            fill_from_container(cache.get(store, id)?.as_ref(), pieces, &counters)
        })?;
        out.write_all(&faa[..total as usize])
            .map_err(|e| match e.downcast::<Error>() {
                Ok(inner) => inner,
                Err(e) => Error::Io {
                    context: "writing restored data".into(),
                    source: e,
                },
            })?;
        written += total;
    }
    debug_assert_eq!(written, rep.logical_bytes);
    rep.peak_cache_bytes = faa.len() as u64;
    rep.container_reads = counters.reads.load(Ordering::Relaxed);
    rep.bytes_read = counters.bytes_read.load(Ordering::Relaxed);
    rep.bytes_decoded = counters.decoded.load(Ordering::Relaxed);
    Ok(())
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
    let (all, depth) = crate::archive::resolve_positions(&view, &s, &v, parts)?;
    rep.chain_depth = depth;
    let budget = rep.cache_bytes;
    // lru-chunk is a chunk cache itself: reuse would only take its memory.
    let next =
        (opts.reuse && policy != CachePolicy::LruChunk).then(|| crate::reuse::next_uses(&all));
    let plan = |share| {
        let next = next.as_deref()?;
        let p = crate::reuse::plan(&all, next, crate::reuse::budget_of(budget, share));
        (!p.is_empty()).then_some(p)
    };
    let mut reuse: Option<(crate::reuse::Plan, Vec<crate::archive::Loc>)> = None;
    if policy == CachePolicy::Auto {
        rep.cache_auto = true;
        let cb = store.config().container_bytes;
        let (engine, mut fewest) = crate::caches::choose(&all, budget, cb);
        policy = engine;
        for p in crate::reuse::AUTO_SHARES.into_iter().filter_map(plan) {
            let locs = p.engine_locs(&all);
            let (engine, reads) = crate::caches::choose(&locs, budget - p.peak_bytes, cb);
            if reads < fewest {
                (policy, fewest) = (engine, reads);
                reuse = Some((p, locs));
            }
        }
    } else if let Some(p) = plan(crate::reuse::DEFAULT_SHARE) {
        let locs = p.engine_locs(&all);
        reuse = Some((p, locs));
    }
    drop(next);
    let (reuse, locs) = match reuse {
        Some((p, locs)) => (Some(p), locs),
        None => (None, all),
    };
    if let Some(p) = &reuse {
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
        match &reuse {
            None => run_engine(&view, policy, locs, engine_budget, opts, &mut out, rep)?,
            Some(p) => {
                let mut w = crate::reuse::ReuseWriter::new(&mut out, p);
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
                    let mut w = crate::tree::TreeWriter::new(p, entries)?;
                    run(&mut w, &mut rep)?;
                    rep.warnings = w.finish()?;
                }
                RestoreTarget::Writer(out) => {
                    let mut w = crate::tree::TarWriter::new(out, entries);
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
    locs: Vec<crate::archive::Loc>,
    budget: u64,
    opts: &RestoreOptions,
    out: &mut dyn Write,
    rep: &mut RestoreReport,
) -> Result<()> {
    match policy {
        CachePolicy::Faa | CachePolicy::Auto => {
            let extents = Extents::resolved(crate::archive::loc_extents(&locs));
            drop(locs); // before the FAA allocates its area
            let opts = RestoreOptions {
                cache_bytes: budget,
                ..opts.clone()
            };
            run_faa(view, extents, &opts, out, rep)
        }
        policy => {
            let st = crate::caches::run(view.store(), policy, &locs, budget, out)?;
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

pub(crate) fn load_catalog(
    r: &impl MetaRead,
    s: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<catalog::Entry>> {
    let what = format!("{} version {}", s.name, v.number);
    catalog::decode(&what, &catalog_parts(r, s, v)?)
}

/// A tree version's catalog as stored (encoded parts).
pub(crate) fn catalog_parts(
    r: &impl MetaRead,
    s: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<Vec<u8>>> {
    version_parts(r, CF_CATALOGS, "catalog", s, v, v.catalog_parts)
}
