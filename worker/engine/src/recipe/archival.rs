//! Reading archival versions: recipes of direct, indirect and zero chunk
//! references. Indirect references point at positions of a newer version of the
//! same series, which may itself be archival, so a restore resolves whole
//! recipes level by level — newest first — into one location per chunk
//! position, instead of chasing pointers chunk by chunk.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{corrupt_meta, Result};
use crate::format::container::{ContainerId, CHUNK_ZERO};
use crate::format::recipe::Entry;
use crate::format::records::{RecipeForm, SeriesRecord, VersionRecord};
use crate::format::unit::UnitRecord;
use crate::meta::load_units;
use crate::meta::MetaRead;
use crate::recipe::{push_extent, recipe_entries, Extent};

/// Where one chunk position's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    Stored {
        container: ContainerId,
        vaddr: u64,
        len: u32,
    },
    Zero {
        len: u32,
    },
}

impl Loc {
    pub(crate) fn extent(self) -> Extent {
        match self {
            Loc::Stored {
                container,
                vaddr,
                len,
            } => Extent::Stored {
                container,
                vaddr,
                len: u64::from(len),
            },
            Loc::Zero { len } => Extent::Zero {
                len: u64::from(len),
            },
        }
    }
}

/// Unit records for `ids` and for every unit their links point into.
pub(crate) fn load_with_links(r: &impl MetaRead, ids: &[u64]) -> Result<HashMap<u64, UnitRecord>> {
    let mut units: HashMap<u64, UnitRecord> =
        ids.iter().copied().zip(load_units(r, ids)?).collect();
    let mut targets: Vec<u64> = units
        .values()
        .flat_map(|u| u.chunks.iter().filter_map(|c| c.link_target().map(|l| l.0)))
        .filter(|t| !units.contains_key(t))
        .collect();
    targets.sort_unstable();
    targets.dedup();
    units.extend(targets.iter().copied().zip(load_units(r, &targets)?));
    Ok(units)
}

/// Locations of a unit's chunks `first..first+count`, following links.
pub(crate) fn unit_locs(
    units: &HashMap<u64, UnitRecord>,
    uid: u64,
    first: usize,
    count: usize,
    out: &mut Vec<Loc>,
) -> Result<()> {
    let u = units
        .get(&uid)
        .ok_or_else(|| corrupt_meta(format!("unit {uid}"), "referenced but missing"))?;
    if first + count > u.chunks.len() {
        return Err(corrupt_meta(
            format!("unit {uid}"),
            "a recipe references chunks beyond the unit",
        ));
    }
    let mut vaddr = u.chunk_vaddr(first);
    for c in &u.chunks[first..first + count] {
        if c.flags & CHUNK_ZERO != 0 {
            out.push(Loc::Zero { len: c.len });
        } else if let Some((t, j)) = c.link_target() {
            let tu = units.get(&t).ok_or_else(|| {
                corrupt_meta(
                    format!("unit {uid}"),
                    format!("links to unit {t}, which is missing"),
                )
            })?;
            let tc = tu
                .chunks
                .get(j as usize)
                .filter(|tc| tc.stored_len() > 0 && tc.fp == c.fp);
            if tc.is_none() {
                return Err(corrupt_meta(
                    format!("unit {uid}"),
                    format!("links to chunk {j} of unit {t}, which does not hold it"),
                ));
            }
            out.push(Loc::Stored {
                container: tu.container,
                vaddr: tu.chunk_vaddr(j as usize),
                len: c.len,
            });
        } else if c.stored_len() == 0 {
            return Err(corrupt_meta(
                format!("unit {uid}"),
                "a recipe references a removed chunk",
            ));
        } else {
            out.push(Loc::Stored {
                container: u.container,
                vaddr,
                len: c.len,
            });
            vaddr += u64::from(c.len);
        }
    }
    Ok(())
}

/// Resolves one recipe into per-position locations, given the already
/// resolved newer versions it points into.
fn resolve_entries(
    r: &impl MetaRead,
    what: &str,
    parts: &[Vec<Entry>],
    newer: &BTreeMap<u32, Vec<Loc>>,
) -> Result<Vec<Loc>> {
    let mut out = Vec::new();
    for entries in parts {
        let mut ids = Vec::new();
        for e in entries {
            match *e {
                Entry::Units { first, count } => ids.extend(first..first + count),
                Entry::Direct { unit, .. } => ids.push(unit),
                _ => {}
            }
        }
        ids.sort_unstable();
        ids.dedup();
        let units = load_with_links(r, &ids)?;
        for e in entries {
            match *e {
                Entry::Units { first, count } => {
                    for id in first..first + count {
                        let n = units.get(&id).map(|u| u.chunks.len()).unwrap_or(0);
                        unit_locs(&units, id, 0, n, &mut out)?;
                    }
                }
                Entry::Direct { unit, first, count } => {
                    unit_locs(&units, unit, first as usize, count as usize, &mut out)?
                }
                Entry::Zero { len, count } => (0..count).for_each(|_| out.push(Loc::Zero { len })),
                Entry::Indirect {
                    version,
                    first,
                    count,
                } => {
                    let src = newer.get(&version).ok_or_else(|| {
                        corrupt_meta(
                            format!("recipe of {what}"),
                            format!("points into version {version}, which is not resolved"),
                        )
                    })?;
                    let (a, b) = (first as usize, (first + count) as usize);
                    if b > src.len() {
                        return Err(corrupt_meta(
                            format!("recipe of {what}"),
                            format!("points past the end of version {version}"),
                        ));
                    }
                    out.extend_from_slice(&src[a..b]);
                }
            }
        }
    }
    Ok(out)
}

fn indirect_targets(parts: &[Vec<Entry>]) -> BTreeSet<u32> {
    parts
        .iter()
        .flatten()
        .filter_map(|e| match e {
            Entry::Indirect { version, .. } => Some(*version),
            _ => None,
        })
        .collect()
}

/// Per-position locations of `v` and every version its references reach,
/// and the depth of the longest indirect chain.
pub(crate) fn resolve_positions(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
    parts: Vec<Vec<Entry>>,
) -> Result<(Vec<Loc>, u32)> {
    // Collect the versions reachable through indirect references.
    let mut recipes: BTreeMap<u32, Vec<Vec<Entry>>> = BTreeMap::new();
    let mut todo: Vec<u32> = indirect_targets(&parts).into_iter().collect();
    recipes.insert(v.number, parts);
    while let Some(n) = todo.pop() {
        if recipes.contains_key(&n) {
            continue;
        }
        if n <= v.number {
            return Err(corrupt_meta(
                format!("recipe of {} version {}", series.name, v.number),
                format!("indirect reference to older version {n}"),
            ));
        }
        let rec = r.version(series, n)?.ok_or_else(|| {
            corrupt_meta(
                format!("recipe of {} version {}", series.name, v.number),
                format!("points into version {n}, which does not exist"),
            )
        })?;
        let p = recipe_entries(r, series, &rec)?;
        if rec.form == RecipeForm::Archival {
            todo.extend(indirect_targets(&p));
        }
        recipes.insert(n, p);
    }
    // Newest first: every version's targets are resolved before it.
    let mut resolved: BTreeMap<u32, Vec<Loc>> = BTreeMap::new();
    let mut depth: BTreeMap<u32, u32> = BTreeMap::new();
    for (&n, p) in recipes.iter().rev() {
        let what = format!("{} version {}", series.name, n);
        let locs = resolve_entries(r, &what, p, &resolved)?;
        let d = indirect_targets(p)
            .iter()
            .map(|t| depth[t] + 1)
            .max()
            .unwrap_or(0);
        depth.insert(n, d);
        resolved.insert(n, locs);
    }
    let locs = resolved
        .remove(&v.number)
        .expect("resolved the version itself");
    Ok((locs, depth[&v.number]))
}

/// Extents of an archival version.
pub(crate) fn resolve_archival(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
    parts: Vec<Vec<Entry>>,
) -> Result<(Vec<Extent>, u32)> {
    let (locs, depth) = resolve_positions(r, series, v, parts)?;
    Ok((loc_extents(&locs), depth))
}

/// Chunk positions as extents, adjacent ones merged.
pub(crate) fn loc_extents(locs: &[Loc]) -> Vec<Extent> {
    let mut out = Vec::with_capacity(locs.len() / 4 + 1);
    for l in locs {
        push_extent(&mut out, l.extent());
    }
    out
}

/// One chunk position of a recipe, as a reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ref {
    Direct { unit: u64, idx: u32 },
    Indirect { version: u32, pos: u64 },
    Zero { len: u32 },
}

/// Expands recipe entries into one reference per chunk position (zero chunks
/// inside units become `Zero`), with the records of every unit referenced.
pub(crate) fn expand_refs(
    r: &impl MetaRead,
    parts: &[Vec<Entry>],
) -> Result<(Vec<Ref>, HashMap<u64, UnitRecord>)> {
    let mut ids: Vec<u64> = Vec::new();
    for e in parts.iter().flatten() {
        match *e {
            Entry::Units { first, count } => ids.extend(first..first + count),
            Entry::Direct { unit, .. } => ids.push(unit),
            _ => {}
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let units: HashMap<u64, UnitRecord> = ids.iter().copied().zip(load_units(r, &ids)?).collect();
    let mut out = Vec::new();
    let chunk_ref = |uid: u64, u: &UnitRecord, i: usize| {
        let c = &u.chunks[i];
        if c.flags & CHUNK_ZERO != 0 {
            Ref::Zero { len: c.len }
        } else {
            Ref::Direct {
                unit: uid,
                idx: i as u32,
            }
        }
    };
    for e in parts.iter().flatten() {
        match *e {
            Entry::Units { first, count } => {
                for uid in first..first + count {
                    let u = &units[&uid];
                    for i in 0..u.chunks.len() {
                        out.push(chunk_ref(uid, u, i));
                    }
                }
            }
            Entry::Direct { unit, first, count } => {
                let u = &units[&unit];
                if (first + count) as usize > u.chunks.len() {
                    return Err(corrupt_meta(
                        format!("unit {unit}"),
                        "a recipe references chunks beyond the unit",
                    ));
                }
                for i in first..first + count {
                    out.push(chunk_ref(unit, u, i as usize));
                }
            }
            Entry::Indirect {
                version,
                first,
                count,
            } => out.extend((first..first + count).map(|pos| Ref::Indirect { version, pos })),
            Entry::Zero { len, count } => out.extend((0..count).map(|_| Ref::Zero { len })),
        }
    }
    Ok((out, units))
}

/// Encodes per-position references as (merged) archival recipe entries.
pub(crate) fn refs_to_recipe(refs: &[Ref]) -> crate::format::recipe::RecipeBuilder {
    let mut b = crate::format::recipe::RecipeBuilder::new();
    for r in refs {
        b.push(match *r {
            Ref::Direct { unit, idx } => Entry::Direct {
                unit,
                first: idx,
                count: 1,
            },
            Ref::Indirect { version, pos } => Entry::Indirect {
                version,
                first: pos,
                count: 1,
            },
            Ref::Zero { len } => Entry::Zero { len, count: 1 },
        });
    }
    b
}
