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
use crate::format::keys::{freed_key, zombie_key, CF_CONTAINERS, CF_MARKS, CF_SESSIONS, CF_UNITS};
use crate::format::records::{ContainerRecord, SeriesRecord, Totals};
use crate::format::refcounts::{Refs, RefsBlock, REFS_BLOCK};
use crate::format::unit::UnitRecord;
use crate::index::full::{self, FullIndex};
use crate::index::FingerprintIndex;
use crate::meta::{Batch, Meta, MetaRead};
use crate::store::Store;

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
        self.copies(unit.kind, &unit.fp)?.retain(|c| *c != id);
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
    pub(crate) fn commit(&self, mut txn: Txn) -> Result<CommitOutcome> {
        self.require_writable()?;
        self.pause_point("commit.enter");
        self.failpoint("commit.before_write")?;
        let _g = self.commit_lock.lock();
        let meta = &self.meta;
        let mut b = meta.batch();
        let mut l = Ledger {
            meta,
            containers: FxHashMap::default(),
            new_containers: txn.new_containers.iter().map(|c| c.0).collect(),
            totals: meta.totals()?,
            index: FxHashMap::default(),
            refs: RefsTable::default(),
        };
        // One batched read for the count blocks of every unit touched (a
        // backup touches one per distinct chunk or segment it references).
        l.refs.load(
            meta,
            txn.new_units
                .iter()
                .map(|u| u.0)
                .chain(txn.ref_deltas.keys().copied()),
        )?;

        for (id, rec) in &txn.new_containers {
            l.totals.containers += 1;
            l.totals.container_bytes += rec.file_bytes;
            l.totals.container_vbytes += rec.vbytes;
            l.containers.insert(*id, rec.clone());
        }
        let new_units: FxHashMap<u64, &UnitRecord> =
            txn.new_units.iter().map(|(id, u, _)| (*id, u)).collect();
        for (id, unit, refs) in &txn.new_units {
            b.put_unit(*id, unit);
            l.refs.set(meta, *id, *refs)?;
            l.totals.units += 1;
            l.totals.unit_vbytes += unit.stored_vbytes();
        }

        // Moved or trimmed units: the old copy's container loses them. New
        // containers already count what was packed into them.
        let mut updated: FxHashMap<u64, UnitRecord> = FxHashMap::default();
        let mut trims: Vec<u64> = Vec::new();
        for (id, new) in &txn.unit_updates {
            let old = meta
                .unit(*id)?
                .ok_or_else(|| corrupt_meta(format!("unit {id}"), "updated unit does not exist"))?;
            if drops_chunks(&old, new) {
                trims.push(*id);
            }
            let c = l.container(old.container)?;
            c.live_vbytes -= old.stored_vbytes();
            c.live_units -= 1;
            if !l.new_containers.contains(&new.container) {
                let c = l.container(new.container)?;
                c.live_vbytes += new.stored_vbytes();
                c.live_units += 1;
            }
            l.totals.unit_vbytes = l.totals.unit_vbytes - old.stored_vbytes() + new.stored_vbytes();
            if new.trimmed && !old.trimmed {
                // An incomplete unit is no longer a copy new data can use.
                l.copies(old.kind, &old.fp)?.retain(|c| c != id);
            }
            // Links a move keeps cost nothing; links a trim drops release their targets.
            let (before, after) = (old.link_targets(*id), new.link_targets(*id));
            for t in before.difference(&after) {
                txn.ref_deltas.entry(*t).or_default()[2] -= 1;
            }
            for t in after.difference(&before) {
                txn.ref_deltas.entry(*t).or_default()[2] += 1;
            }
            b.put_unit(*id, new);
            updated.insert(*id, new.clone());
        }

        // Reference deltas; units left unreferenced are freed unless a backup
        // in flight pinned them (then gc frees them later). Freeing a unit
        // releases the units its links point into, which may free them too.
        let mut now: FxHashMap<u64, Refs> = FxHashMap::default();
        let mut ids: Vec<_> = txn.ref_deltas.iter().collect();
        ids.sort_unstable_by_key(|(id, _)| **id);
        // Units whose last incoming link this commit drops.
        let mut unlinked: Vec<u64> = Vec::new();
        for (&id, d) in ids {
            // New units' counts are in the table already (set above).
            let cur = l.refs.get(meta, id)?;
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
                unlinked.push(id);
            }
            now.insert(
                id,
                Refs {
                    live: v[0] as u32,
                    arch: v[1] as u32,
                    links: v[2] as u32,
                },
            );
        }
        // A live recipe references whole units: trimming a unit one
        // references loses data. Slides and gc doom what they trim and read
        // its counts again, so this never fires; if it does, nothing is
        // written.
        for &id in &trims {
            let live = match now.get(&id) {
                Some(r) => r.live,
                None => l.refs.get(meta, id)?.live,
            };
            if live > 0 {
                return Err(crate::error::Error::Internal(format!(
                    "refusing to commit: unit {id} would lose chunks while {live} live version(s) \
                     reference it whole; nothing was changed"
                )));
            }
        }
        let mut work: Vec<u64> = now
            .iter()
            .filter(|(_, r)| r.is_zero())
            .map(|(id, _)| *id)
            .collect();
        for &id in &txn.free_units {
            let r = match now.get(&id) {
                Some(r) => *r,
                None => l.refs.get(meta, id)?,
            };
            if !r.is_zero() {
                // Referenced again since it was found unreferenced.
                b.delete(CF_MARKS, &zombie_key(id));
            } else if !now.contains_key(&id) {
                work.push(id);
            }
        }
        work.sort_unstable();
        let pin_state = self.pins.lock();
        let mut freed: FxHashSet<u64> = FxHashSet::default();
        let mut freed_units = 0u64;
        while let Some(id) = work.pop() {
            if freed.contains(&id) {
                continue;
            }
            if pin_state.pins.contains_key(&id) {
                // A backup in flight may reference it: a later gc frees it
                // (recorded, so a restart does not forget it).
                b.put(CF_MARKS, &zombie_key(id), b"");
                continue;
            }
            let unit = match (updated.get(&id), new_units.get(&id)) {
                (Some(u), _) => u.clone(),
                (None, Some(u)) => (*u).clone(),
                (None, None) => match meta.unit(id)? {
                    Some(u) => u,
                    // A gc candidate already gone: nothing to free.
                    None if txn.free_units.contains(&id) => continue,
                    None => {
                        return Err(corrupt_meta(
                            format!("unit {id}"),
                            "referenced unit does not exist",
                        ))
                    }
                },
            };
            l.free_unit(&mut b, id, &unit)?;
            b.delete(CF_MARKS, &zombie_key(id));
            freed.insert(id);
            freed_units += 1;
            for t in unit.link_targets(id) {
                let r = match now.get_mut(&t) {
                    Some(r) => r,
                    None => {
                        let r = l.refs.get(meta, t)?;
                        now.entry(t).or_insert(r)
                    }
                };
                r.links = r.links.checked_sub(1).ok_or_else(|| {
                    corrupt_meta(format!("unit {t}"), "a link was released twice")
                })?;
                if r.links == 0 {
                    unlinked.push(t);
                }
                if r.is_zero() {
                    work.push(t);
                }
            }
        }
        for (id, r) in now.iter().filter(|(id, _)| !freed.contains(id)) {
            l.refs.set(meta, *id, *r)?;
        }
        l.refs.write(&mut b);
        // gc keeps a unit that others link into whole (gc::trim_to); once the
        // last link is gone, its container is flagged for the next sweep, so
        // an incremental gc trims it, not only a full one.
        unlinked.retain(|id| !freed.contains(id) && !now[id].is_zero());
        // (Written after the transaction's own deletes: gc deletes the flags
        // of the containers it swept, which may hold such a unit. Even a
        // container this commit writes is flagged: gc may have moved the
        // unit whole.)
        let mut unlinked_containers = Vec::new();
        for id in &unlinked {
            unlinked_containers.push(match (updated.get(id), new_units.get(id)) {
                (Some(u), _) => u.container,
                (None, Some(u)) => u.container,
                (None, None) => match meta.unit(*id)? {
                    Some(u) => u.container,
                    None => continue,
                },
            });
        }

        // New copies go first in their fingerprint's list.
        for ((kind, fp), v) in &txn.index_puts {
            full::add_copy(l.copies(*kind, fp)?, *v);
        }
        for ((kind, fp), list) in &l.index {
            full::stage(&mut b, *kind, fp, list);
        }

        // Containers: write changed records, delete empty ones. A container
        // that lost units may hold dead data: flag it for gc's sweep.
        let mut dead_files = Vec::new();
        for (id, rec) in &l.containers {
            let sweep_key = crate::format::keys::sweep_key(*id);
            if rec.live_units == 0 {
                b.delete(CF_MARKS, &sweep_key);
                b.delete(CF_CONTAINERS, &id.0.to_be_bytes());
                // The proof gc needs to delete the file if a crash comes
                // before the unlink below (crate::store::orphans).
                b.put(CF_MARKS, &freed_key(*id), b"");
                l.totals.containers -= 1;
                l.totals.container_bytes -= rec.file_bytes;
                l.totals.container_vbytes -= rec.vbytes;
                dead_files.push(*id);
            } else {
                if !l.new_containers.contains(id) {
                    b.put(CF_MARKS, &sweep_key, b"");
                }
                b.put_container(*id, rec);
            }
        }

        for (name, update) in txn.series_updates {
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
        for c in unlinked_containers
            .iter()
            .filter(|c| !dead_files.contains(*c))
        {
            b.put(CF_MARKS, &crate::format::keys::sweep_key(*c), b"");
        }
        let t = &mut l.totals;
        t.logical_bytes = apply(t.logical_bytes, txn.totals.logical_bytes);
        t.versions = apply(t.versions, txn.totals.versions);
        t.recipe_bytes = apply(t.recipe_bytes, txn.totals.recipe_bytes);
        t.catalog_bytes = apply(t.catalog_bytes, txn.totals.catalog_bytes);
        b.put_totals(t);
        b.put_counters(&self.counters().max(meta.counters()?));
        if let Some(s) = txn.session {
            b.delete(CF_SESSIONS, &s.to_be_bytes());
        }
        if let Err(e) = meta.write(b, true) {
            // A failed sync may still leave the batch in the log, to replay
            // at the next open: the session's files must not go before that
            // open sees whether the session record went with the commit.
            if let Some(s) = txn.session {
                self.commit_write_failed(s);
            }
            return Err(e);
        }
        // Held from the pin check to here: a backup that pinned a unit after
        // the check must, when it then reads the unit, see it gone. Released
        // before the write, a backup could pin and read a unit this batch was
        // about to delete, and reference it (tests/concurrent.rs).
        drop(pin_state);

        // Durable: now the files can go, once no reader that started before
        // this commit can still need them.
        self.failpoint("commit.before_unlink")?;
        for id in self.files_freed(&dead_files) {
            self.remove_container_file(id);
        }
        Ok(CommitOutcome {
            freed_units,
            freed_containers: dead_files.len() as u64,
            freed_bytes: dead_files
                .iter()
                .map(|id| l.containers[id].file_bytes)
                .sum(),
        })
    }
}
