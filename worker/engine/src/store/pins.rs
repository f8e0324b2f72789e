//! Pins: what keeps a unit alive between a backup's lookup and its commit, or while a
//! reader still needs it. A backup pins the units it deduplicates against, so that no
//! commit frees them under it; a unit whose references reach zero while pinned is
//! *doomed* and becomes a zombie (`Z` key) that gc frees later.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::container::ContainerId;
use crate::format::fp::Fp;
use crate::format::unit::UnitRecord;
use crate::index::sampled::SampledLookup;
use crate::index::{FingerprintIndex, FullIndex};
use crate::meta::MetaRead;
use crate::store::domain::DedupScope;
use crate::store::Store;

impl Store {
    /// Finds the copies new data with these fingerprints may dedup to and
    /// pins every one of them: only complete units that no slide or gc is
    /// about to trim or free are offered. The ids of everything pinned are
    /// appended to `pinned` for the caller to unpin when it is done; each
    /// fingerprint's candidates come newest first, and an empty list means no
    /// usable copy.
    ///
    /// No lock is held while reading. The copies are pinned before their
    /// records are read: a commit never frees a pinned unit and holds the pin
    /// lock until its batch is written, and a slide or gc dooms what it trims
    /// before writing, so a record read after the pin is one that stays. Those
    /// found gone or trimmed are unpinned at once. Reads are batched (a
    /// chunk-mode backup looks up a whole buffer's chunks at once; one read
    /// per key was half of its dedup stage), and each record is read once.
    pub(crate) fn lookup_pin(
        &self,
        kind: DedupUnit,
        fps: &[Fp],
        scope: &DedupScope,
        pinned: &mut Vec<u64>,
    ) -> Result<FxHashMap<Fp, Vec<UnitCopy>>> {
        // A dedup domain's copies are listed under their own keys (`Fp::in_domain`), so the
        // lookup sees no other domain's. The series' own latest version may reference units
        // of another domain (written before domains were on): those are looked up under the
        // plain fingerprint, and only ids the scope admits by id are kept, unread.
        let mut copies = match scope.tag() {
            // Without domains the keys are the fingerprints: no copy of the batch.
            0 => self.index_copies(kind, fps)?,
            tag => {
                let keys: Vec<Fp> = fps.iter().map(|f| f.in_domain(tag)).collect();
                self.index_copies(kind, &keys)?
            }
        };
        if let Some(own) = scope.own_ids() {
            for (mine, plain) in copies.iter_mut().zip(self.index_copies(kind, fps)?) {
                for id in plain {
                    if own(id) && !mine.contains(&id) {
                        mine.push(id);
                    }
                }
            }
        }
        let mut ids: Vec<u64> = copies.iter().flatten().copied().collect();
        ids.sort_unstable();
        ids.dedup();
        // A sampled index's hint is matched on 64 bits and may name a unit of another
        // fingerprint or kind: such a unit is no copy, and is unpinned at once. So is a
        // copy outside the backup's dedup domain.
        let wanted: FxHashSet<&Fp> = fps.iter().collect();
        let first_new = pinned.len();
        let mut usable: FxHashMap<u64, (UnitCopy, Fp)> = FxHashMap::default();
        let mut wrong = FxHashSet::default();
        for (rec, copy) in self.pin_read(&ids, pinned)? {
            match (rec, copy) {
                (Some(r), Some(c))
                    if r.kind == kind && wanted.contains(&r.fp) && scope.admits(c.id, &r) =>
                {
                    usable.insert(c.id, (c, r.fp));
                }
                (_, Some(c)) => {
                    wrong.insert(c.id);
                }
                _ => {}
            }
        }
        if !wrong.is_empty() {
            let mut i = first_new;
            while i < pinned.len() {
                if wrong.contains(&pinned[i]) {
                    self.unpin([pinned.swap_remove(i)]);
                } else {
                    i += 1;
                }
            }
        }
        Ok(fps
            .iter()
            .zip(copies)
            .map(|(fp, ids)| {
                let cands = ids
                    .iter()
                    .filter_map(|id| usable.get(id).filter(|(_, f)| f == fp).map(|(c, _)| *c))
                    .collect();
                (*fp, cands)
            })
            .collect())
    }

    /// The index's copies of each of `keys` (exact or sampled), in `keys` order.
    fn index_copies(&self, kind: DedupUnit, keys: &[Fp]) -> Result<Vec<Vec<u64>>> {
        match &self.sampled {
            None => FullIndex(&self.meta).copies_many(kind, keys),
            Some(index) => SampledLookup {
                index,
                meta: &self.meta,
            }
            .copies_many(kind, keys),
        }
    }

    /// Pins the units of a version a backup reads anyway (the previous one,
    /// to predict chunks from; see the predict module) and returns each one's
    /// record, with the copy new data may dedup to when it is usable. A
    /// missing record is an error: the recipe names it.
    pub(crate) fn read_pin(
        &self,
        ids: &[u64],
        pinned: &mut Vec<u64>,
    ) -> Result<Vec<(UnitRecord, Option<UnitCopy>)>> {
        self.pin_read(ids, pinned)?
            .into_iter()
            .zip(ids)
            .map(|((u, copy), &id)| Ok((crate::meta::referenced(id, u)?, copy)))
            .collect()
    }

    /// Pins each unit of `ids` that no slide or gc has doomed, then reads
    /// every record (pinned first, read after: see [`Store::lookup_pin`]).
    /// A pinned unit whose record is there and complete is a usable copy: it
    /// stays pinned, its id appended to `pinned` for the caller to unpin when
    /// done. The others are unpinned at once.
    fn pin_read(
        &self,
        ids: &[u64],
        pinned: &mut Vec<u64>,
    ) -> Result<Vec<(Option<UnitRecord>, Option<UnitCopy>)>> {
        let held: Vec<bool> = {
            let mut guard = self.pins.lock();
            let p = &mut *guard;
            ids.iter()
                .map(|id| {
                    let ok = !p.doomed.contains(id);
                    if ok {
                        *p.pins.entry(*id).or_default() += 1;
                    }
                    ok
                })
                .collect()
        };
        let records = match self.meta.units_many(ids) {
            Ok(r) => r,
            Err(e) => {
                self.unpin(ids.iter().zip(&held).filter(|x| *x.1).map(|x| *x.0));
                return Err(e);
            }
        };
        let mut unusable = Vec::new();
        let out = ids
            .iter()
            .zip(held)
            .zip(records)
            .map(|((&id, held), u)| {
                let copy = u
                    .as_ref()
                    .filter(|u| held && !u.trimmed)
                    .map(|u| UnitCopy::of(id, u));
                if copy.is_some() {
                    pinned.push(id);
                } else if held {
                    unusable.push(id);
                }
                (u, copy)
            })
            .collect();
        self.unpin(unusable);
        Ok(out)
    }

    /// Marks a unit as about to be trimmed or freed, unless a backup pinned it.
    pub(crate) fn try_doom(&self, id: u64) -> bool {
        let mut p = self.pins.lock();
        if p.pins.contains_key(&id) {
            return false;
        }
        p.doomed.insert(id);
        true
    }

    pub(crate) fn undoom(&self, ids: impl IntoIterator<Item = u64>) {
        let mut p = self.pins.lock();
        for id in ids {
            p.doomed.remove(&id);
        }
    }

    /// Units whose references reached zero while a backup had them pinned
    /// (recorded by the commit that dropped the last reference).
    pub(crate) fn zombies(&self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        self.meta
            .for_each_prefix(crate::format::keys::CF_MARKS, b"Z", |k, _| {
                out.extend(crate::format::keys::prefixed_id(k));
                Ok(true)
            })?;
        Ok(out)
    }

    pub(crate) fn is_pinned(&self, id: u64) -> bool {
        self.pins.lock().pins.contains_key(&id)
    }

    pub(crate) fn unpin(&self, ids: impl IntoIterator<Item = u64>) {
        let mut p = self.pins.lock();
        for id in ids {
            if let Some(n) = p.pins.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    p.pins.remove(&id);
                }
            }
        }
    }
}

/// A stored unit new data can dedup to: what a backup needs to reference it
/// and to judge where it lies (the rewrite policies look at its container).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UnitCopy {
    pub id: u64,
    pub container: ContainerId,
    pub vbase: u64,
}

impl UnitCopy {
    pub fn of(id: u64, u: &UnitRecord) -> Self {
        UnitCopy {
            id,
            container: u.container,
            vbase: u.vbase,
        }
    }
}

#[derive(Default)]
pub(crate) struct PinState {
    /// A backup pins every unit it may reference (tens of thousands in
    /// chunk mode): a fast hash, not the DoS-resistant default, since unit
    /// ids are ours.
    pub(crate) pins: FxHashMap<u64, u32>,
    pub(crate) doomed: FxHashSet<u64>,
}

/// Releases doomed units when a slide or gc ends, committed or not.
pub(crate) struct Undoom<'s>(pub &'s Store, pub Vec<u64>);

impl Drop for Undoom<'_> {
    fn drop(&mut self) {
        self.0.undoom(self.1.drain(..));
    }
}
