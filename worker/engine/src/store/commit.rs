//! The one place metadata changes: a [`Txn`] describes everything an
//! operation changes, and [`Store::commit`] applies it atomically under the
//! commit lock — reference-count deltas, new and moved units, containers,
//! index copies, recipes, versions, series and store totals — in one synced
//! RocksDB batch. Units whose counts reach zero are freed with their index
//! entries; containers left with no units are deleted, and their files are
//! unlinked only after the batch is durable and no reader still needs them.

use rustc_hash::{FxHashMap, FxHashSet};

use serde::Serialize;

use crate::config::DedupUnit;
use crate::error::{corrupt_meta, Result};
use crate::format::container::ContainerId;
use crate::format::fp::Fp;
use crate::format::keys::{
    freed_key, part_key, zombie_key, CF_CONTAINERS, CF_MARKS, CF_RECIPES, CF_SESSIONS, CF_UNITS,
};
use crate::format::records::{ContainerRecord, SeriesRecord, Totals};
use crate::format::refcounts::{Refs, RefsBlock, REFS_BLOCK};
use crate::format::unit::UnitRecord;
use crate::index::full::{self, FullIndex};
use crate::index::FingerprintIndex;
use crate::meta::{Batch, Meta, MetaRead};
use crate::store::{PinState, Store};

/// Everything one commit changes.
#[derive(Default)]
pub(crate) struct Txn {
    pub session: Option<u64>,
    pub new_units: Vec<(u64, UnitRecord, Refs)>,
    /// Units moved or trimmed (same id, new location or fewer chunks).
    pub unit_updates: Vec<(u64, UnitRecord)>,
    /// (live, archival, links) reference deltas by unit id.
    pub ref_deltas: FxHashMap<u64, [i64; 3]>,
    pub new_containers: Vec<(ContainerId, ContainerRecord)>,
    /// New copies, by the fingerprint they are indexed under (`UnitRecord::index_fp`).
    pub index_puts: Vec<((DedupUnit, Fp), u64)>,
    pub puts: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    pub deletes: Vec<(&'static str, Vec<u8>)>,
    pub delete_ranges: Vec<(&'static str, Vec<u8>, Vec<u8>)>,
    pub totals: TotalsDelta,
    /// Applied to series records as they are at commit time.
    pub series_updates: Vec<(String, SeriesUpdate)>,
    /// Units to free if they are still unreferenced (gc's sweep).
    pub free_units: Vec<u64>,
}

pub(crate) type SeriesUpdate = Box<dyn FnOnce(Option<SeriesRecord>) -> SeriesRecord + Send>;

impl Txn {
    pub fn ref_delta(&mut self, unit: u64, live: i64, arch: i64) {
        let e = self.ref_deltas.entry(unit).or_default();
        e[0] += live;
        e[1] += arch;
    }

    /// A unit of this commit links to (or stops linking to) `unit`'s chunks.
    pub fn link_delta(&mut self, unit: u64, d: i64) {
        self.ref_deltas.entry(unit).or_default()[2] += d;
    }

    /// Stages `parts` as the whole recipe of `version`: its old parts go as one range (a
    /// shorter recipe leaves no stale tail), then the new ones are put. Returns (parts, bytes).
    pub fn replace_recipe_parts(
        &mut self,
        series: u32,
        version: u32,
        parts: Vec<Vec<u8>>,
    ) -> (u32, u64) {
        let n = parts.len() as u32;
        let bytes = parts.iter().map(|p| p.len() as u64).sum();
        self.delete_ranges.push((
            CF_RECIPES,
            part_key(series, version, 0).to_vec(),
            part_key(series, version, u32::MAX).to_vec(),
        ));
        for (i, part) in parts.into_iter().enumerate() {
            self.puts.push((
                CF_RECIPES,
                part_key(series, version, i as u32).to_vec(),
                part,
            ));
        }
        (n, bytes)
    }

    pub fn put_json<T: Serialize>(&mut self, cf: &'static str, key: &[u8], v: &T) {
        self.puts.push((
            cf,
            key.to_vec(),
            serde_json::to_vec(v).expect("records serialise"),
        ));
    }
}

#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct TotalsDelta {
    pub logical_bytes: i64,
    pub versions: i64,
    pub recipe_bytes: i64,
    pub catalog_bytes: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CommitOutcome {
    pub freed_units: u64,
    pub freed_containers: u64,
    pub freed_bytes: u64,
}

/// The reference counts a commit reads and changes, in their stored blocks
/// ([`RefsBlock`]): each block is read once and written once, however many
/// of its units the commit touches.
#[derive(Default)]
struct RefsTable {
    blocks: FxHashMap<u64, RefsBlock>,
    changed: FxHashSet<u64>,
}

impl RefsTable {
    /// Reads the blocks of `ids` not read yet, in one batched read.
    fn load(&mut self, meta: &Meta, ids: impl IntoIterator<Item = u64>) -> Result<()> {
        let mut want: Vec<u64> = ids
            .into_iter()
            .map(|id| id / REFS_BLOCK)
            .filter(|b| !self.blocks.contains_key(b))
            .collect();
        want.sort_unstable();
        want.dedup();
        if want.is_empty() {
            return Ok(());
        }
        for (b, r) in want.iter().zip(meta.refs_blocks(&want)?) {
            self.blocks.insert(*b, r.unwrap_or_default());
        }
        Ok(())
    }

    fn get(&mut self, meta: &Meta, id: u64) -> Result<Refs> {
        self.load(meta, [id])?;
        Ok(self.blocks[&(id / REFS_BLOCK)].get(id))
    }

    fn set(&mut self, meta: &Meta, id: u64, r: Refs) -> Result<()> {
        self.load(meta, [id])?;
        let b = id / REFS_BLOCK;
        self.blocks.get_mut(&b).expect("just loaded").set(id, r);
        self.changed.insert(b);
        Ok(())
    }

    /// Puts every changed block, in key order (RocksDB inserts sorted keys
    /// into its memtable much faster).
    fn write(&self, b: &mut Batch<'_>) {
        let mut changed: Vec<u64> = self.changed.iter().copied().collect();
        changed.sort_unstable();
        for block in changed {
            b.put_refs_block(block, &self.blocks[&block]);
        }
    }
}

/// Working state of a commit: container records, store totals, index copy
/// lists and reference counts touched so far, loaded on first use.
struct Ledger<'m> {
    meta: &'m Meta,
    containers: FxHashMap<ContainerId, ContainerRecord>,
    new_containers: FxHashSet<ContainerId>,
    totals: Totals,
    index: FxHashMap<(DedupUnit, Fp), Vec<u64>>,
    refs: RefsTable,
}

impl<'m> Ledger<'m> {
    fn container(&mut self, id: ContainerId) -> Result<&mut ContainerRecord> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.containers.entry(id) {
            let rec = self
                .meta
                .container(id)?
                .ok_or_else(|| corrupt_meta(format!("container {id}"), "no container record"))?;
            e.insert(rec);
        }
        Ok(self.containers.get_mut(&id).expect("just loaded"))
    }

    /// The copies of a fingerprint, newest first.
    fn copies(&mut self, kind: DedupUnit, fp: &Fp) -> Result<&mut Vec<u64>> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.index.entry((kind, *fp)) {
            e.insert(FullIndex(self.meta).copies(kind, fp)?);
        }
        Ok(self.index.get_mut(&(kind, *fp)).expect("just loaded"))
    }

    /// Deletes a unit: its records, its index copy, its bytes in its container.
    fn free_unit(&mut self, b: &mut Batch<'_>, id: u64, unit: &UnitRecord) -> Result<()> {
        b.delete(CF_UNITS, &id.to_be_bytes());
        self.refs.set(self.meta, id, Refs::default())?;
        self.copies(unit.kind, &unit.index_fp())?
            .retain(|c| *c != id);
        let c = self.container(unit.container)?;
        c.live_vbytes -= unit.stored_vbytes();
        c.live_units -= 1;
        self.totals.units -= 1;
        self.totals.unit_vbytes -= unit.stored_vbytes();
        Ok(())
    }
}

/// Whether `new` lacks a chunk `old` holds (a trim, not a move).
fn drops_chunks(old: &UnitRecord, new: &UnitRecord) -> bool {
    let absent = |u: &UnitRecord| {
        u.chunks
            .iter()
            .filter(|c| c.flags & crate::format::container::CHUNK_ABSENT != 0)
            .count()
    };
    absent(new) > absent(old) || (new.trimmed && !old.trimmed)
}

fn apply(v: u64, d: i64) -> u64 {
    (v as i64 + d).max(0) as u64
}

impl Store {
    /// Applies `txn` atomically: every change is staged into one batch under the commit
    /// lock, the batch is written and synced, and only then do the files of containers left
    /// empty go.
    pub(crate) fn commit(&self, mut txn: Txn) -> Result<CommitOutcome> {
        self.require_writable()?;
        self.pause_point("commit.enter");
        self.failpoint("commit.before_write")?;
        let _g = self.commit_lock.lock();
        let meta = &self.meta;
        let mut b = meta.batch();
        let mut l = Ledger::open(meta, &txn)?;
        let mut units = Units::of(&txn.new_units, &txn.free_units);
        l.add_new(&mut b, &txn.new_containers, &txn.new_units)?;
        l.update_units(&mut b, &txn.unit_updates, &mut units, &mut txn.ref_deltas)?;
        let mut counts = l.apply_deltas(&txn.ref_deltas)?;
        l.refuse_lossy_trims(&units.trims, &counts)?;
        let work = l.free_candidates(&mut b, &counts, &units)?;
        // Held until the batch is written (see the drop below).
        let pin_state = self.pins.lock();
        l.free_unreferenced(&mut b, &pin_state, &units, &mut counts, work)?;
        l.store_counts(&mut b, &counts)?;
        let unlinked_containers = counts.unlinked_containers(meta, &units)?;
        l.stage_index(&mut b, &txn.index_puts)?;
        let dead_files = l.stage_containers(&mut b);
        stage_records(meta, &mut b, &mut txn)?;
        flag_unlinked(&mut b, &unlinked_containers, &dead_files);
        l.stage_totals(&mut b, &txn.totals);
        b.put_counters(&self.counters().max(meta.counters()?));
        self.write_durably(b, txn.session)?;
        // Held from the pin check to here: a backup that pinned a unit after
        // the check must, when it then reads the unit, see it gone. Released
        // before the write, a backup could pin and read a unit this batch was
        // about to delete, and reference it (tests/concurrent.rs).
        drop(pin_state);
        // Still under the commit lock, so commits reach the sampled index in order; after
        // the pin lock, so no pin waits for the index (its hints are checked anyway).
        if let Some(sampled) = &self.sampled {
            sampled.lock().committed(&l.index);
        }

        // Durable: now the files can go, once no reader that started before
        // this commit can still need them.
        self.failpoint("commit.before_unlink")?;
        for id in self.files_freed(&dead_files) {
            self.remove_container_file(id);
        }
        Ok(l.outcome(counts.freed_units, &dead_files))
    }

    /// Last step: the session's record goes with the batch, written and synced as one; its
    /// files are settled by whoever sees whether it went.
    fn write_durably(&self, mut b: Batch<'_>, session: Option<u64>) -> Result<()> {
        if let Some(s) = session {
            b.delete(CF_SESSIONS, &s.to_be_bytes());
        }
        if let Err(e) = self.meta.write(b, true) {
            // A failed sync may still leave the batch in the log, to replay
            // at the next open: the session's files must not go before that
            // open sees whether the session record went with the commit.
            if let Some(s) = session {
                self.commit_write_failed(s);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// The units a commit names: those it writes (new, moved or trimmed) and those gc's sweep
/// asks it to free.
struct Units<'t> {
    new: FxHashMap<u64, &'t UnitRecord>,
    /// Moved or trimmed units, as this commit writes them.
    updated: FxHashMap<u64, UnitRecord>,
    /// Updated units that lose chunks (trims, not moves).
    trims: Vec<u64>,
    /// Units to free if they are still unreferenced (gc's sweep).
    gc_candidates: &'t [u64],
}

impl<'t> Units<'t> {
    fn of(new_units: &'t [(u64, UnitRecord, Refs)], gc_candidates: &'t [u64]) -> Self {
        Units {
            new: new_units.iter().map(|(id, u, _)| (*id, u)).collect(),
            updated: FxHashMap::default(),
            trims: Vec::new(),
            gc_candidates,
        }
    }

    /// The record this commit writes for `id`, if any (an update over a new unit).
    fn written(&self, id: u64) -> Option<&UnitRecord> {
        match (self.updated.get(&id), self.new.get(&id)) {
            (Some(u), _) => Some(u),
            (None, Some(u)) => Some(*u),
            (None, None) => None,
        }
    }
}

/// The reference counts a commit leaves, and what reaching zero did.
#[derive(Default)]
struct Counts {
    /// New counts of every unit whose counts change, by id.
    now: FxHashMap<u64, Refs>,
    /// Units whose last incoming link this commit drops.
    unlinked: Vec<u64>,
    freed: FxHashSet<u64>,
    freed_units: u64,
}

impl Counts {
    /// A step: gc keeps a unit that others link into whole (gc::trim_to); once the last
    /// link is gone, its container is flagged for the next sweep, so an incremental gc
    /// trims it, not only a full one.
    fn unlinked_containers(&mut self, meta: &Meta, units: &Units<'_>) -> Result<Vec<ContainerId>> {
        self.unlinked
            .retain(|id| !self.freed.contains(id) && !self.now[id].is_zero());
        let mut unlinked_containers = Vec::new();
        for id in &self.unlinked {
            unlinked_containers.push(match units.written(*id) {
                Some(u) => u.container,
                None => match meta.unit(*id)? {
                    Some(u) => u.container,
                    None => continue,
                },
            });
        }
        Ok(unlinked_containers)
    }
}

/// The steps of [`Store::commit`], in order: each reads what it needs on first use and
/// stages its writes into the commit's one batch.
impl<'m> Ledger<'m> {
    /// First step: the store totals, and one batched read for the count blocks of every
    /// unit touched (a backup touches one per distinct chunk or segment it references).
    fn open(meta: &'m Meta, txn: &Txn) -> Result<Self> {
        let mut l = Ledger {
            meta,
            containers: FxHashMap::default(),
            new_containers: txn.new_containers.iter().map(|c| c.0).collect(),
            totals: meta.totals()?,
            index: FxHashMap::default(),
            refs: RefsTable::default(),
        };
        l.refs.load(
            meta,
            txn.new_units
                .iter()
                .map(|u| u.0)
                .chain(txn.ref_deltas.keys().copied()),
        )?;
        Ok(l)
    }

    /// A step: new containers and units enter the totals; new units are written with
    /// their counts.
    fn add_new(
        &mut self,
        b: &mut Batch<'_>,
        new_containers: &[(ContainerId, ContainerRecord)],
        new_units: &[(u64, UnitRecord, Refs)],
    ) -> Result<()> {
        for (id, rec) in new_containers {
            self.totals.containers += 1;
            self.totals.container_bytes += rec.file_bytes;
            self.totals.container_vbytes += rec.vbytes;
            self.containers.insert(*id, rec.clone());
        }
        for (id, unit, refs) in new_units {
            b.put_unit(*id, unit);
            self.refs.set(self.meta, *id, *refs)?;
            self.totals.units += 1;
            self.totals.unit_vbytes += unit.stored_vbytes();
        }
        Ok(())
    }

    /// A step: moved or trimmed units: the old copy's container loses them. New
    /// containers already count what was packed into them.
    fn update_units(
        &mut self,
        b: &mut Batch<'_>,
        updates: &[(u64, UnitRecord)],
        units: &mut Units<'_>,
        ref_deltas: &mut FxHashMap<u64, [i64; 3]>,
    ) -> Result<()> {
        for (id, new) in updates {
            let old = self
                .meta
                .unit(*id)?
                .ok_or_else(|| corrupt_meta(format!("unit {id}"), "updated unit does not exist"))?;
            if drops_chunks(&old, new) {
                units.trims.push(*id);
            }
            let c = self.container(old.container)?;
            c.live_vbytes -= old.stored_vbytes();
            c.live_units -= 1;
            if !self.new_containers.contains(&new.container) {
                let c = self.container(new.container)?;
                c.live_vbytes += new.stored_vbytes();
                c.live_units += 1;
            }
            self.totals.unit_vbytes =
                self.totals.unit_vbytes - old.stored_vbytes() + new.stored_vbytes();
            if new.trimmed && !old.trimmed {
                // An incomplete unit is no longer a copy new data can use.
                self.copies(old.kind, &old.index_fp())?.retain(|c| c != id);
            }
            // Links a move keeps cost nothing; links a trim drops release their targets.
            let (before, after) = (old.link_targets(*id), new.link_targets(*id));
            for t in before.difference(&after) {
                ref_deltas.entry(*t).or_default()[2] -= 1;
            }
            for t in after.difference(&before) {
                ref_deltas.entry(*t).or_default()[2] += 1;
            }
            b.put_unit(*id, new);
            units.updated.insert(*id, new.clone());
        }
        Ok(())
    }

    /// A step: the reference deltas, applied in unit order; a count that would go
    /// negative is corrupt metadata, and nothing is written.
    fn apply_deltas(&mut self, ref_deltas: &FxHashMap<u64, [i64; 3]>) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut ids: Vec<_> = ref_deltas.iter().collect();
        ids.sort_unstable_by_key(|(id, _)| **id);
        for (&id, d) in ids {
            // New units' counts are in the table already (set above).
            let cur = self.refs.get(self.meta, id)?;
            let v = [
                i64::from(cur.live) + d[0],
                i64::from(cur.arch) + d[1],
                i64::from(cur.links) + d[2],
            ];
            if v.iter().any(|x| *x < 0) {
                return Err(corrupt_meta(
                    format!("unit {id}"),
                    format!(
                        "reference counts would go negative ({} live, {} archival, {} links)",
                        v[0], v[1], v[2]
                    ),
                ));
            }
            if d[2] < 0 && v[2] == 0 {
                counts.unlinked.push(id);
            }
            counts.now.insert(
                id,
                Refs {
                    live: v[0] as u32,
                    arch: v[1] as u32,
                    links: v[2] as u32,
                },
            );
        }
        Ok(counts)
    }

    /// A step, a guard: a live recipe references whole units, so trimming a unit one
    /// references loses data. Slides and gc doom what they trim and read its counts again,
    /// so this never fires; if it does, nothing is written.
    fn refuse_lossy_trims(&mut self, trims: &[u64], counts: &Counts) -> Result<()> {
        for &id in trims {
            let live = match counts.now.get(&id) {
                Some(r) => r.live,
                None => self.refs.get(self.meta, id)?.live,
            };
            if live > 0 {
                return Err(crate::error::Error::Internal(format!(
                    "refusing to commit: unit {id} would lose chunks while {live} live version(s) \
                     reference it whole; nothing was changed"
                )));
            }
        }
        Ok(())
    }

    /// A step: the units left unreferenced, to free (in `free_unreferenced`, under the pin
    /// lock); gc's candidates referenced again since it found them lose their zombie mark.
    fn free_candidates(
        &mut self,
        b: &mut Batch<'_>,
        counts: &Counts,
        units: &Units<'_>,
    ) -> Result<Vec<u64>> {
        let mut work: Vec<u64> = counts
            .now
            .iter()
            .filter(|(_, r)| r.is_zero())
            .map(|(id, _)| *id)
            .collect();
        for &id in units.gc_candidates {
            let r = match counts.now.get(&id) {
                Some(r) => *r,
                None => self.refs.get(self.meta, id)?,
            };
            if !r.is_zero() {
                // Referenced again since it was found unreferenced.
                b.delete(CF_MARKS, &zombie_key(id));
            } else if !counts.now.contains_key(&id) {
                work.push(id);
            }
        }
        work.sort_unstable();
        Ok(work)
    }

    /// A step: unreferenced units are freed unless a backup in flight pinned them (then gc
    /// frees them later). Freeing a unit releases the units its links point into, which
    /// may free them too.
    fn free_unreferenced(
        &mut self,
        b: &mut Batch<'_>,
        pin_state: &PinState,
        units: &Units<'_>,
        counts: &mut Counts,
        mut work: Vec<u64>,
    ) -> Result<()> {
        while let Some(id) = work.pop() {
            if counts.freed.contains(&id) {
                continue;
            }
            if pin_state.pins.contains_key(&id) {
                // A backup in flight may reference it: a later gc frees it
                // (recorded, so a restart does not forget it).
                b.put(CF_MARKS, &zombie_key(id), b"");
                continue;
            }
            let unit = match units.written(id) {
                Some(u) => u.clone(),
                None => match self.meta.unit(id)? {
                    Some(u) => u,
                    // A gc candidate already gone: nothing to free.
                    None if units.gc_candidates.contains(&id) => continue,
                    None => {
                        return Err(corrupt_meta(
                            format!("unit {id}"),
                            "referenced unit does not exist",
                        ))
                    }
                },
            };
            self.free_unit(b, id, &unit)?;
            b.delete(CF_MARKS, &zombie_key(id));
            counts.freed.insert(id);
            counts.freed_units += 1;
            for t in unit.link_targets(id) {
                let r = match counts.now.get_mut(&t) {
                    Some(r) => r,
                    None => {
                        let r = self.refs.get(self.meta, t)?;
                        counts.now.entry(t).or_insert(r)
                    }
                };
                r.links = r.links.checked_sub(1).ok_or_else(|| {
                    corrupt_meta(format!("unit {t}"), "a link was released twice")
                })?;
                if r.links == 0 {
                    counts.unlinked.push(t);
                }
                if r.is_zero() {
                    work.push(t);
                }
            }
        }
        Ok(())
    }

    /// A step: the new counts of the units that stay, written block by block.
    fn store_counts(&mut self, b: &mut Batch<'_>, counts: &Counts) -> Result<()> {
        for (id, r) in counts
            .now
            .iter()
            .filter(|(id, _)| !counts.freed.contains(id))
        {
            self.refs.set(self.meta, *id, *r)?;
        }
        self.refs.write(b);
        Ok(())
    }

    /// A step: new copies go first in their fingerprint's list; every list touched is
    /// written.
    fn stage_index(
        &mut self,
        b: &mut Batch<'_>,
        index_puts: &[((DedupUnit, Fp), u64)],
    ) -> Result<()> {
        for ((kind, fp), v) in index_puts {
            full::add_copy(self.copies(*kind, fp)?, *v);
        }
        for ((kind, fp), list) in &self.index {
            full::stage(b, *kind, fp, list);
        }
        Ok(())
    }

    /// A step: containers: write changed records, delete empty ones (returned: their files
    /// go after the write). A container that lost units may hold dead data: flag it for
    /// gc's sweep.
    fn stage_containers(&mut self, b: &mut Batch<'_>) -> Vec<ContainerId> {
        let mut dead_files = Vec::new();
        for (id, rec) in &self.containers {
            let sweep_key = crate::format::keys::sweep_key(*id);
            if rec.live_units == 0 {
                b.delete(CF_MARKS, &sweep_key);
                b.delete(CF_CONTAINERS, &id.0.to_be_bytes());
                // The proof gc needs to delete the file if a crash comes
                // before the unlink below (crate::store::orphans).
                b.put(CF_MARKS, &freed_key(*id), b"");
                self.totals.containers -= 1;
                self.totals.container_bytes -= rec.file_bytes;
                self.totals.container_vbytes -= rec.vbytes;
                dead_files.push(*id);
            } else {
                if !self.new_containers.contains(id) {
                    b.put(CF_MARKS, &sweep_key, b"");
                }
                b.put_container(*id, rec);
            }
        }
        dead_files
    }

    /// A step: the store totals, with the transaction's own deltas.
    fn stage_totals(&mut self, b: &mut Batch<'_>, delta: &TotalsDelta) {
        let t = &mut self.totals;
        t.logical_bytes = apply(t.logical_bytes, delta.logical_bytes);
        t.versions = apply(t.versions, delta.versions);
        t.recipe_bytes = apply(t.recipe_bytes, delta.recipe_bytes);
        t.catalog_bytes = apply(t.catalog_bytes, delta.catalog_bytes);
        b.put_totals(t);
    }

    /// What the commit freed, for its caller.
    fn outcome(&self, freed_units: u64, dead_files: &[ContainerId]) -> CommitOutcome {
        CommitOutcome {
            freed_units,
            freed_containers: dead_files.len() as u64,
            freed_bytes: dead_files
                .iter()
                .map(|id| self.containers[id].file_bytes)
                .sum(),
        }
    }
}

/// A step: the transaction's own records: series records (updated as they are at commit
/// time), then its deletions, then its puts.
fn stage_records(meta: &Meta, b: &mut Batch<'_>, txn: &mut Txn) -> Result<()> {
    for (name, update) in std::mem::take(&mut txn.series_updates) {
        let cur = meta.series(&name)?;
        b.put_series(&update(cur));
    }
    // Deletions first: a replaced recipe deletes its old parts and puts new
    // ones under the same keys, and batch operations apply in order.
    for (cf, from, to) in &txn.delete_ranges {
        b.delete_prefix_range(cf, from, to);
    }
    for (cf, k) in &txn.deletes {
        b.delete(cf, k);
    }
    for (cf, k, v) in &txn.puts {
        b.put(cf, k, v);
    }
    Ok(())
}

/// A step: flags for the next sweep the containers holding a unit that lost its last
/// incoming link ([`Counts::unlinked_containers`]). Written after the transaction's own
/// deletes: gc deletes the flags of the containers it swept, which may hold such a unit.
/// Even a container this commit writes is flagged: gc may have moved the unit whole.
fn flag_unlinked(
    b: &mut Batch<'_>,
    unlinked_containers: &[ContainerId],
    dead_files: &[ContainerId],
) {
    for c in unlinked_containers
        .iter()
        .filter(|c| !dead_files.contains(*c))
    {
        b.put(CF_MARKS, &crate::format::keys::sweep_key(*c), b"");
    }
}
