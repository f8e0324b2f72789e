//! The dedup stage: chunks are grouped into segments (or taken one by one in chunk mode),
//! looked up in the fingerprint index, and either referenced where they are stored or
//! packed into new containers — with rewrite selection deciding which duplicates to store
//! again to keep the version's restore fast (capping, CBR, FCRC, LBW in `rewrite`).

use crate::ingest::stages::Hashed;
use crate::ingest::Target;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::sync::Arc;

use crate::bufpool::Lent;
use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::container::{ChunkEntry, ContainerId, CHUNK_LINK, CHUNK_ZERO};
use crate::format::fp::Fp;
use crate::format::recipe::RecipeBuilder;
use crate::format::refcounts::Refs;
use crate::format::unit::UnitRecord;
use crate::ingest::chunker::Segmenter;
use crate::ingest::rewrite::{Item, Policy};
use crate::meta::MetaRead;
use crate::store::commit::Txn;
use crate::store::domain::DedupScope;
use crate::store::pack::{PackChunk, PackWriter};
use crate::store::{Store, UnitCopy};
/// A chunk waiting in the current segment.
pub(super) struct SegChunk {
    pub(super) buf: Arc<Lent>,
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) fp: Fp,
    pub(super) zero: bool,
}

impl SegChunk {
    pub(super) fn data(&self) -> &[u8] {
        &self.buf[self.start as usize..(self.start + self.len) as usize]
    }

    pub(super) fn entry(&self) -> ChunkEntry {
        ChunkEntry::new(if self.zero { CHUNK_ZERO } else { 0 }, self.len, self.fp)
    }
}

pub(super) struct Dedup<'s> {
    pub(super) store: &'s Store,
    /// What this backup may deduplicate against, and the tag of the units it writes.
    pub(super) scope: DedupScope,
    /// Bytes whose chunk boundaries were predicted rather than scanned.
    pub(super) predicted_bytes: u64,
    pub(super) kind: DedupUnit,
    pub(super) segmenter: Segmenter,
    pub(super) recipe: RecipeBuilder,
    pub(super) seg: Vec<SegChunk>,
    pub(super) seg_len: u64,
    /// Units created by this backup, by fingerprint: later repeats dedup to them.
    pub(super) new_by_fp: FxHashMap<Fp, u64>,
    /// What each fingerprint this backup decided resolved to (a unit it
    /// stored, or the existing copy it referenced): repeats classified while
    /// the first occurrence awaited its decision resolve the same way.
    pub(super) resolved: FxHashMap<Fp, u64>,
    pub(super) txn: Txn,
    /// Distinct units this version references (each gets one live reference).
    pub(super) referenced: FxHashSet<u64>,
    pub(super) pinned: Vec<u64>,
    pub(super) logical: u64,
    pub(super) chunks: u64,
    pub(super) zero_bytes: u64,
    pub(super) new_vbytes: u64,
    /// Chunks of units stored as new (not rewritten copies): the next
    /// backup's rewrite budget is sized from this.
    pub(super) unique_chunks: u64,
    /// Rewrite selection: units wait here, in stream order, for its decisions.
    pub(super) policy: Box<dyn Policy>,
    pub(super) pending: VecDeque<Pending>,
    pub(super) pending_fps: FxHashMap<Fp, u32>,
    pub(super) decided: Vec<bool>,
    pub(super) window: RefWindow,
    pub(super) container_bytes: FxHashMap<ContainerId, u64>,
    /// Chunks this backup stored in its last container's worth of new data.
    pub(super) recent_chunks: RecentChunks,
    pub(super) rewritten_units: u64,
    pub(super) rewritten_chunks: u64,
    pub(super) rewritten_bytes: u64,
}

/// Where this backup stored the chunks of its most recent `window` bytes of
/// new data. A repeat of one of them is linked instead of stored again: its
/// bytes sit in the container being filled or the one before, which any
/// restore cache still holds. Repeats from farther back are stored again,
/// because a link there would send the restore back to an old container —
/// the very fragmentation segments avoid (measured on the kube series: links
/// at any distance gained 1% dedup and cost 15% speed factor; within one
/// container they gain 0.8% and cost nothing; docs/performance.md).
pub(super) struct RecentChunks {
    pub(super) window: u64,
    /// Bytes of new data stored so far.
    pub(super) at: u64,
    pub(super) map: FxHashMap<Fp, (u64, u32)>,
    pub(super) order: VecDeque<(u64, Fp)>,
}

impl RecentChunks {
    pub(super) fn new(window: u64) -> Self {
        RecentChunks {
            window,
            at: 0,
            map: FxHashMap::default(),
            order: VecDeque::new(),
        }
    }

    pub(super) fn get(&self, fp: &Fp) -> Option<(u64, u32)> {
        self.map.get(fp).copied()
    }

    pub(super) fn remember(&mut self, fp: Fp, len: u64, at: (u64, u32)) {
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
pub(super) struct Pending {
    pub(super) fp: Fp,
    pub(super) chunks: Vec<SegChunk>,
    /// The existing copy it would dedup to.
    pub(super) found: Option<UnitCopy>,
    /// A zero chunk in chunk mode (never stored).
    pub(super) zero: bool,
}

/// Which containers the last few MiB of the version referenced: when a
/// duplicate has several copies (rewriting makes them), the copy whose
/// container serves the most of this window is used.
pub(super) struct RefWindow {
    pub(super) cap: u64,
    pub(super) bytes: u64,
    pub(super) refs: VecDeque<(ContainerId, u64)>,
    pub(super) per: FxHashMap<ContainerId, u64>,
}

impl RefWindow {
    pub(super) fn note(&mut self, c: ContainerId, n: u64) {
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
    pub(super) fn best(&self, cands: &[UnitCopy]) -> usize {
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

impl<'s> Dedup<'s> {
    /// The dedup stage of a backup of `target`.
    pub(super) fn new(store: &'s Store, target: &Target) -> Self {
        let cfg = store.config();
        let (unit_kind, rewrite, existing) = (target.unit, &target.rewrite, &target.existing);
        Dedup {
            store,
            scope: target.scope.clone(),
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
        }
    }
}

impl Dedup<'_> {
    pub(super) fn take_batch(&mut self, h: &Hashed, pack: &mut PackWriter) -> Result<()> {
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
                self.store
                    .lookup_pin(self.kind, &fps, &self.scope, &mut self.pinned)?
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

    pub(super) fn close_segment(&mut self, pack: &mut PackWriter) -> Result<()> {
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
    pub(super) fn unit(
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
                        .lookup_pin(self.kind, &[fp], &self.scope, &mut self.pinned)?
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

    pub(super) fn drain(&mut self, pack: &mut PackWriter) -> Result<()> {
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

    pub(super) fn finish(&mut self, pack: &mut PackWriter) -> Result<()> {
        self.close_segment(pack)?;
        self.policy.finish(&mut self.decided);
        self.drain(pack)?;
        debug_assert!(self.pending.is_empty());
        Ok(())
    }

    pub(super) fn apply(&mut self, p: Pending, rewrite: bool, pack: &mut PackWriter) -> Result<()> {
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
    pub(super) fn store_new(
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
            domain: self.scope.tag(),
            chunks: pc.into_iter().map(|c| c.entry).collect(),
        };
        self.new_vbytes += unit.stored_vbytes();
        if unique {
            self.unique_chunks += unit.chunks.len() as u64;
        }
        self.new_by_fp.insert(fp, id);
        self.resolved.insert(fp, id);
        self.txn.index_puts.push(((self.kind, unit.index_fp()), id));
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
