//! `gc`: reclaims space that reference counting does not cover.
//!
//! Reference counts free whole units and whole containers as soon as nothing
//! references them. Three kinds of waste remain, and gc handles each:
//!
//! 1. **Orphans**: container files no committed record names (a crash between
//!    writing a container and committing, or between a commit and unlinking a
//!    freed container), and empty session directories.
//! 2. **Dead chunks inside referenced units**: a unit that several archival
//!    versions reference directly (segments shared across series, or versions
//!    spliced together) is kept whole until all of them are gone, even when
//!    every version only needs some of its chunks.
//! 3. **Partly empty containers**: containers that lost units (expired versions,
//!    old copies left by rewriting, chunk-mode stores) but still hold others.
//!
//! (2) and (3) use **grouped mark-and-sweep** (Guo & Efstathopoulos, §3.2).
//! Groups are series. A group's mark is the set of chunks its versions
//! reference directly, per unit (live versions reference whole units). Marks
//! are persisted (`M`+unit+group, with `N`+group+unit to list a group's units),
//! and a group is re-marked only when its generation changed since it was
//! marked. Only containers that may hold dead data are swept: those holding
//! units that a group with deletions used to reference, and those that lost
//! units in a commit (flagged `S`+container). Sweeping a container merges all
//! groups' marks for its units, frees unmarked unreferenced units, and, when
//! the live fraction falls below a threshold, compacts it: the marked chunks
//! are repacked into a new container (units keep their ids, dropped chunks
//! become absent) and the old container is freed. Marks are keyed by unit, not
//! by container, so moving a unit (slide, compaction) never hides another
//! group's marks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use serde::Serialize;

use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_uvarint, seal_crc, Reader};
use crate::format::container::{ContainerFile, ContainerId};
use crate::format::keys::sweep_key;
use crate::format::keys::{group_key, mark_key, member_key};
use crate::format::keys::{CF_CONTAINERS, CF_MARKS, CF_UNITS};
use crate::format::recipe::Entry;
use crate::format::records::{RecipeForm, SeriesRecord};
use crate::format::unit::UnitRecord;
use crate::meta::{Meta, MetaRead};
use crate::recipe::recipe_entries;
use crate::store::commit::Txn;
use crate::store::pack::{repack, PackWriter};
use crate::store::{Session, Store, Undoom};

pub use crate::store::orphans::OrphanReport;

/// The chunks of one unit a group references.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mark {
    Whole,
    Chunks(BTreeSet<u32>),
}

impl Mark {
    fn merge(&mut self, o: &Mark) {
        match (&mut *self, o) {
            (Mark::Whole, _) => {}
            (_, Mark::Whole) => *self = Mark::Whole,
            (Mark::Chunks(a), Mark::Chunks(b)) => a.extend(b.iter().copied()),
        }
    }

    fn contains(&self, i: u32) -> bool {
        match self {
            Mark::Whole => true,
            Mark::Chunks(c) => c.contains(&i),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            Mark::Whole => v.push(0),
            Mark::Chunks(c) => {
                v.push(1);
                put_uvarint(&mut v, c.len() as u64);
                let mut last = 0u32;
                for &i in c {
                    put_uvarint(&mut v, u64::from(i - last));
                    last = i;
                }
            }
        }
        seal_crc(&mut v);
        v
    }

    fn decode(b: &[u8]) -> Result<Mark> {
        let bad = || corrupt_meta("gc mark", "checksum or format mismatch");
        let mut r = Reader::new(open_crc(b).ok_or_else(bad)?);
        match r.u8().ok_or_else(bad)? {
            0 => Ok(Mark::Whole),
            1 => {
                let n = r.uvarint().ok_or_else(bad)? as usize;
                let mut set = BTreeSet::new();
                let mut last = 0u64;
                for _ in 0..n {
                    last += r.uvarint().ok_or_else(bad)?;
                    set.insert(u32::try_from(last).map_err(|_| bad())?);
                }
                Ok(Mark::Chunks(set))
            }
            _ => Err(bad()),
        }
    }
}

/// What a group's versions reference, per unit — and, through links, the
/// chunks of other units that those chunks' bytes are stored in.
fn mark_group(store: &Store, s: &SeriesRecord) -> Result<HashMap<u64, Mark>> {
    let mut marks: HashMap<u64, Mark> = HashMap::new();
    for v in store.versions(s)? {
        for e in recipe_entries(&store.meta, s, &v)?.iter().flatten() {
            match (*e, v.form) {
                (Entry::Units { first, count }, RecipeForm::Live) => {
                    for u in first..first + count {
                        marks.insert(u, Mark::Whole);
                    }
                }
                (Entry::Direct { unit, first, count }, RecipeForm::Archival) => {
                    let m = marks
                        .entry(unit)
                        .or_insert_with(|| Mark::Chunks(BTreeSet::new()));
                    m.merge(&Mark::Chunks((first..first + count).collect()));
                }
                _ => {}
            }
        }
    }
    let ids: Vec<u64> = marks.keys().copied().collect();
    let mut linked: Vec<(u64, u32)> = Vec::new();
    for (id, u) in ids.iter().zip(load_units_opt(store, &ids)?) {
        let Some(u) = u else { continue };
        for (i, c) in u.chunks.iter().enumerate() {
            if let Some(t) = c.link_target() {
                if marks[id].contains(i as u32) {
                    linked.push(t);
                }
            }
        }
    }
    for (t, j) in linked {
        marks
            .entry(t)
            .or_insert_with(|| Mark::Chunks(BTreeSet::new()))
            .merge(&Mark::Chunks(BTreeSet::from([j])));
    }
    Ok(marks)
}

#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Compact containers whose live fraction falls below this (0..1).
    pub compact_below: f64,
    /// Re-mark every group and sweep every container (a full mark-and-sweep).
    pub full: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            compact_below: 0.5,
            full: false,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    pub orphans: OrphanReport,
    pub groups: u64,
    pub groups_marked: u64,
    pub units_marked: u64,
    pub containers_swept: u64,
    pub units_freed: u64,
    pub units_trimmed: u64,
    pub containers_compacted: u64,
    pub containers_freed: u64,
    /// Container bytes freed and written (net reclaimed = freed - written).
    pub bytes_freed: u64,
    pub bytes_written: u64,
    pub mark_secs: f64,
    pub sweep_secs: f64,
    pub seconds: f64,
}

pub fn gc(store: &Store, opts: &GcOptions) -> Result<GcReport> {
    store.require_writable()?;
    let _m = store.maintenance();
    let started = Instant::now();
    let mut rep = GcReport {
        orphans: crate::store::orphans::collect(store)?,
        ..Default::default()
    };
    let meta = &store.meta;

    let marks = mark_changed_groups(store, opts, &mut rep)?;
    // Persist the marks and the sweep list first: a crash after this point
    // loses no sweep work, and marks never describe less than the recipes.
    store.failpoint("gc.before_mark_commit")?;
    store.commit(marks)?;
    rep.mark_secs = started.elapsed().as_secs_f64();
    store.pause_point("gc.after_mark");

    let sweep_started = Instant::now();
    let sweep = containers_to_sweep(meta, opts.full)?;
    let mut session = store.begin_session("gc")?;
    // Units the sweep frees or trims are doomed: no backup may deduplicate against them from
    // now on. They stay doomed until gc returns, committed or not.
    let mut doomed = Undoom(store, Vec::new());
    let mut sweeper = Sweeper::start(store, &session, opts.compact_below, &mut doomed.1)?;
    for cid in sweep {
        sweeper.sweep_container(cid, &mut rep)?;
    }
    let mut txn = sweeper.finish()?;
    session.sync()?;
    txn.session = Some(session.id);
    store.failpoint("gc.before_sweep_commit")?;
    store.pause_point("gc.before_sweep_commit");
    let out = store.commit(txn)?;
    session.mark_committed();
    rep.containers_freed = out.freed_containers;
    rep.bytes_freed = out.freed_bytes;
    rep.sweep_secs = sweep_started.elapsed().as_secs_f64();
    // A long-running server opens its store once, so the merge its opens do
    // (meta::merge_small_tables) must also happen here, now and then.
    crate::meta::merge_small_tables(meta.db());
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

/// The mark phase's transaction as it grows: the marks of the groups re-marked, and the
/// containers their old units are in (to sweep).
#[derive(Default)]
struct Marking {
    sweep: BTreeSet<ContainerId>,
    txn: Txn,
}

/// Mark phase (grouped mark-and-sweep): every group whose generation changed since it
/// was marked (every group, in a full gc) is marked again. Returns the transaction that
/// persists the marks and the sweep list.
fn mark_changed_groups(store: &Store, opts: &GcOptions, rep: &mut GcReport) -> Result<Txn> {
    let meta = &store.meta;
    let mut marking = Marking::default();
    for s in meta.all_series()? {
        rep.groups += 1;
        let marked_gen = meta.get(CF_MARKS, &group_key(s.id))?.map(|b| {
            b.get(..8)
                .map(|x| u64::from_le_bytes(x.try_into().unwrap()))
                .unwrap_or(u64::MAX)
        });
        if !opts.full && marked_gen == Some(s.generation) {
            continue;
        }
        rep.groups_marked += 1;
        marking.remark(store, &s, opts.full, rep)?;
    }
    let Marking { sweep, mut txn } = marking;
    for c in &sweep {
        txn.puts
            .push((CF_MARKS, sweep_key(*c).to_vec(), Vec::new()));
    }
    Ok(txn)
}

impl Marking {
    /// A group's new marks replace its old ones; the containers of the units it used to
    /// reference are swept if it lost versions since the last gc.
    fn remark(
        &mut self,
        store: &Store,
        s: &SeriesRecord,
        full: bool,
        rep: &mut GcReport,
    ) -> Result<()> {
        let (meta, txn) = (&store.meta, &mut self.txn);
        let mut prefix = vec![b'N'];
        prefix.extend_from_slice(&s.id.to_be_bytes());
        let old: Vec<u64> = meta
            .scan_prefix(CF_MARKS, &prefix)?
            .into_iter()
            .map(|(k, _)| u64::from_be_bytes(k[5..13].try_into().unwrap()))
            .collect();
        let new = mark_group(store, s)?;
        rep.units_marked += new.len() as u64;
        for u in &old {
            if !new.contains_key(u) {
                txn.deletes.push((CF_MARKS, mark_key(*u, s.id).to_vec()));
                txn.deletes.push((CF_MARKS, member_key(s.id, *u).to_vec()));
            }
        }
        for (u, m) in &new {
            txn.puts
                .push((CF_MARKS, mark_key(*u, s.id).to_vec(), m.encode()));
            txn.puts
                .push((CF_MARKS, member_key(s.id, *u).to_vec(), Vec::new()));
        }
        txn.puts.push((
            CF_MARKS,
            group_key(s.id).to_vec(),
            s.generation.to_le_bytes().to_vec(),
        ));
        if s.deleted_since_gc || full {
            // Units the group used to reference may now hold dead chunks.
            for u in load_units_lenient(store, &old)? {
                self.sweep.insert(u.container);
            }
        }
        let generation = s.generation;
        txn.series_updates.push((
            s.name.clone(),
            Box::new(move |cur| {
                let mut s = cur.expect("series records are never deleted");
                // A series changed meanwhile keeps its flag for the next gc.
                if s.generation == generation {
                    s.deleted_since_gc = false;
                }
                s
            }),
        ));
        Ok(())
    }
}

/// A step: the containers flagged for a sweep (by the mark phase, or by a commit that
/// took units out of them); every container in a full gc.
fn containers_to_sweep(meta: &Meta, full: bool) -> Result<BTreeSet<ContainerId>> {
    let mut sweep: BTreeSet<ContainerId> = meta
        .scan_prefix(CF_MARKS, b"S")?
        .into_iter()
        .map(|(k, _)| ContainerId(u64::from_be_bytes(k[1..9].try_into().unwrap())))
        .collect();
    if full {
        meta.for_each_prefix(CF_CONTAINERS, b"", |k, _| {
            sweep.insert(ContainerId(u64::from_be_bytes(k.try_into().unwrap())));
            Ok(true)
        })?;
    }
    Ok(sweep)
}

/// Sweep phase: what sweeping the containers one by one builds up.
struct Sweeper<'s, 'd> {
    store: &'s Store,
    compact_below: f64,
    /// The ids of the units doomed so far (gc's `Undoom` releases them).
    doomed: &'d mut Vec<u64>,
    txn: Txn,
    pack: PackWriter,
}

impl<'s, 'd> Sweeper<'s, 'd> {
    /// A step: the pack writer for compacted units, and the zombies to free: units whose
    /// references reached zero while a backup had them pinned.
    fn start(
        store: &'s Store,
        session: &Session,
        compact_below: f64,
        doomed: &'d mut Vec<u64>,
    ) -> Result<Self> {
        let pack = PackWriter::for_session(store, session);
        let mut txn = Txn::default();
        txn.free_units.extend(store.zombies()?);
        Ok(Sweeper {
            store,
            compact_below,
            doomed,
            txn,
            pack,
        })
    }

    /// A step per container: its units' merged marks say what stays; unmarked unreferenced
    /// units are freed, and a container whose live fraction falls below the threshold is
    /// compacted.
    fn sweep_container(&mut self, cid: ContainerId, rep: &mut GcReport) -> Result<()> {
        let store = self.store;
        self.txn.deletes.push((CF_MARKS, sweep_key(cid).to_vec()));
        let Some(crec) = store.meta.container(cid)? else {
            return Ok(());
        };
        rep.containers_swept += 1;
        let cf = store.open_container(cid, true)?;
        let ids: Vec<u64> = cf.footer.units.iter().map(|u| u.unit).collect();
        let units: Vec<(u64, UnitRecord)> = ids
            .iter()
            .copied()
            .zip(load_units_opt(store, &ids)?)
            .filter_map(|(id, u)| u.filter(|u| u.container == cid).map(|u| (id, u)))
            .collect();
        let (keep, live) = self.merge_marks(&units, rep)?;
        let fraction = if crec.vbytes == 0 {
            0.0
        } else {
            live as f64 / crec.vbytes as f64
        };
        if keep.is_empty() || fraction >= self.compact_below {
            return Ok(());
        }
        self.compact(&cf, &units, &keep, rep)
    }

    /// What stays of each unit (all groups' marks merged), and the live bytes that is;
    /// a unit nothing marks nor references is doomed and freed.
    fn merge_marks(
        &mut self,
        units: &[(u64, UnitRecord)],
        rep: &mut GcReport,
    ) -> Result<(BTreeMap<u64, Mark>, u64)> {
        let (store, meta) = (self.store, &self.store.meta);
        let mut keep: BTreeMap<u64, Mark> = BTreeMap::new();
        let mut live = 0u64;
        for (id, u) in units {
            let mut m: Option<Mark> = None;
            meta.for_each_prefix(CF_MARKS, &mark_key(*id, 0)[..9], |_, v| {
                let x = Mark::decode(v)?;
                match m.as_mut() {
                    Some(m) => m.merge(&x),
                    None => m = Some(x),
                }
                Ok(true)
            })?;
            let refs = meta.refs(*id)?;
            // A unit a backup in flight deduplicated against stays whole, and
            // so does one `trim_to` would not trim: counted whole, it does not
            // make its container look worth compacting at every gc.
            let m = if store.is_pinned(*id) || (m.is_some() && !trimmable(refs)) {
                Some(Mark::Whole)
            } else {
                m
            };
            match m {
                None if refs.is_zero() && store.try_doom(*id) => {
                    self.doomed.push(*id);
                    self.txn.free_units.push(*id);
                    rep.units_freed += 1;
                }
                None => {
                    // Referenced but not marked: a version committed after its
                    // group was marked. Keep it whole.
                    live += u.stored_vbytes();
                    keep.insert(*id, Mark::Whole);
                }
                Some(m) => {
                    live += u
                        .chunks
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| m.contains(*i as u32))
                        .map(|(_, c)| c.stored_len())
                        .sum::<u64>();
                    keep.insert(*id, m);
                }
            }
        }
        Ok((keep, live))
    }

    /// Compact: repack what is marked, drop the rest.
    fn compact(
        &mut self,
        cf: &ContainerFile,
        units: &[(u64, UnitRecord)],
        keep: &BTreeMap<u64, Mark>,
        rep: &mut GcReport,
    ) -> Result<()> {
        self.store.pause_point("gc.before_doom");
        let data = cf.read_all()?;
        rep.containers_compacted += 1;
        for (id, u) in units {
            let Some(m) = keep.get(id) else { continue };
            let chunks = match m {
                Mark::Whole => None,
                Mark::Chunks(c) => trim_to(self.store, *id, c, self.doomed)?,
            };
            let new = repack(
                *id,
                u,
                chunks.as_ref(),
                &data,
                &HashMap::new(),
                &mut self.pack,
            )?;
            if new.trimmed && !u.trimmed {
                rep.units_trimmed += 1;
            }
            rep.bytes_written += new.stored_vbytes();
            self.txn.unit_updates.push((*id, new));
        }
        Ok(())
    }

    /// A step: the compacted containers sealed into the transaction.
    fn finish(self) -> Result<Txn> {
        let mut txn = self.txn;
        txn.new_containers = self.pack.finish()?;
        Ok(txn)
    }
}

/// The chunks to trim unit `id` to, or `None` to keep it whole. Trimming
/// needs the unit doomed (no backup has it pinned, and from now on none can
/// take it) and, its counts read again after that, no live reference: a
/// backup that deduplicated against it and committed after the sweep read
/// its counts has unpinned it by then, and its live recipe needs the whole
/// unit (issue 18: gc trimmed such units, and the backup's restore failed).
///
/// Nor may another unit link into it. The marks only cover links from
/// chunks some version references, but a linking unit that stays whole
/// (its container not compacted) still holds its other links, and a later
/// backup that deduplicates against it references it whole: its restore
/// would follow a link into a dropped chunk (issue 18, found by the stress
/// test). Links are made only by the backup that stored their target, so
/// no new ones appear; once the linking units are trimmed or freed, their
/// links are released and a later gc trims this unit.
fn trim_to(
    store: &Store,
    id: u64,
    chunks: &BTreeSet<u32>,
    doomed: &mut Vec<u64>,
) -> Result<Option<BTreeSet<u32>>> {
    if !store.try_doom(id) {
        return Ok(None);
    }
    if !trimmable(store.meta.refs(id)?) {
        store.undoom([id]);
        return Ok(None);
    }
    doomed.push(id);
    Ok(Some(chunks.clone()))
}

/// A unit gc may trim: no live version references it whole and no other
/// unit links into it (see [`trim_to`]).
fn trimmable(r: crate::format::refcounts::Refs) -> bool {
    r.live == 0 && r.links == 0
}

fn load_units_opt(store: &Store, ids: &[u64]) -> Result<Vec<Option<UnitRecord>>> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|i| i.to_be_bytes().to_vec()).collect();
    store
        .meta
        .multi_get(CF_UNITS, &keys)?
        .into_iter()
        .zip(ids)
        .map(|(v, id)| v.map(|b| UnitRecord::decode(*id, &b)).transpose())
        .collect()
}

/// The records of those of `ids` that still exist.
fn load_units_lenient(store: &Store, ids: &[u64]) -> Result<Vec<UnitRecord>> {
    Ok(load_units_opt(store, ids)?.into_iter().flatten().collect())
}
