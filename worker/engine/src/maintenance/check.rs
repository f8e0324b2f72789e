//! `check`: verifies the whole store.
//!
//! - every container: header, trailer and footer checksums, every block's
//!   checksum and decompression, and every stored chunk against its BLAKE3
//!   fingerprint;
//! - every version: recipe and catalog checksums, every reference resolves
//!   (units exist, chunk ranges are in bounds, indirect chains end in stored
//!   data), and the version's size matches its recipe;
//! - bookkeeping: reference counts recomputed from the recipes, container live
//!   counts recomputed from the units, index entries point at complete units;
//! - files in the data directory that no container record names: freed ones
//!   a crash left behind (warnings; `gc` removes them), and files nothing
//!   explains or gc quarantined (errors: the metadata may have lost writes).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::Result;
use crate::format::container::{ContainerId, CHUNK_ZERO};
use crate::format::fp::Fp;
use crate::format::keys::{CF_CONTAINERS, CF_INDEX, CF_UNITS};
use crate::format::recipe::Entry;
use crate::format::records::{ContainerRecord, RecipeForm, SeriesRecord, VersionRecord};
use crate::format::refcounts::Refs;
use crate::format::unit::UnitRecord;
use crate::meta::scan_refs;
use crate::meta::MetaRead;
use crate::recipe::archival::resolve_positions;
use crate::recipe::{load_catalog, recipe_entries};
use crate::store::{ReadView, Store};

#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub series: u64,
    pub versions: u64,
    pub units: u64,
    pub containers: u64,
    pub bytes_verified: u64,
    /// Problems that make data unreadable or bookkeeping wrong.
    pub errors: Vec<String>,
    /// Harmless leftovers (e.g. orphan files for `gc`).
    pub warnings: Vec<String>,
}

pub fn check(store: &Store) -> Result<CheckReport> {
    let mut rep = CheckReport::default();
    // One snapshot, so a check running beside writers sees a consistent store.
    let view = store.read_view();
    let meta = &view;
    let units = read_units(meta, &mut rep)?;
    let containers = read_containers(meta, &mut rep)?;
    rep.units = units.len() as u64;
    rep.containers = containers.len() as u64;
    check_containers(store, &containers, &units, &mut rep);
    let mut want = count_recipes(meta, &mut rep)?;
    check_links(&units, &mut want, &mut rep);
    compare_counts(meta, &units, &want, &mut rep)?;
    check_index(meta, &units, &mut rep)?;
    // Files nobody owns (crate::store::orphans says what each kind means).
    check_data_dir(store, &mut rep)?;

    rep.ok = rep.errors.is_empty();
    Ok(rep)
}

/// A step: every unit record, by id (one that does not decode is an error).
fn read_units(meta: &ReadView<'_>, rep: &mut CheckReport) -> Result<BTreeMap<u64, UnitRecord>> {
    let mut units: BTreeMap<u64, UnitRecord> = BTreeMap::new();
    for (k, v) in meta.scan(CF_UNITS, b"")? {
        let id = u64::from_be_bytes(k[..].try_into().unwrap_or_default());
        match UnitRecord::decode(id, &v) {
            Ok(u) => {
                units.insert(id, u);
            }
            Err(e) => rep.errors.push(e.to_string()),
        }
    }
    Ok(units)
}

/// A step: every container record, by id (one that does not decode is an error).
fn read_containers(
    meta: &ReadView<'_>,
    rep: &mut CheckReport,
) -> Result<BTreeMap<ContainerId, ContainerRecord>> {
    let mut containers: BTreeMap<ContainerId, ContainerRecord> = BTreeMap::new();
    for (k, v) in meta.scan(CF_CONTAINERS, b"")? {
        let id = ContainerId(u64::from_be_bytes(k[..].try_into().unwrap_or_default()));
        match ContainerRecord::decode(id, &v) {
            Ok(c) => {
                containers.insert(id, c);
            }
            Err(e) => rep.errors.push(e.to_string()),
        }
    }
    Ok(containers)
}

/// A step: each container's live counts recomputed from its units, and its file read and
/// verified; units in a container without a record are errors.
fn check_containers(
    store: &Store,
    containers: &BTreeMap<ContainerId, ContainerRecord>,
    units: &BTreeMap<u64, UnitRecord>,
    rep: &mut CheckReport,
) {
    let mut by_container: HashMap<ContainerId, Vec<u64>> = HashMap::new();
    for (id, u) in units {
        by_container.entry(u.container).or_default().push(*id);
    }
    for (cid, rec) in containers {
        let ids = by_container.remove(cid).unwrap_or_default();
        let live: u64 = ids.iter().map(|i| units[i].stored_vbytes()).sum();
        if live != rec.live_vbytes || ids.len() as u64 != rec.live_units {
            rep.errors.push(format!(
                "container {cid}: record says {} units / {} bytes live, units say {} / {}",
                rec.live_units,
                rec.live_vbytes,
                ids.len(),
                live
            ));
        }
        match verify_container(store, *cid, rec, &ids, units) {
            Ok(n) => rep.bytes_verified += n,
            Err(e) => rep.errors.push(e.to_string()),
        }
    }
    for (cid, ids) in by_container {
        rep.errors.push(format!(
            "container {cid} holds {} units but has no container record",
            ids.len()
        ));
    }
}

/// A step: every version of every series checked, and the live and archival references
/// its recipe makes counted, as the reference counts should say.
fn count_recipes(meta: &ReadView<'_>, rep: &mut CheckReport) -> Result<HashMap<u64, Refs>> {
    let mut want: HashMap<u64, Refs> = HashMap::new();
    for s in meta.all_series()? {
        rep.series += 1;
        let versions = match meta.versions(&s) {
            Ok(v) => v,
            Err(e) => {
                rep.errors.push(e.to_string());
                continue;
            }
        };
        for v in versions {
            rep.versions += 1;
            let ver = VersionCheck {
                meta,
                s: &s,
                what: format!("{} version {}", s.name, v.number),
                v: &v,
            };
            let parts = match recipe_entries(meta, &s, &v) {
                Ok(p) => p,
                Err(e) => {
                    rep.errors.push(e.to_string());
                    continue;
                }
            };
            ver.count_refs(&parts, &mut want, rep);
            ver.check_rebuild(parts, rep);
            if v.catalog_parts > 0 {
                ver.check_catalog(rep);
            }
        }
    }
    Ok(want)
}

/// One version under check, and how its errors name it.
struct VersionCheck<'a, 's> {
    meta: &'a ReadView<'s>,
    s: &'a SeriesRecord,
    v: &'a VersionRecord,
    what: String,
}

impl VersionCheck<'_, '_> {
    /// Each unit the recipe references counts once: a live reference from a live recipe,
    /// an archival one from an archival recipe; an entry of the wrong form is an error.
    fn count_refs(
        &self,
        parts: &[Vec<Entry>],
        want: &mut HashMap<u64, Refs>,
        rep: &mut CheckReport,
    ) {
        let (v, what) = (self.v, &self.what);
        let mut distinct = std::collections::HashSet::new();
        for e in parts.iter().flatten() {
            match *e {
                Entry::Units { first, count } if v.form == RecipeForm::Live => {
                    for id in first..first + count {
                        if distinct.insert(id) {
                            want.entry(id).or_default().live += 1;
                        }
                    }
                }
                Entry::Direct { unit, .. } if v.form == RecipeForm::Archival => {
                    if distinct.insert(unit) {
                        want.entry(unit).or_default().arch += 1;
                    }
                }
                Entry::Zero { .. } => {}
                Entry::Indirect { .. } if v.form == RecipeForm::Archival => {}
                _ => rep.errors.push(format!(
                    "recipe of {what}: entry {e:?} does not belong in a {:?} recipe",
                    v.form
                )),
            }
        }
    }

    /// Every reference resolves, and the recipe rebuilds the version's size.
    fn check_rebuild(&self, parts: Vec<Vec<Entry>>, rep: &mut CheckReport) {
        let (v, what) = (self.v, &self.what);
        match resolve_positions(self.meta, self.s, v, parts) {
            Ok((locs, _)) => {
                let bytes: u64 = locs
                    .iter()
                    .map(|l| match *l {
                        crate::recipe::archival::Loc::Stored { len, .. }
                        | crate::recipe::archival::Loc::Zero { len } => u64::from(len),
                    })
                    .sum();
                if bytes != v.logical_bytes || locs.len() as u64 != v.chunks {
                    rep.errors.push(format!(
                        "{what}: recipe rebuilds {bytes} bytes in {} chunks, the version has {} bytes in {} chunks",
                        locs.len(),
                        v.logical_bytes,
                        v.chunks
                    ));
                }
            }
            Err(e) => rep.errors.push(format!("{what}: {e}")),
        }
    }

    /// The catalog decodes, and its files hold the version's bytes.
    fn check_catalog(&self, rep: &mut CheckReport) {
        let (v, what) = (self.v, &self.what);
        match load_catalog(self.meta, self.s, v) {
            Ok(entries) => {
                let data: u64 = entries.iter().map(|e| e.data_len).sum();
                if data != v.logical_bytes {
                    rep.errors.push(format!(
                        "catalog of {what}: files hold {data} bytes, the recipe {}",
                        v.logical_bytes
                    ));
                }
            }
            Err(e) => rep.errors.push(e.to_string()),
        }
    }
}

/// A step: links: each points at a stored chunk with the same fingerprint, and
/// counts once per linking unit.
fn check_links(
    units: &BTreeMap<u64, UnitRecord>,
    want: &mut HashMap<u64, Refs>,
    rep: &mut CheckReport,
) {
    for (id, u) in units {
        for t in u.link_targets(*id) {
            want.entry(t).or_default().links += 1;
        }
        for (i, c) in u.chunks.iter().enumerate() {
            let Some((t, j)) = c.link_target() else {
                continue;
            };
            let ok = units
                .get(&t)
                .and_then(|tu| tu.chunks.get(j as usize))
                .is_some_and(|tc| tc.stored_len() > 0 && tc.fp == c.fp);
            // Inside one unit a link goes back, to the chunk's first copy.
            if !ok || (t == *id && j as usize >= i) {
                rep.errors.push(format!(
                    "unit {id}: chunk {i} links to chunk {j} of unit {t}, which does not hold it"
                ));
            }
        }
    }
}

/// A step: the stored reference counts against those the recipes and links make; a unit
/// nothing references is a warning (gc frees it), a referenced unit missing an error.
fn compare_counts(
    meta: &ReadView<'_>,
    units: &BTreeMap<u64, UnitRecord>,
    want: &HashMap<u64, Refs>,
    rep: &mut CheckReport,
) -> Result<()> {
    let mut have: HashMap<u64, Refs> = HashMap::new();
    let mut bad = Vec::new();
    have.extend(scan_refs(meta, |e| bad.push(e.to_string()))?);
    rep.errors.extend(bad);
    for id in units.keys() {
        let w = want.get(id).copied().unwrap_or_default();
        let h = have.get(id).copied().unwrap_or_default();
        if w != h {
            rep.errors.push(format!(
                "unit {id}: reference counts say {} live / {} archival / {} links, recipes say {} / {} / {}",
                h.live, h.arch, h.links, w.live, w.arch, w.links
            ));
        }
        if w.is_zero() {
            rep.warnings.push(format!(
                "unit {id} is referenced by no version (gc frees it)"
            ));
        }
    }
    for id in want.keys() {
        if !units.contains_key(id) {
            rep.errors.push(format!(
                "unit {id} is referenced by a recipe but does not exist"
            ));
        }
    }
    Ok(())
}

/// A step: index entries name complete units with the same fingerprint.
fn check_index(
    meta: &ReadView<'_>,
    units: &BTreeMap<u64, UnitRecord>,
    rep: &mut CheckReport,
) -> Result<()> {
    for (k, v) in meta.scan(CF_INDEX, b"")? {
        let fp = Fp(k[1..].try_into().unwrap_or_default());
        let Some(copies) = crate::index::decode_copies(&v) else {
            rep.errors.push(format!("index entry {fp} is malformed"));
            continue;
        };
        for id in copies {
            match units.get(&id) {
                Some(u) if u.index_fp() == fp && !u.trimmed => {}
                _ => rep.errors.push(format!(
                    "index entry {fp} names unit {id}, which is missing, trimmed or different"
                )),
            }
        }
    }
    Ok(())
}

/// Container files no record names: those a commit freed are left for gc;
/// those nothing explains mean the metadata may have lost writes, and gc
/// keeps them in quarantine; both are reported, the second as errors.
fn check_data_dir(store: &Store, rep: &mut CheckReport) -> Result<()> {
    use crate::store::orphans::{survey, FileState, QUARANTINE};
    let view = store.data_dir_view()?;
    let s = survey(store.data_dir(), &view)?;
    for f in &s.files {
        match f.state {
            FileState::Live | FileState::Pending => {}
            FileState::Freed => rep.warnings.push(format!(
                "orphan file {}: a commit freed it and a crash came before its unlink (gc removes it)",
                f.path.display()
            )),
            FileState::Unknown => rep.errors.push(format!(
                "file {}: no record names it and no commit freed it; the metadata may have lost \
                 writes (gc moves such files to {QUARANTINE}/ and never deletes them)",
                f.path.display()
            )),
        }
    }
    if s.quarantined_files > 0 {
        rep.errors.push(format!(
            "{} files ({} bytes) in {}: container files no record named when gc found them; the \
             metadata may have lost writes (docs/retention.md, \"Orphans and quarantine\")",
            s.quarantined_files,
            s.quarantined_bytes,
            store.data_dir().join(QUARANTINE).display()
        ));
    }
    Ok(())
}

/// Reads a container fully and checks every unit's chunks against their
/// fingerprints. Returns the bytes verified.
fn verify_container(
    store: &Store,
    id: ContainerId,
    rec: &ContainerRecord,
    ids: &[u64],
    units: &BTreeMap<u64, UnitRecord>,
) -> Result<u64> {
    let cf = store.open_container(id, true)?;
    if cf.file_len != rec.file_bytes || cf.footer.vbytes != rec.vbytes {
        return Err(crate::error::Error::CorruptContainer {
            container: id.to_string(),
            detail: format!(
                "file is {} bytes holding {} data bytes, the store recorded {} / {}",
                cf.file_len, cf.footer.vbytes, rec.file_bytes, rec.vbytes
            ),
        });
    }
    let data = cf.read_all()?;
    for uid in ids {
        let u = &units[uid];
        let mut off = u.vbase as usize;
        for (i, c) in u.chunks.iter().enumerate() {
            if c.flags & CHUNK_ZERO != 0 || c.stored_len() == 0 {
                continue;
            }
            let end = off + c.len as usize;
            if end > data.len() || Fp::of(&data[off..end]) != c.fp {
                return Err(crate::error::Error::CorruptContainer {
                    container: id.to_string(),
                    detail: format!("chunk {i} of unit {uid} does not match its fingerprint"),
                });
            }
            off = end;
        }
    }
    Ok(data.len() as u64)
}
