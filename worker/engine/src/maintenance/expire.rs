//! Expire: delete versions, in time proportional to what they reference.
//!
//! Deleting version V drops V's references: a live recipe's live reference on
//! each of its units, an archival recipe's archival reference on each unit it
//! references directly. Units left unreferenced are freed, and containers left
//! empty — typically the ones slide packed for V alone — are deleted whole.
//! Nothing else in the store is read.
//!
//! Only the previous version of the series (P) can point into V: indirect
//! references always target the next existing version. If P does, its indirect
//! references are *spliced* onto what V's positions refer to — V's direct
//! chunks (P takes over an archival reference on those units, so whatever P
//! still needs is handed over before V lets go) or V's own indirect references
//! into the version after V — so P stays restorable.

use std::collections::HashSet;
use std::time::Instant;

use serde::Serialize;

use crate::error::{corrupt_meta, Error, Result};
use crate::format::keys::{part_key, version_key, CF_CATALOGS, CF_RECIPES, CF_VERSIONS};
use crate::format::recipe::Entry;
use crate::format::records::{RecipeForm, SeriesRecord, VersionRecord};
use crate::recipe::archival::{expand_refs, Ref};
use crate::recipe::recipe_entries;
use crate::store::commit::Txn;
use crate::store::Store;

#[derive(Clone, Debug)]
pub enum ExpireSel {
    Version(u32),
    /// Every version older than this time (unix seconds); the newest version is kept.
    Before(i64),
    /// What the series' stored retention no longer keeps.
    Retention,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ExpireReport {
    pub series: String,
    pub expired: Vec<u32>,
    /// Older versions whose references were spliced onto a deleted one's.
    pub spliced: Vec<u32>,
    pub units_freed: u64,
    pub containers_freed: u64,
    pub bytes_freed: u64,
    pub logical_bytes_expired: u64,
    pub seconds: f64,
}

pub fn expire(store: &Store, series: &str, sel: &ExpireSel) -> Result<ExpireReport> {
    store.require_writable()?;
    let _claim = store.claim_series(series)?;
    expire_claimed(store, series, sel)
}

pub(crate) fn expire_claimed(store: &Store, series: &str, sel: &ExpireSel) -> Result<ExpireReport> {
    let _m = store.maintenance();
    let started = Instant::now();
    let s = store.series(series)?;
    let versions = store.versions(&s)?;
    let doomed: Vec<u32> = match sel {
        ExpireSel::Version(n) => {
            if !versions.iter().any(|v| v.number == *n) {
                return Err(Error::UnknownVersion {
                    series: s.name.clone(),
                    version: n.to_string(),
                    latest: versions.last().map(|v| v.number),
                });
            }
            vec![*n]
        }
        ExpireSel::Before(t) => {
            let newest = versions.last().map(|v| v.number);
            versions
                .iter()
                .filter(|v| v.time_unix < *t && Some(v.number) != newest)
                .map(|v| v.number)
                .collect()
        }
        ExpireSel::Retention => {
            crate::maintenance::retention::plan_expiry(&versions, &s.retention)?
        }
    };
    let mut rep = ExpireReport {
        series: s.name.clone(),
        ..Default::default()
    };
    // Oldest first: then no splicing is needed for the common case.
    for n in doomed {
        let s = store.series(series)?;
        let versions = store.versions(&s)?;
        let i = versions
            .iter()
            .position(|v| v.number == n)
            .expect("listed above");
        let prev = i.checked_sub(1).map(|j| &versions[j]);
        expire_one(store, &s, &versions[i], prev, &mut rep)?;
        rep.expired.push(n);
    }
    rep.seconds = started.elapsed().as_secs_f64();
    Ok(rep)
}

fn distinct_units(form: RecipeForm, parts: &[Vec<Entry>]) -> HashSet<u64> {
    let mut out = HashSet::new();
    for e in parts.iter().flatten() {
        match (*e, form) {
            (Entry::Units { first, count }, RecipeForm::Live) => out.extend(first..first + count),
            (Entry::Direct { unit, .. }, RecipeForm::Archival) => {
                out.insert(unit);
            }
            _ => {}
        }
    }
    out
}

fn expire_one(
    store: &Store,
    s: &SeriesRecord,
    v: &VersionRecord,
    prev: Option<&VersionRecord>,
    rep: &mut ExpireReport,
) -> Result<()> {
    let mut txn = Txn::default();
    let ex = Expiring {
        s,
        v,
        parts: recipe_entries(&store.meta, s, v)?,
    };
    // Splice the previous version if it points into this one.
    if let Some(p) = prev.filter(|p| p.form == RecipeForm::Archival) {
        let p_parts = recipe_entries(&store.meta, s, p)?;
        if ex.pointed_into_by(&p_parts) {
            ex.splice(store, p, &p_parts, &mut txn)?;
            rep.spliced.push(p.number);
        }
    }
    ex.drop_references(&mut txn);
    ex.delete_records(&mut txn);
    store.failpoint("expire.before_commit")?;
    let out = store.commit(txn)?;
    rep.units_freed += out.freed_units;
    rep.containers_freed += out.freed_containers;
    rep.bytes_freed += out.freed_bytes;
    rep.logical_bytes_expired += v.logical_bytes;
    Ok(())
}

/// The version being expired (V), with its recipe.
struct Expiring<'a> {
    s: &'a SeriesRecord,
    v: &'a VersionRecord,
    parts: Vec<Vec<Entry>>,
}

impl Expiring<'_> {
    /// Whether the previous version's recipe (`p_parts`) refers into V.
    fn pointed_into_by(&self, p_parts: &[Vec<Entry>]) -> bool {
        p_parts
            .iter()
            .flatten()
            .any(|e| matches!(e, Entry::Indirect { version, .. } if *version == self.v.number))
    }

    /// A step: P's references into V take what V's positions hold, and P takes an
    /// archival reference on each unit it now references directly and did not before
    /// (handed over in the same commit in which V lets go).
    fn splice(
        &self,
        store: &Store,
        p: &VersionRecord,
        p_parts: &[Vec<Entry>],
        txn: &mut Txn,
    ) -> Result<()> {
        let (v_refs, _) = expand_refs(&store.meta, &self.parts)?;
        let (p_refs, _) = expand_refs(&store.meta, p_parts)?;
        let before = distinct_units(RecipeForm::Archival, p_parts);
        let spliced = self.spliced_refs(p, p_refs, &v_refs)?;
        let mut after = HashSet::new();
        for r in &spliced {
            if let Ref::Direct { unit, .. } = r {
                after.insert(*unit);
            }
        }
        for u in after.difference(&before) {
            txn.ref_delta(*u, 0, 1);
        }
        super::stage_recipe(txn, self.s.id, p, p.clone(), &spliced);
        Ok(())
    }

    /// P's references with each one into V replaced by what V holds at that position.
    fn spliced_refs(
        &self,
        p: &VersionRecord,
        p_refs: Vec<Ref>,
        v_refs: &[Ref],
    ) -> Result<Vec<Ref>> {
        let (s, v) = (self.s, self.v);
        let mut spliced = Vec::with_capacity(p_refs.len());
        for r in p_refs {
            spliced.push(match r {
                Ref::Indirect { version, pos } if version == v.number => {
                    *v_refs.get(pos as usize).ok_or_else(|| {
                        corrupt_meta(
                            format!("recipe of {} version {}", s.name, p.number),
                            format!("points past the end of version {}", v.number),
                        )
                    })?
                }
                other => other,
            });
        }
        Ok(spliced)
    }

    /// A step: V drops its own references: a live recipe its live reference on each of
    /// its units, an archival recipe its archival reference on each unit it references
    /// directly.
    fn drop_references(&self, txn: &mut Txn) {
        for u in distinct_units(self.v.form, &self.parts) {
            match self.v.form {
                RecipeForm::Live => txn.ref_delta(u, -1, 0),
                RecipeForm::Archival => txn.ref_delta(u, 0, -1),
            }
        }
    }

    /// A step: V's records (version, recipe, catalog) go, with their share of the totals;
    /// the series' generation moves on and it is flagged for gc's mark phase.
    fn delete_records(&self, txn: &mut Txn) {
        let (s, v) = (self.s, self.v);
        txn.deletes
            .push((CF_VERSIONS, version_key(s.id, v.number).to_vec()));
        txn.delete_ranges.push((
            CF_RECIPES,
            part_key(s.id, v.number, 0).to_vec(),
            part_key(s.id, v.number, u32::MAX).to_vec(),
        ));
        txn.delete_ranges.push((
            CF_CATALOGS,
            part_key(s.id, v.number, 0).to_vec(),
            part_key(s.id, v.number, u32::MAX).to_vec(),
        ));
        txn.totals.logical_bytes -= v.logical_bytes as i64;
        txn.totals.versions -= 1;
        txn.totals.recipe_bytes -= v.recipe_bytes as i64;
        txn.totals.catalog_bytes -= v.catalog_bytes as i64;
        txn.series_updates.push((
            s.name.clone(),
            Box::new(|cur| {
                let mut s = cur.expect("the series exists while it is claimed");
                s.generation += 1;
                s.deleted_since_gc = true;
                s
            }),
        ));
    }
}
