//! Inline backup: source → chunking → fingerprints → dedup → containers → commit.
//!
//! Four stages run concurrently, connected by bounded channels (so memory
//! stays bounded whatever the input size):
//!
//! 1. a reading thread reads the source into 1 MiB blocks, noting where each
//!    piece (each file of a tree) ends;
//! 2. a chunking thread cuts each block into chunks (restarting at every
//!    piece), a block's two halves at once on the rayon pool, following
//!    predictions from the series' previous version
//!    ([`crate::predict::Cutter::cut_span`]);
//! 3. a hashing thread fingerprints each block's chunks in parallel (rayon)
//!    and flags all-zero chunks;
//! 4. the caller's thread groups chunks into segments, looks units up in the
//!    index (in chunk mode, not those the previous version holds: their
//!    copies come with the prediction), and packs new units into containers
//!    (compressed on the pack writer's thread).
//!
//! Nothing is visible until the final commit, which happens only after every
//! container of the session is fsynced.

use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use serde::Serialize;

use crate::bufpool::{BufPool, Lent};
use crate::chunker::{Chunker, Segmenter};
use crate::config::DedupUnit;
use crate::error::{Error, Result};
use crate::format::catalog;
use crate::format::container::{ChunkEntry, ContainerId, CHUNK_LINK, CHUNK_ZERO};
use crate::format::fp::Fp;
use crate::format::keys::{part_key, version_key, CF_CATALOGS, CF_RECIPES, CF_VERSIONS};
use crate::format::recipe::RecipeBuilder;
use crate::format::records::{RecipeForm, SeriesRecord, VersionKind, VersionRecord};
use crate::format::refcounts::Refs;
use crate::format::unit::UnitRecord;
use crate::meta::MetaRead;
use crate::predict::{fingerprint, Cuts, Cutter, Known, Loader, Window};
use crate::rewrite::{Item, Policy, RewriteSettings};
use crate::source::Source;
use crate::store::commit::Txn;
use crate::store::pack::{PackChunk, PackWriter};
use crate::store::{check_series_name, now_unix, Store, UnitCopy};

const BUF_BYTES: usize = 1 << 20;

use crate::progress::Progress;

/// Extra metadata a backup commits atomically with its version: called with
/// the new version's number and logical size just before the commit, it
/// returns `(column family, key, value)` puts (e.g. [`crate::objects`]'s
/// index entry, so an object and its version appear together or not at all).
pub type CommitHook =
    Arc<dyn Fn(u32, u64) -> Result<Vec<(&'static str, Vec<u8>, Vec<u8>)>> + Send + Sync>;

#[derive(Clone, Default)]
pub struct BackupOptions {
    /// Dedup unit for a new series (an existing series keeps its own).
    pub unit: Option<DedupUnit>,
    /// Rewrite policy; stored with the series and used by later backups.
    /// `None` uses the series' stored policy.
    pub rewrite: Option<RewriteSettings>,
    /// Backup time (unix seconds); defaults to now.
    pub time_unix: Option<i64>,
    /// Called with the logical bytes read so far.
    pub progress: Option<Progress>,
    pub cancel: Option<Arc<AtomicBool>>,
    /// Metadata to commit with the version (see [`CommitHook`]).
    pub on_commit: Option<CommitHook>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BackupReport {
    pub series: String,
    pub version: u32,
    pub kind: VersionKind,
    pub unit: DedupUnit,
    pub time_unix: i64,
    pub logical_bytes: u64,
    pub chunks: u64,
    /// Distinct units the version references.
    pub units: u64,
    pub new_units: u64,
    /// New unique data (uncompressed) and what it took on disk.
    pub new_vbytes: u64,
    pub new_container_bytes: u64,
    pub zero_bytes: u64,
    pub catalog_entries: u64,
    pub recipe_bytes: u64,
    pub catalog_bytes: u64,
    pub seconds: f64,
    /// Rewrite policy used, and the duplicates it stored again.
    pub rewrite: String,
    pub rewritten_units: u64,
    pub rewritten_chunks: u64,
    pub rewritten_bytes: u64,
    /// Bytes whose chunk boundaries came from the previous version (checked,
    /// not scanned for; see the predict module).
    pub predicted_bytes: u64,
    /// What the series' automatic retention did after the backup committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slide: Option<crate::slide::SlideReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire: Option<crate::expire::ExpireReport>,
    /// Why automatic retention failed after the commit (the version exists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_error: Option<String>,
}

/// Source bytes at `data[head..end]` (see [`read_stage`]).
struct Block {
    data: Vec<u8>,
    end: usize,
    /// Where pieces end (the next begins) in `data`, in order; the bytes after
    /// the last of them continue in the next block.
    piece_ends: Vec<usize>,
}

struct Batch {
    /// The block, shared by the chunks cut from it; when the last of them is
    /// done with it, it goes back to the reading stage to be filled again.
    buf: Arc<Lent>,
    chunks: Vec<(u32, u32)>,
    /// Fingerprints the chunking stage already computed (predictions, probes).
    known: Vec<Known>,
}

struct Hashed {
    buf: Arc<Lent>,
    chunks: Vec<(u32, u32)>,
    fps: Vec<Fp>,
    zero: Vec<bool>,
    /// Copies the previous version references (chunk mode, see predict).
    copies: Vec<Option<UnitCopy>>,
    /// Bytes of this batch whose chunk boundaries were predicted.
    predicted: u64,
}

/// A chunk waiting in the current segment.
struct SegChunk {
    buf: Arc<Lent>,
    start: u32,
    len: u32,
    fp: Fp,
    zero: bool,
}

impl SegChunk {
    fn data(&self) -> &[u8] {
        &self.buf[self.start as usize..(self.start + self.len) as usize]
    }

    fn entry(&self) -> ChunkEntry {
        ChunkEntry::new(if self.zero { CHUNK_ZERO } else { 0 }, self.len, self.fp)
    }
}

pub fn backup(
    store: &Store,
    series_name: &str,
    source: Box<dyn Source>,
    opts: &BackupOptions,
) -> Result<BackupReport> {
    let started = Instant::now();
    store.require_writable()?;
    check_series_name(series_name)?;
    let _claim = store.claim_series(series_name)?;
    let existing = store.meta.series(series_name)?;
    // A series without versions takes its unit from this backup: one created by `retention
    // set`, or one emptied by expiring every version (DELETE of the series through the API,
    // after which a new series of the same name may pick another unit).
    let latest = match &existing {
        Some(s) if s.next_version > 1 => store.versions(s)?.pop(),
        _ => None,
    };
    let empty = latest.is_none();
    let unit_kind = match (&existing, opts.unit) {
        (Some(_), Some(u)) if empty => u,
        (Some(s), Some(u)) if s.unit != u => {
            return Err(Error::UnitMismatch {
                series: series_name.to_string(),
                existing: s.unit.to_string(),
                requested: u.to_string(),
            })
        }
        (Some(s), _) => s.unit,
        (None, u) => u.unwrap_or_default(),
    };
    let series_id = existing
        .as_ref()
        .map(|s| s.id)
        .unwrap_or_else(|| store.alloc_series());
    let version = existing.as_ref().map(|s| s.next_version).unwrap_or(1);
    let cfg = store.config().clone();
    let rewrite = match &opts.rewrite {
        Some(r) => {
            r.validate()?;
            r.clone()
        }
        None => existing
            .as_ref()
            .map(|s| s.rewrite.clone())
            .unwrap_or_default(),
    };

    let mut session = store.begin_session("backup")?;
    let mut pack = PackWriter::for_session(store, &session);

    // Stage 1 and 2 threads. Reading starts first, while the previous
    // version's chunk list is being loaded.
    let cancel = opts.cancel.clone().unwrap_or_default();
    let (block_tx, block_rx) = bounded::<Block>(2);
    let (batch_tx, batch_rx) = bounded::<Batch>(2);
    let (hashed_tx, hashed_rx) = bounded::<Hashed>(2);
    let pool = BufPool::new(8);
    let chunker = Chunker::new(cfg.chunk);
    let max_len = cfg.chunk.max as usize;
    let read_cancel = cancel.clone();
    let read_thread = std::thread::Builder::new()
        .name("revault-read".into())
        .spawn({
            let pool = pool.clone();
            move || read_stage(source, block_tx, pool, max_len, read_cancel)
        })
        .expect("spawn reader");
    let chunk_cancel = cancel.clone();
    let zero_fp_max = Fp::of(&vec![0u8; max_len]);
    // Boundaries are predicted from the series' latest version (see predict),
    // whose chunk list a loader thread reads meanwhile.
    let (loader, old_chunks) = existing
        .as_ref()
        .zip(latest.as_ref())
        .and_then(|(s, v)| Loader::new(&store.meta, s, v, max_len, zero_fp_max))
        .unzip();
    let window = Window::new(old_chunks, chunker.most_chunks(BUF_BYTES));
    let chunk_thread = std::thread::Builder::new()
        .name("revault-chunk".into())
        .spawn(move || {
            chunk_stage(
                block_rx,
                Cutter::new(chunker, window, zero_fp_max),
                batch_tx,
                pool,
                max_len,
                chunk_cancel,
            )
        })
        .expect("spawn chunker");
    let hash_thread = std::thread::Builder::new()
        .name("revault-hash".into())
        .spawn(move || hash_stage(batch_rx, hashed_tx, max_len, zero_fp_max))
        .expect("spawn hasher");

    // Stage 3, here.
    let mut d = Dedup {
        store,
        kind: unit_kind,
        segmenter: Segmenter::new(cfg.segment, cfg.chunk),
        recipe: RecipeBuilder::new(),
        seg: Vec::new(),
        seg_len: 0,
        new_by_fp: FxHashMap::default(),
        resolved: FxHashMap::default(),
        txn: Txn::default(),
        referenced: FxHashSet::default(),
        pinned: Vec::new(),
        logical: 0,
        chunks: 0,
        zero_bytes: 0,
        new_vbytes: 0,
        unique_chunks: 0,
        policy: rewrite.build(
            cfg.container_bytes,
            existing.as_ref().map(|s| s.last).unwrap_or_default(),
        ),
        pending: VecDeque::new(),
        pending_fps: FxHashMap::default(),
        decided: Vec::new(),
        window: RefWindow {
            cap: 8 * cfg.container_bytes,
            bytes: 0,
            refs: VecDeque::new(),
            per: FxHashMap::default(),
        },
        container_bytes: FxHashMap::default(),
        recent_chunks: RecentChunks::new(cfg.container_bytes),
        rewritten_units: 0,
        rewritten_chunks: 0,
        rewritten_bytes: 0,
        predicted_bytes: 0,
    };
    // The units the loader pins are unpinned with the dedup stage's, even if
    // the loader panicked (the list outlives its thread).
    let loader_pins = parking_lot::Mutex::new(Vec::new());
    let (result, hashed, chunked, read) = std::thread::scope(|scope| {
        let loader_thread = loader.map(|l| {
            let pins = &loader_pins;
            std::thread::Builder::new()
                .name("revault-load".into())
                .spawn_scoped(scope, move || l.run(store, pins))
                .expect("spawn loader")
        });
        let result = (|| -> Result<()> {
            for h in hashed_rx.iter() {
                if cancel.load(Ordering::Relaxed) {
                    return Err(Error::Cancelled);
                }
                d.take_batch(&h, &mut pack)?;
                d.predicted_bytes += h.predicted;
                if let Some(p) = &opts.progress {
                    p(d.logical);
                }
            }
            d.finish(&mut pack)
        })();
        drop(hashed_rx);
        let hashed = hash_thread
            .join()
            .map_err(|p| crate::error::panicked("hashing", p));
        let chunked = chunk_thread
            .join()
            .map_err(|p| crate::error::panicked("chunking", p));
        let read = read_thread
            .join()
            .map_err(|p| crate::error::panicked("reading", p));
        // It stops once the chunking thread is gone, if not before.
        let loaded = loader_thread.map_or(Ok(()), |t| {
            t.join().map_err(|p| crate::error::panicked("loading", p))
        });
        (result.and(loaded), hashed, chunked, read)
    });
    d.pinned.append(&mut loader_pins.into_inner());
    if let Err(e) = result {
        store.unpin(d.pinned.iter().copied());
        // A thread that panicked, or else a source error, is the root cause;
        // report it rather than the knock-on (a stage that stopped because
        // another one hung up says Cancelled).
        return Err(match (read, hashed, chunked) {
            (Err(p), _, _) | (_, Err(p), _) | (_, _, Err(p)) => p,
            (Ok(Err(src_err)), _, _) if !matches!(src_err, Error::Cancelled) => src_err,
            _ => e,
        });
    }
    let pinned = std::mem::take(&mut d.pinned);
    let outcome = (|| -> Result<BackupReport> {
        hashed?;
        chunked??;
        let source = read??;
        let catalog_entries = source.finish()?;
        let containers = pack.finish()?;
        session.sync()?;
        store.failpoint("backup.before_commit")?;
        store.pause_point("backup.before_commit");

        let kind = if catalog_entries.is_some() {
            VersionKind::Tree
        } else {
            VersionKind::Stream
        };
        let recipe_parts = std::mem::take(&mut d.recipe).finish();
        let catalog_parts = catalog_entries
            .as_ref()
            .map(|c| catalog::encode(c))
            .unwrap_or_default();
        let time_unix = opts.time_unix.unwrap_or_else(now_unix);
        let recipe_bytes: u64 = recipe_parts.iter().map(|p| p.len() as u64).sum();
        let catalog_bytes: u64 = catalog_parts.iter().map(|p| p.len() as u64).sum();
        let new_container_bytes: u64 = containers.iter().map(|c| c.1.file_bytes).sum();
        let units = d.referenced.len() as u64;
        let new_units = d.txn.new_units.len() as u64;

        let record = VersionRecord {
            number: version,
            time_unix,
            kind,
            form: RecipeForm::Live,
            logical_bytes: d.logical,
            chunks: d.chunks,
            recipe_parts: recipe_parts.len() as u32,
            recipe_bytes,
            catalog_parts: catalog_parts.len() as u32,
            catalog_bytes,
            catalog_entries: catalog_entries
                .as_ref()
                .map(|c| c.len() as u64)
                .unwrap_or(0),
            new_units,
            new_vbytes: d.new_vbytes,
            new_container_bytes,
            zero_bytes: d.zero_bytes,
            backup_secs: started.elapsed().as_secs_f64(),
        };
        let mut txn = std::mem::take(&mut d.txn);
        txn.session = Some(session.id);
        txn.new_containers = containers;
        for (i, p) in recipe_parts.into_iter().enumerate() {
            txn.puts.push((
                CF_RECIPES,
                part_key(series_id, version, i as u32).to_vec(),
                p,
            ));
        }
        for (i, p) in catalog_parts.into_iter().enumerate() {
            txn.puts.push((
                CF_CATALOGS,
                part_key(series_id, version, i as u32).to_vec(),
                p,
            ));
        }
        txn.put_json(CF_VERSIONS, &version_key(series_id, version), &record);
        let name = series_name.to_string();
        let last = crate::rewrite::VersionHint {
            chunks: d.chunks,
            unique_chunks: d.unique_chunks,
            logical_bytes: d.logical,
        };
        let stored_rewrite = rewrite.clone();
        txn.series_updates.push((
            name.clone(),
            Box::new(move |cur| match cur {
                Some(mut s) => {
                    s.next_version = version + 1;
                    s.generation += 1;
                    s.unit = unit_kind;
                    s.rewrite = stored_rewrite;
                    s.last = last;
                    s
                }
                None => SeriesRecord {
                    id: series_id,
                    name,
                    unit: unit_kind,
                    created_unix: now_unix(),
                    next_version: version + 1,
                    retention: Default::default(),
                    generation: 1,
                    deleted_since_gc: false,
                    rewrite: stored_rewrite,
                    last,
                },
            }),
        ));
        txn.totals.logical_bytes = d.logical as i64;
        txn.totals.versions = 1;
        txn.totals.recipe_bytes = recipe_bytes as i64;
        txn.totals.catalog_bytes = catalog_bytes as i64;
        if let Some(hook) = &opts.on_commit {
            txn.puts.extend(hook(version, d.logical)?);
        }
        store.commit(txn)?;
        session.mark_committed();
        Ok(BackupReport {
            series: series_name.to_string(),
            version,
            kind,
            unit: unit_kind,
            time_unix,
            logical_bytes: d.logical,
            chunks: d.chunks,
            units,
            new_units,
            new_vbytes: d.new_vbytes,
            new_container_bytes,
            zero_bytes: d.zero_bytes,
            catalog_entries: record.catalog_entries,
            recipe_bytes,
            catalog_bytes,
            seconds: started.elapsed().as_secs_f64(),
            rewrite: rewrite.name().to_string(),
            rewritten_units: d.rewritten_units,
            rewritten_chunks: d.rewritten_chunks,
            rewritten_bytes: d.rewritten_bytes,
            predicted_bytes: d.predicted_bytes,
            slide: None,
            expire: None,
            retention_error: None,
        })
    })();
    store.unpin(pinned);
    let mut rep = outcome?;
    // The series says so: slide what left the live window, expire what
    // retention no longer keeps. The backup is committed whatever happens
    // here, so a failure is reported beside it, not as the backup's: a
    // client told "no version was created" would retry and store it twice.
    match crate::auto_retention::apply_auto_claimed(store, series_name) {
        Ok(Some((slid, expired))) => {
            rep.slide = Some(slid);
            rep.expire = Some(expired);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(series = series_name, error = %e, "automatic retention after a backup failed; the scheduler retries");
            rep.retention_error = Some(e.to_string());
        }
    }
    Ok(rep)
}

/// Reads the source into blocks of [`BUF_BYTES`], leaving `head` bytes free
/// at the front of each for the uncut end of the block before (see
/// [`chunk_stage`]). Runs on its own thread so that reading (a copy out of
/// the page cache, a third of the chunking thread's time when it read for
/// itself) overlaps the cutting.
fn read_stage(
    mut src: Box<dyn Source>,
    tx: Sender<Block>,
    pool: BufPool,
    head: usize,
    cancel: Arc<AtomicBool>,
) -> Result<Box<dyn Source>> {
    let mut in_piece = false;
    let mut more = true;
    while more {
        let mut data = pool.take().unwrap_or_else(|| vec![0u8; head + BUF_BYTES]);
        let mut end = head;
        let mut piece_ends = Vec::new();
        while end < data.len() {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            if !in_piece {
                if !src.next_piece()? {
                    more = false;
                    break;
                }
                in_piece = true;
            }
            let n = src.read(&mut data[end..])?;
            if n == 0 {
                piece_ends.push(end);
                in_piece = false;
            } else {
                end += n;
            }
        }
        if end > head || !piece_ends.is_empty() {
            let block = Block {
                data,
                end,
                piece_ends,
            };
            // The receiver is gone only when a later stage failed; it reports why.
            tx.send(block).map_err(|_| Error::Cancelled)?;
        }
    }
    Ok(src)
}

/// Cuts each block into chunks and ships it with them. The bytes after a
/// block's last cut (less than a maximum chunk: a chunk that may continue in
/// the next block) are copied into the next block's free front, and its
/// chunks are cut from there.
fn chunk_stage(
    rx: Receiver<Block>,
    mut cutter: Cutter,
    tx: Sender<Batch>,
    pool: BufPool,
    head: usize,
    cancel: Arc<AtomicBool>,
) -> Result<()> {
    // The uncut end of the last block: bytes [from, to) of a shipped buffer.
    let mut carry: Option<(Arc<Lent>, usize, usize)> = None;
    for mut b in rx.iter() {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let mut start = head;
        if let Some((prev, from, to)) = carry.take() {
            start -= to - from;
            b.data[start..head].copy_from_slice(&prev[from..to]);
        }
        let mut cuts = Cuts::default();
        for &e in &b.piece_ends {
            start = cutter.cut_span(&b.data[..e], start, true, &mut cuts);
        }
        start = cutter.cut_span(&b.data[..b.end], start, false, &mut cuts);
        let buf = Arc::new(pool.lend(b.data));
        if start < b.end {
            carry = Some((buf.clone(), start, b.end));
        }
        if !cuts.chunks.is_empty() {
            let batch = Batch {
                buf,
                chunks: cuts.chunks,
                known: cuts.known,
            };
            // The receiver is gone only when the dedup stage failed; it reports why.
            tx.send(batch).map_err(|_| Error::Cancelled)?;
        }
    }
    // Every piece ends with a cut, so nothing is left over, unless reading
    // failed (then the backup reports that and commits nothing).
    Ok(())
}

fn hash_stage(rx: Receiver<Batch>, tx: Sender<Hashed>, max_len: usize, zero_fp_max: Fp) {
    for b in rx.iter() {
        let (fps, zero): (Vec<Fp>, Vec<bool>) = b
            .chunks
            .par_iter()
            .zip(&b.known)
            .with_min_len(16)
            .map(|(&(s, l), k)| match *k {
                Known::Predicted(fp, z, _) | Known::Probed(fp, z, _) => (fp, z),
                Known::No => {
                    fingerprint(&b.buf[s as usize..(s + l) as usize], max_len, &zero_fp_max)
                }
            })
            .unzip();
        let predicted = b
            .chunks
            .iter()
            .zip(&b.known)
            .filter(|(_, k)| matches!(k, Known::Predicted(..)))
            .map(|(c, _)| u64::from(c.1))
            .sum();
        let copies = b.known.iter().map(Known::copy).collect();
        if tx
            .send(Hashed {
                buf: b.buf,
                chunks: b.chunks,
                fps,
                zero,
                copies,
                predicted,
            })
            .is_err()
        {
            return;
        }
    }
}

struct Dedup<'s> {
    store: &'s Store,
    /// Bytes whose chunk boundaries were predicted rather than scanned.
    predicted_bytes: u64,
    kind: DedupUnit,
    segmenter: Segmenter,
    recipe: RecipeBuilder,
    seg: Vec<SegChunk>,
    seg_len: u64,
    /// Units created by this backup, by fingerprint: later repeats dedup to them.
    new_by_fp: FxHashMap<Fp, u64>,
    /// What each fingerprint this backup decided resolved to (a unit it
    /// stored, or the existing copy it referenced): repeats classified while
    /// the first occurrence awaited its decision resolve the same way.
    resolved: FxHashMap<Fp, u64>,
    txn: Txn,
    /// Distinct units this version references (each gets one live reference).
    referenced: FxHashSet<u64>,
    pinned: Vec<u64>,
    logical: u64,
    chunks: u64,
    zero_bytes: u64,
    new_vbytes: u64,
    /// Chunks of units stored as new (not rewritten copies): the next
    /// backup's rewrite budget is sized from this.
    unique_chunks: u64,
    /// Rewrite selection: units wait here, in stream order, for its decisions.
    policy: Box<dyn Policy>,
    pending: VecDeque<Pending>,
    pending_fps: FxHashMap<Fp, u32>,
    decided: Vec<bool>,
    window: RefWindow,
    container_bytes: FxHashMap<ContainerId, u64>,
    /// Chunks this backup stored in its last container's worth of new data.
    recent_chunks: RecentChunks,
    rewritten_units: u64,
    rewritten_chunks: u64,
    rewritten_bytes: u64,
}

/// Where this backup stored the chunks of its most recent `window` bytes of
/// new data. A repeat of one of them is linked instead of stored again: its
/// bytes sit in the container being filled or the one before, which any
/// restore cache still holds. Repeats from farther back are stored again,
/// because a link there would send the restore back to an old container —
/// the very fragmentation segments avoid (measured on the kube series: links
/// at any distance gained 1% dedup and cost 15% speed factor; within one
/// container they gain 0.8% and cost nothing; docs/performance.md).
struct RecentChunks {
    window: u64,
    /// Bytes of new data stored so far.
    at: u64,
    map: FxHashMap<Fp, (u64, u32)>,
    order: VecDeque<(u64, Fp)>,
}

impl RecentChunks {
    fn new(window: u64) -> Self {
        RecentChunks {
            window,
            at: 0,
            map: FxHashMap::default(),
            order: VecDeque::new(),
        }
    }

    fn get(&self, fp: &Fp) -> Option<(u64, u32)> {
        self.map.get(fp).copied()
    }

    fn remember(&mut self, fp: Fp, len: u64, at: (u64, u32)) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.map.entry(fp) {
            e.insert(at);
            self.order.push_back((self.at, fp));
        }
        self.at += len;
        while let Some(&(pos, old)) = self.order.front() {
            if pos + self.window >= self.at {
                break;
            }
            self.order.pop_front();
            self.map.remove(&old);
        }
    }
}

/// A unit waiting for the rewrite policy's decision.
struct Pending {
    fp: Fp,
    chunks: Vec<SegChunk>,
    /// The existing copy it would dedup to.
    found: Option<UnitCopy>,
    /// A zero chunk in chunk mode (never stored).
    zero: bool,
}

/// Which containers the last few MiB of the version referenced: when a
/// duplicate has several copies (rewriting makes them), the copy whose
/// container serves the most of this window is used.
struct RefWindow {
    cap: u64,
    bytes: u64,
    refs: VecDeque<(ContainerId, u64)>,
    per: FxHashMap<ContainerId, u64>,
}

impl RefWindow {
    fn note(&mut self, c: ContainerId, n: u64) {
        self.refs.push_back((c, n));
        *self.per.entry(c).or_default() += n;
        self.bytes += n;
        while self.bytes > self.cap {
            let Some((old, m)) = self.refs.pop_front() else {
                break;
            };
            self.bytes -= m;
            if let Some(x) = self.per.get_mut(&old) {
                *x -= m;
                if *x == 0 {
                    self.per.remove(&old);
                }
            }
        }
    }

    /// Index of the best copy; the newest (first) when none is in the window.
    fn best(&self, cands: &[UnitCopy]) -> usize {
        let mut best = (0, 0u64);
        for (i, u) in cands.iter().enumerate() {
            let n = self.per.get(&u.container).copied().unwrap_or(0);
            if n > best.1 {
                best = (i, n);
            }
        }
        best.0
    }
}

impl Dedup<'_> {
    fn take_batch(&mut self, h: &Hashed, pack: &mut PackWriter) -> Result<()> {
        // Chunk mode looks every chunk up: do it for the whole batch in a few
        // batched reads rather than one read per chunk. Chunks the previous
        // version holds come with its copy, pinned: no lookup.
        let found = match self.kind {
            DedupUnit::Chunk => {
                let mut seen = FxHashSet::default();
                let fps: Vec<Fp> = h
                    .fps
                    .iter()
                    .zip(&h.zero)
                    .zip(&h.copies)
                    .filter(|((fp, zero), copy)| {
                        !**zero
                            && copy.is_none()
                            && !self.new_by_fp.contains_key(*fp)
                            && !self.pending_fps.contains_key(*fp)
                            && seen.insert(**fp)
                    })
                    .map(|((fp, _), _)| *fp)
                    .collect();
                self.store.lookup_pin(self.kind, &fps, &mut self.pinned)?
            }
            DedupUnit::Segment => FxHashMap::default(),
        };
        for (i, &(start, len)) in h.chunks.iter().enumerate() {
            self.logical += u64::from(len);
            self.chunks += 1;
            let c = SegChunk {
                buf: h.buf.clone(),
                start,
                len,
                fp: h.fps[i],
                zero: h.zero[i],
            };
            if c.zero {
                self.zero_bytes += u64::from(len);
            }
            match self.kind {
                DedupUnit::Chunk => {
                    let fp = c.fp;
                    let cands = match &h.copies[i] {
                        Some(copy) => Some(std::slice::from_ref(copy)),
                        None => found.get(&fp).map(Vec::as_slice),
                    };
                    self.unit(fp, vec![c], cands, pack)?;
                }
                DedupUnit::Segment => {
                    if self.segmenter.closes_before(self.seg_len, u64::from(len)) {
                        self.close_segment(pack)?;
                    }
                    self.seg_len += u64::from(len);
                    let fp = c.fp;
                    self.seg.push(c);
                    if self.segmenter.closes_after(self.seg_len, &fp) {
                        self.close_segment(pack)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn close_segment(&mut self, pack: &mut PackWriter) -> Result<()> {
        if self.seg.is_empty() {
            return Ok(());
        }
        let seg = std::mem::take(&mut self.seg);
        self.seg_len = 0;
        let fp = Fp::of_segment(seg.iter().map(|c| &c.fp));
        self.unit(fp, seg, None, pack)
    }

    /// Classifies a unit (new, or a duplicate and where its copy is), hands it
    /// to the rewrite policy, and applies whatever decisions are now final.
    /// `prefetched`: its copies, already pinned, when the batch looked it up
    /// or the previous version held it (chunk mode); otherwise it is looked
    /// up here.
    fn unit(
        &mut self,
        fp: Fp,
        chunks: Vec<SegChunk>,
        prefetched: Option<&[UnitCopy]>,
        pack: &mut PackWriter,
    ) -> Result<()> {
        let bytes: u32 = chunks.iter().map(|c| c.len).sum();
        let n = chunks.len() as u32;
        let zero = self.kind == DedupUnit::Chunk && chunks[0].zero;
        // Repeats inside this backup resolve to the first copy when decided,
        // whether it was stored or found: the rewrite policy never sees them,
        // since they cost a restore no container read (reuse.rs serves a
        // repeated chunk from memory).
        let internal = zero
            || self.new_by_fp.contains_key(&fp)
            || self.resolved.contains_key(&fp)
            || self.pending_fps.contains_key(&fp);
        let (item, found) = if internal {
            (Item::unique(bytes, n), None)
        } else {
            let looked_up;
            let cands = match prefetched {
                Some(c) => c,
                None => {
                    looked_up = self
                        .store
                        .lookup_pin(self.kind, &[fp], &mut self.pinned)?
                        .remove(&fp)
                        .unwrap_or_default();
                    &looked_up
                }
            };
            let hit = (!cands.is_empty()).then(|| cands[self.window.best(cands)]);
            match hit {
                None => (Item::unique(bytes, n), None),
                Some(u) => {
                    let total = match self.container_bytes.get(&u.container) {
                        Some(t) => *t,
                        None => {
                            let t = self
                                .store
                                .meta
                                .container(u.container)?
                                .map(|c| c.vbytes)
                                .unwrap_or(u.vbase);
                            self.container_bytes.insert(u.container, t);
                            t
                        }
                    };
                    (
                        Item::dup(
                            bytes,
                            n,
                            u.container.0,
                            u.vbase,
                            total.saturating_sub(u.vbase),
                        ),
                        Some(u),
                    )
                }
            }
        };
        *self.pending_fps.entry(fp).or_default() += 1;
        self.pending.push_back(Pending {
            fp,
            chunks,
            found,
            zero,
        });
        self.policy.push(item, &mut self.decided);
        self.drain(pack)
    }

    fn drain(&mut self, pack: &mut PackWriter) -> Result<()> {
        for rewrite in std::mem::take(&mut self.decided) {
            let p = self
                .pending
                .pop_front()
                .expect("one pending unit per decision");
            if let Some(c) = self.pending_fps.get_mut(&p.fp) {
                *c -= 1;
                if *c == 0 {
                    self.pending_fps.remove(&p.fp);
                }
            }
            self.apply(p, rewrite, pack)?;
        }
        Ok(())
    }

    fn finish(&mut self, pack: &mut PackWriter) -> Result<()> {
        self.close_segment(pack)?;
        self.policy.finish(&mut self.decided);
        self.drain(pack)?;
        debug_assert!(self.pending.is_empty());
        Ok(())
    }

    fn apply(&mut self, p: Pending, rewrite: bool, pack: &mut PackWriter) -> Result<()> {
        if p.zero {
            self.recipe.push_zero(p.chunks[0].len);
            return Ok(());
        }
        let bytes: u64 = p.chunks.iter().map(|c| u64::from(c.len)).sum();
        let repeat_of = match p.found {
            // Classified as a repeat while the first occurrence awaited its
            // decision: it goes wherever that one went.
            None => self.resolved.get(&p.fp).copied(),
            Some(_) => self.new_by_fp.get(&p.fp).copied(),
        };
        let id = match (repeat_of, p.found) {
            (Some(id), _) => id,
            (None, Some(u)) if !rewrite => {
                self.window.note(u.container, bytes);
                if self.referenced.insert(u.id) {
                    self.txn.ref_delta(u.id, 1, 0);
                }
                self.resolved.insert(p.fp, u.id);
                u.id
            }
            (None, found) => {
                if found.is_some() {
                    self.rewritten_units += 1;
                    self.rewritten_chunks += p.chunks.len() as u64;
                    self.rewritten_bytes += bytes;
                }
                self.store_new(p.fp, &p.chunks, found.is_none(), pack)?
            }
        };
        self.recipe.push_unit(id);
        Ok(())
    }

    /// Stores a unit (new data, or a rewritten copy of a duplicate); the index
    /// then points new backups at this, the newest copy.
    fn store_new(
        &mut self,
        fp: Fp,
        chunks: &[SegChunk],
        unique: bool,
        pack: &mut PackWriter,
    ) -> Result<u64> {
        let id = self.store.alloc_unit();
        // Segment mode: a chunk stored earlier in this unit, or shortly before
        // by this backup in an earlier unit, is linked, not stored again
        // (duplicates inside one version; chunk mode dedups them as units).
        // A link inside the unit costs a restore nothing (same container);
        // they were 4.5 of the 6.8 MiB the kube series' segment-rev store held
        // more than once (`revault stats --repeats`).
        let mut targets = FxHashSet::default();
        let mut in_unit: FxHashMap<Fp, u32> = FxHashMap::default();
        let pc: Vec<PackChunk<'_>> = chunks
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut entry = c.entry();
                if self.kind == DedupUnit::Segment && !c.zero {
                    if let Some(&j) = in_unit.get(&c.fp) {
                        entry.flags |= CHUNK_LINK;
                        entry.link = Some((id, j));
                    } else if let Some((t, j)) = self.recent_chunks.get(&c.fp) {
                        entry.flags |= CHUNK_LINK;
                        entry.link = Some((t, j));
                        targets.insert(t);
                    } else {
                        in_unit.insert(c.fp, k as u32);
                    }
                }
                let data = if entry.stored_len() > 0 {
                    c.data()
                } else {
                    &[][..]
                };
                PackChunk { data, entry }
            })
            .collect();
        for t in targets {
            self.txn.link_delta(t, 1);
        }
        if self.kind == DedupUnit::Segment {
            for (i, c) in pc.iter().enumerate() {
                if c.entry.stored_len() > 0 {
                    self.recent_chunks
                        .remember(c.entry.fp, c.entry.stored_len(), (id, i as u32));
                }
            }
        }
        let (container, vbase) = pack.add_unit(id, &pc)?;
        self.window
            .note(container, chunks.iter().map(|c| u64::from(c.len)).sum());
        let unit = UnitRecord {
            kind: self.kind,
            fp,
            container,
            vbase,
            trimmed: false,
            chunks: pc.into_iter().map(|c| c.entry).collect(),
        };
        self.new_vbytes += unit.stored_vbytes();
        if unique {
            self.unique_chunks += unit.chunks.len() as u64;
        }
        self.new_by_fp.insert(fp, id);
        self.resolved.insert(fp, id);
        self.txn.index_puts.push(((self.kind, fp), id));
        self.txn.new_units.push((
            id,
            unit,
            Refs {
                live: 1,
                arch: 0,
                links: 0,
            },
        ));
        self.referenced.insert(id);
        Ok(id)
    }
}
