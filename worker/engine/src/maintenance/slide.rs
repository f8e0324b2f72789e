//! Slide: reverse deduplication of versions leaving the live window
//! (RevDedup §2.4), made safe for shared units and per-series retention.
//!
//! For a version V leaving the live window and the next version N of its
//! series:
//!
//! 1. every chunk of V whose fingerprint also occurs in N becomes an *indirect*
//!    reference to that position of N; zero chunks become zero entries; the rest
//!    stay *direct* references `(unit, chunk)`;
//! 2. V drops its live reference on each of its units and takes an archival
//!    reference on each unit it still references directly;
//! 3. a unit that only V referenced is either freed (V needs none of its
//!    chunks) or *trimmed* to the chunks V needs and repacked into a container
//!    owned by V, so expiring V later frees that container whole (a unit that
//!    surviving units link into also keeps the linked chunks, and goes to a
//!    shared container instead);
//! 4. the containers those units came from are *split*: their remaining (shared)
//!    units are moved to fresh containers and the old container is freed.
//!
//! Units that other versions still reference are left whole: V refers into
//! them directly and its archival reference keeps them; grouped gc trims what
//! becomes dead inside them later. Memory holds one version's chunk
//! fingerprints; I/O touches that version's containers only.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use serde::Serialize;

use crate::error::{corrupt_meta, Error, Result};
use crate::format::container::{ContainerFile, ContainerId};
use crate::format::fp::Fp;
use crate::format::records::{ContainerRecord, RecipeForm, SeriesRecord, VersionRecord};
use crate::format::refcounts::Refs;
use crate::format::unit::UnitRecord;
use crate::meta::MetaRead;
use crate::recipe::archival::{expand_refs, Ref};
use crate::recipe::recipe_entries;
use crate::store::commit::Txn;
use crate::store::pack::{repack, PackWriter};
use crate::store::{Session, Store, Undoom};

#[derive(Clone, Debug, Default, Serialize)]
pub struct SlideReport {
    pub series: String,
    /// Versions moved to the archival window.
    pub slid: Vec<u32>,
    /// Chunks that became references into the next version.
    pub indirect_chunks: u64,
    pub direct_chunks: u64,
    pub units_trimmed: u64,
    pub units_freed: u64,
    /// Shared units moved out of split containers.
    pub units_moved: u64,
    /// Links from surviving units into trimmed ones, replaced by the bytes.
    pub links_resolved: u64,
    /// Data written (uncompressed) and containers freed.
    pub bytes_written: u64,
    pub containers_freed: u64,
    pub bytes_freed: u64,
    pub seconds: f64,
}

/// Slides every version that is outside the series' live window.
pub fn slide(store: &Store, series: &str) -> Result<SlideReport> {
    store.require_writable()?;
    let _claim = store.claim_series(series)?;
    slide_claimed(store, series)
}

pub(crate) fn slide_claimed(store: &Store, series: &str) -> Result<SlideReport> {
    let _m = store.maintenance();
    let started = Instant::now();
    let s = store.series(series)?;
    let mut rep = SlideReport {
        series: s.name.clone(),
        ..Default::default()
    };
    let versions = store.versions(&s)?;
    let live: Vec<usize> = (0..versions.len())
        .filter(|&i| versions[i].form == RecipeForm::Live)
        .collect();
    let window = s.retention.live.max(1) as usize;
    for &i in &live[..live.len().saturating_sub(window)] {
        let next = versions.get(i + 1).ok_or_else(|| {
            Error::Invalid("the newest version cannot leave the live window".into())
        })?;
        let s = store.series(series)?;
        slide_one(store, &s, &versions[i], next, &mut rep)?;
        rep.slid.push(versions[i].number);
    }
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

fn slide_one(
    store: &Store,
    s: &SeriesRecord,
    v: &VersionRecord,
    n: &VersionRecord,
    rep: &mut SlideReport,
) -> Result<()> {
    let what = format!("{} version {}", s.name, v.number);
    let v_parts = recipe_entries(&store.meta, s, v)?;
    let (v_refs, v_units) = expand_refs(&store.meta, &v_parts)?;
    let next = NextVersion::index(store, s, n)?;
    let rev = reverse_dedup(&v_refs, &v_units, &next, &what, rep)?;
    drop(next);
    let mut txn = Txn::default();
    let only_v = OnlyV::of(&v_units);
    let candidates = archival_refs(store, &v_units, &rev.needed, &only_v, &mut txn)?;
    store.pause_point("slide.before_doom");
    // No backup in flight has deduplicated against them; from here until the
    // commit, none can. A unit a backup pinned stays whole. A backup that
    // referenced one and committed after its counts were read above has
    // unpinned it by then: the counts are read again once it is doomed.
    // (Undone when this returns, whether it commits or fails.)
    let mut undoom = Undoom(
        store,
        candidates
            .into_iter()
            .filter(|&u| store.try_doom(u))
            .collect(),
    );
    let mut ex = Exclusive::confirm(store, &mut undoom, &only_v, &v_units, &rev.needed)?;
    let fills = Fills::read(store, &v_units, &ex.set, rep)?;
    ex.units
        .sort_unstable_by_key(|u| rev.order.get(u).copied().unwrap_or(usize::MAX));
    let mut session = store.begin_session("slide")?;
    let mut r = Repack::new(store, &session, &v_units, &fills, &mut txn, rep);
    let moved = r.split_containers(&ex)?;
    r.move_linking(&moved)?;
    let containers = r.finish((s.id, v.number))?;
    session.sync()?;
    txn.new_containers = containers;
    txn.session = Some(session.id);
    archive_recipe(&mut txn, s, v, &rev.new_refs);
    store.failpoint("slide.before_commit")?;
    let out = store.commit(txn)?;
    session.mark_committed();
    rep.containers_freed += out.freed_containers;
    rep.bytes_freed += out.freed_bytes;
    Ok(())
}

/// The next version's chunks by fingerprint (first position wins): what V's chunks become
/// references to.
struct NextVersion {
    number: u32,
    positions: HashMap<Fp, u64>,
}

impl NextVersion {
    /// A step: N's recipe, read and indexed once for the whole of V.
    fn index(store: &Store, s: &SeriesRecord, n: &VersionRecord) -> Result<Self> {
        let n_parts = recipe_entries(&store.meta, s, n)?;
        let (n_refs, n_units) = expand_refs(&store.meta, &n_parts)?;
        let mut m = HashMap::with_capacity(n_refs.len());
        for (pos, r) in n_refs.iter().enumerate() {
            if let Ref::Direct { unit, idx } = *r {
                m.entry(n_units[&unit].chunks[idx as usize].fp)
                    .or_insert(pos as u64);
            }
        }
        Ok(NextVersion {
            number: n.number,
            positions: m,
        })
    }
}

/// V's recipe after reverse dedup, and what it still needs of V's units.
struct Reversed {
    /// V's archival recipe.
    new_refs: Vec<Ref>,
    /// The chunks of each unit V still references directly.
    needed: HashMap<u64, BTreeSet<u32>>,
    /// Each unit's first use in V's recipe order.
    order: HashMap<u64, usize>,
}

/// Step 1 (RevDedup's reverse dedup): each chunk of V the next version also holds becomes
/// an indirect reference to it; the rest stay direct, a repeated chunk kept once.
fn reverse_dedup(
    v_refs: &[Ref],
    v_units: &HashMap<u64, UnitRecord>,
    next: &NextVersion,
    what: &str,
    rep: &mut SlideReport,
) -> Result<Reversed> {
    let mut needed: HashMap<u64, BTreeSet<u32>> = HashMap::new();
    let mut order: HashMap<u64, usize> = HashMap::new(); // first use in recipe order
    let mut new_refs = Vec::with_capacity(v_refs.len());
    let mut first_copy: HashMap<Fp, (u64, u32)> = HashMap::new();
    for r in v_refs {
        new_refs.push(match *r {
            Ref::Direct { unit, idx } => {
                let next_use = order.len();
                order.entry(unit).or_insert(next_use);
                match next.positions.get(&v_units[&unit].chunks[idx as usize].fp) {
                    Some(&pos) => {
                        rep.indirect_chunks += 1;
                        Ref::Indirect {
                            version: next.number,
                            pos,
                        }
                    }
                    None => {
                        // A chunk V holds more than once is kept once: later
                        // copies refer to the first.
                        let fp = v_units[&unit].chunks[idx as usize].fp;
                        let (unit, idx) = *first_copy.entry(fp).or_insert((unit, idx));
                        rep.direct_chunks += 1;
                        needed.entry(unit).or_default().insert(idx);
                        Ref::Direct { unit, idx }
                    }
                }
            }
            Ref::Zero { len } => Ref::Zero { len },
            Ref::Indirect { .. } => {
                return Err(corrupt_meta(
                    format!("recipe of {what}"),
                    "a live recipe holds an indirect reference",
                ))
            }
        });
    }
    Ok(Reversed {
        new_refs,
        needed,
        order,
    })
}

/// Whether only V holds a unit: only V's live recipe references it and every unit linking
/// into it is one of V's units (a link is made by the backup that stored its target, so a
/// linker outside V's recipe is an older version's archival leftover: such a unit stays
/// whole).
struct OnlyV {
    linkers_in_v: HashMap<u64, u32>,
}

impl OnlyV {
    fn of(v_units: &HashMap<u64, UnitRecord>) -> Self {
        let mut linkers_in_v: HashMap<u64, u32> = HashMap::new();
        for (id, u) in v_units {
            for t in u.link_targets(*id) {
                *linkers_in_v.entry(t).or_default() += 1;
            }
        }
        OnlyV { linkers_in_v }
    }

    fn holds(&self, u: u64, r: Refs) -> bool {
        r.live == 1 && r.arch == 0 && r.links == self.linkers_in_v.get(&u).copied().unwrap_or(0)
    }
}

/// Step 2: V drops its live reference on each of its units and takes an archival one on
/// each it still references directly. Returns the units only V holds, as counted now: the
/// candidates to trim or free.
fn archival_refs(
    store: &Store,
    v_units: &HashMap<u64, UnitRecord>,
    needed: &HashMap<u64, BTreeSet<u32>>,
    only_v: &OnlyV,
    txn: &mut Txn,
) -> Result<Vec<u64>> {
    let ids: Vec<u64> = v_units.keys().copied().collect();
    let mut candidates: Vec<u64> = Vec::new();
    for (&u, r) in ids.iter().zip(store.meta.refs_many(&ids)?) {
        txn.ref_delta(u, -1, i64::from(needed.contains_key(&u)));
        if only_v.holds(u, r) {
            candidates.push(u);
        }
    }
    Ok(candidates)
}

/// The units only V holds, confirmed once doomed, and the chunks each keeps.
struct Exclusive {
    /// In V's recipe order once sorted (so its trimmed units are packed that way).
    units: Vec<u64>,
    set: BTreeSet<u64>,
    keep: HashMap<u64, BTreeSet<u32>>,
}

impl Exclusive {
    /// A step: the doomed candidates' counts read again; those no longer only V's are
    /// released at once, and only the exclusive stay doomed.
    fn confirm(
        store: &Store,
        undoom: &mut Undoom<'_>,
        only_v: &OnlyV,
        v_units: &HashMap<u64, UnitRecord>,
        needed: &HashMap<u64, BTreeSet<u32>>,
    ) -> Result<Self> {
        let (mut exclusive, mut shared) = (Vec::new(), Vec::new());
        for (&u, r) in undoom.1.iter().zip(store.meta.refs_many(&undoom.1)?) {
            if only_v.holds(u, r) {
                exclusive.push(u);
            } else {
                shared.push(u);
            }
        }
        store.undoom(shared);
        undoom.1.clone_from(&exclusive);
        let exclusive_set: BTreeSet<u64> = exclusive.iter().copied().collect();
        let keep = keep_sets(v_units, needed, &exclusive_set);
        Ok(Exclusive {
            units: exclusive,
            set: exclusive_set,
            keep,
        })
    }
}

/// Links from units that outlive V into V's exclusive units, and the bytes they link to.
struct Fills {
    links: HashMap<u64, HashMap<u32, (u64, u32)>>,
    bytes: HashMap<(u64, u32), Vec<u8>>,
}

impl Fills {
    /// A step: units that outlive V must not link into V's exclusive units, which are
    /// trimmed into containers V owns: the linked bytes are copied into the linking unit
    /// when it moves (it usually does, its container being split). Later versions then
    /// find those chunks inside their own unit.
    fn read(
        store: &Store,
        v_units: &HashMap<u64, UnitRecord>,
        exclusive_set: &BTreeSet<u64>,
        rep: &mut SlideReport,
    ) -> Result<Self> {
        let mut fills: HashMap<u64, HashMap<u32, (u64, u32)>> = HashMap::new();
        for (id, u) in v_units {
            if exclusive_set.contains(id) {
                continue;
            }
            for (k, c) in u.chunks.iter().enumerate() {
                if let Some((t, j)) = c.link_target().filter(|(t, _)| exclusive_set.contains(t)) {
                    fills.entry(*id).or_default().insert(k as u32, (t, j));
                }
            }
        }
        rep.links_resolved += fills.values().map(|m| m.len() as u64).sum::<u64>();
        let fill_bytes = read_linked_chunks(store, v_units, &fills)?;
        Ok(Fills {
            links: fills,
            bytes: fill_bytes,
        })
    }

    /// The bytes `id`'s links into exclusive units are replaced with, by chunk index.
    fn of(&self, id: u64) -> HashMap<u32, Vec<u8>> {
        self.links
            .get(&id)
            .map(|m| {
                m.iter()
                    .map(|(k, at)| (*k, self.bytes[at].clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Steps 3 and 4 (trim-and-repack exclusive units, split their containers) and what they
/// share: V's units, the fills, and the pack writers for containers V owns and shared ones.
struct Repack<'a> {
    store: &'a Store,
    v_units: &'a HashMap<u64, UnitRecord>,
    fills: &'a Fills,
    txn: &'a mut Txn,
    rep: &'a mut SlideReport,
    // Fields drop in order: a slide that fails stops `shared`'s writer, then `owned`'s.
    shared: PackWriter,
    owned: PackWriter,
}

impl<'a> Repack<'a> {
    fn new(
        store: &'a Store,
        session: &Session,
        v_units: &'a HashMap<u64, UnitRecord>,
        fills: &'a Fills,
        txn: &'a mut Txn,
        rep: &'a mut SlideReport,
    ) -> Self {
        let owned = PackWriter::for_session(store, session);
        let shared = PackWriter::for_session(store, session);
        Repack {
            store,
            v_units,
            fills,
            txn,
            rep,
            shared,
            owned,
        }
    }

    /// A step: each container holding an exclusive unit, in the order V first uses them,
    /// is emptied: exclusive units trimmed into V's containers, the rest moved out, so it
    /// can go. Returns the units moved.
    fn split_containers(&mut self, ex: &Exclusive) -> Result<HashSet<u64>> {
        let mut moved: HashSet<u64> = HashSet::new();
        // Containers to split, in the order V first uses them.
        let mut touched: Vec<ContainerId> = Vec::new();
        for u in &ex.units {
            let c = self.v_units[u].container;
            if !touched.contains(&c) {
                touched.push(c);
            }
        }
        for cid in &touched {
            let cf = self.store.open_container(*cid, true)?;
            let data = cf.read_all()?;
            self.trim_exclusive(*cid, &data, ex)?;
            self.move_out(*cid, &cf, &data, &ex.set, &mut moved)?;
        }
        Ok(moved)
    }

    /// Exclusive units of V in this container: keep what V needs (a unit V needs nothing
    /// of is freed by the commit).
    fn trim_exclusive(&mut self, cid: ContainerId, data: &[u8], ex: &Exclusive) -> Result<()> {
        for u in ex.units.iter().filter(|u| self.v_units[u].container == cid) {
            let old = &self.v_units[u];
            let Some(keep) = ex.keep.get(u) else {
                self.rep.units_freed += 1;
                continue;
            };
            let new = repack(
                *u,
                old,
                Some(keep),
                data,
                &self.fills.of(*u),
                &mut self.owned,
            )?;
            if new.trimmed && !old.trimmed {
                self.rep.units_trimmed += 1;
            }
            self.rep.bytes_written += new.stored_vbytes();
            self.txn.unit_updates.push((*u, new));
        }
        Ok(())
    }

    /// Everything else still in the container moves out, so the container can go.
    fn move_out(
        &mut self,
        cid: ContainerId,
        cf: &ContainerFile,
        data: &[u8],
        exclusive_set: &BTreeSet<u64>,
        moved: &mut HashSet<u64>,
    ) -> Result<()> {
        let ids: Vec<u64> = cf
            .footer
            .units
            .iter()
            .map(|e| e.unit)
            .filter(|id| !exclusive_set.contains(id))
            .collect();
        for (id, rec) in ids.iter().zip(
            self.store.meta.multi_get(
                crate::format::keys::CF_UNITS,
                &ids.iter()
                    .map(|i| i.to_be_bytes().to_vec())
                    .collect::<Vec<_>>(),
            )?,
        ) {
            let Some(rec) = rec else { continue };
            let old = UnitRecord::decode(*id, &rec)?;
            if old.container != cid {
                continue; // moved elsewhere earlier
            }
            let new = repack(*id, &old, None, data, &self.fills.of(*id), &mut self.shared)?;
            self.rep.bytes_written += new.stored_vbytes();
            self.rep.units_moved += 1;
            self.txn.unit_updates.push((*id, new));
            moved.insert(*id);
        }
        Ok(())
    }

    /// A step: linking units whose containers were not split move on their own.
    fn move_linking(&mut self, moved: &HashSet<u64>) -> Result<()> {
        let mut rest: Vec<u64> = self
            .fills
            .links
            .keys()
            .copied()
            .filter(|u| !moved.contains(u))
            .collect();
        rest.sort_unstable_by_key(|u| (self.v_units[u].container, *u));
        let mut open: Option<(ContainerId, Vec<u8>)> = None;
        for id in rest {
            let old = &self.v_units[&id];
            if open.as_ref().map(|o| o.0) != Some(old.container) {
                open = Some((old.container, read_container(self.store, old.container)?));
            }
            let data = &open.as_ref().expect("just opened").1;
            let new = repack(id, old, None, data, &self.fills.of(id), &mut self.shared)?;
            self.rep.bytes_written += new.stored_vbytes();
            self.rep.units_moved += 1;
            self.txn.unit_updates.push((id, new));
        }
        Ok(())
    }

    /// A step: the containers written, sealed; those of V's trimmed units are V's own, so
    /// expiring V frees them whole.
    fn finish(self, owner: (u32, u32)) -> Result<Vec<(ContainerId, ContainerRecord)>> {
        let mut containers = self.owned.finish()?;
        for c in containers.iter_mut() {
            c.1.owner = Some(owner);
        }
        containers.extend(self.shared.finish()?);
        Ok(containers)
    }
}

/// Last step before the commit: the archival recipe replaces the live one.
fn archive_recipe(txn: &mut Txn, s: &SeriesRecord, v: &VersionRecord, new_refs: &[Ref]) {
    let mut rec = v.clone();
    rec.form = RecipeForm::Archival;
    super::stage_recipe(txn, s.id, v, rec, new_refs);
    txn.series_updates.push((
        s.name.clone(),
        Box::new(|cur| {
            let mut s = cur.expect("the series exists while it is claimed");
            s.generation += 1;
            s
        }),
    ));
}

fn read_container(store: &Store, cid: ContainerId) -> Result<Vec<u8>> {
    store.open_container(cid, true)?.read_all()
}

/// The chunks each exclusive unit keeps: those V references directly, and
/// those a kept chunk of another exclusive unit links to. V's recipe keeps
/// the first copy of a repeated chunk in its own order, which may be a link
/// in a segment that a later version deduplicated before the segment holding
/// the bytes (files reordered in a tar): the target must stay. (Links from
/// units that stay whole are resolved by `fills`; links never chain.)
fn keep_sets(
    v_units: &HashMap<u64, UnitRecord>,
    needed: &HashMap<u64, BTreeSet<u32>>,
    exclusive: &BTreeSet<u64>,
) -> HashMap<u64, BTreeSet<u32>> {
    let mut keep: HashMap<u64, BTreeSet<u32>> = exclusive
        .iter()
        .filter_map(|u| needed.get(u).map(|n| (*u, n.clone())))
        .collect();
    for u in exclusive {
        for &i in needed.get(u).into_iter().flatten() {
            let c = &v_units[u].chunks[i as usize];
            if let Some((t, j)) = c
                .link_target()
                .filter(|(t, _)| t != u && exclusive.contains(t))
            {
                keep.entry(t).or_default().insert(j);
            }
        }
    }
    keep
}

/// The bytes of every chunk `fills` links to, read container by container.
fn read_linked_chunks(
    store: &Store,
    units: &HashMap<u64, UnitRecord>,
    fills: &HashMap<u64, HashMap<u32, (u64, u32)>>,
) -> Result<HashMap<(u64, u32), Vec<u8>>> {
    let mut wanted: BTreeMap<ContainerId, BTreeSet<(u64, u32)>> = BTreeMap::new();
    for at in fills.values().flat_map(|m| m.values()) {
        wanted
            .entry(units[&at.0].container)
            .or_default()
            .insert(*at);
    }
    let mut out = HashMap::new();
    for (cid, ats) in wanted {
        let cf = store.open_container(cid, true)?;
        for (t, j) in ats {
            let u = &units[&t];
            let c = &u.chunks[j as usize];
            if c.stored_len() == 0 {
                return Err(corrupt_meta(
                    format!("unit {t}"),
                    format!("chunk {j} is linked to but holds no bytes"),
                ));
            }
            let mut buf = vec![0u8; c.stored_len() as usize];
            cf.read_range(u.chunk_vaddr(j as usize), &mut buf)?;
            out.insert((t, j), buf);
        }
    }
    Ok(out)
}
