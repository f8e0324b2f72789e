//! Reading a version's recipe: its parts from the metadata store, resolved into extents —
//! runs of a unit's chunks, or zeros — in version order. A live recipe names whole units; an
//! archival one (RevDedup's indirect recipes) is resolved level by level in [`archival`].
//! Restores, transfers, slides, expiries and gc all read recipes through this room.

pub mod archival;

use std::collections::VecDeque;

use crate::error::{corrupt_meta, Result};
use crate::format::catalog;
use crate::format::container::ContainerId;
use crate::format::keys::{part_key, CF_CATALOGS, CF_RECIPES};
use crate::format::recipe::{decode_part, Entry};
use crate::format::records::{RecipeForm, SeriesRecord, VersionRecord};
use crate::meta::MetaRead;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    Stored {
        container: ContainerId,
        vaddr: u64,
        len: u64,
    },
    Zero {
        len: u64,
    },
}

impl Extent {
    pub fn len(&self) -> u64 {
        match *self {
            Extent::Stored { len, .. } | Extent::Zero { len } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Extends `self` with `next` when they are contiguous.
    fn absorb(&mut self, next: &Extent) -> bool {
        match (self, next) {
            (Extent::Zero { len }, Extent::Zero { len: l2 }) => {
                *len += l2;
                true
            }
            (
                Extent::Stored {
                    container,
                    vaddr,
                    len,
                },
                Extent::Stored {
                    container: c2,
                    vaddr: v2,
                    len: l2,
                },
            ) if container == c2 && *vaddr + *len == *v2 => {
                *len += l2;
                true
            }
            _ => false,
        }
    }
}

pub(crate) fn push_extent(out: &mut Vec<Extent>, e: Extent) {
    if e.is_empty() {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.absorb(&e) {
            return;
        }
    }
    out.push(e);
}

/// Reads a version's recipe parts.
pub(crate) fn recipe_entries(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<Vec<Entry>>> {
    let what = format!("{} version {}", series.name, v.number);
    let parts = version_parts(r, CF_RECIPES, "recipe", series, v, v.recipe_parts)?
        .iter()
        .map(|part| decode_part(&what, part))
        .collect::<Result<Vec<_>>>()?;
    // The readers expand entries per unit and per position: a recipe claiming more positions
    // than its version holds is refused before it is expanded into unbounded memory.
    let claimed = (parts.iter().flatten()).try_fold(0u64, |n, e| n.checked_add(e.min_positions()));
    if claimed.is_none_or(|n| n > v.chunks) {
        return Err(corrupt_meta(
            format!("recipe of {what}"),
            format!(
                "it covers more than the version's {} chunk positions",
                v.chunks
            ),
        ));
    }
    Ok(parts)
}

/// The stored parts of a version's recipe or catalog, in order.
fn version_parts(
    r: &impl MetaRead,
    cf: &str,
    kind: &str,
    s: &SeriesRecord,
    v: &VersionRecord,
    count: u32,
) -> Result<Vec<Vec<u8>>> {
    (0..count)
        .map(|i| {
            r.get_raw(cf, &part_key(s.id, v.number, i))?.ok_or_else(|| {
                corrupt_meta(
                    format!("{kind} of {} version {}", s.name, v.number),
                    format!("part {i} is missing"),
                )
            })
        })
        .collect()
}

/// Resolves a live recipe part into extents.
fn live_part_extents(r: &impl MetaRead, entries: &[Entry], out: &mut Vec<Extent>) -> Result<()> {
    let mut ids = Vec::new();
    for e in entries {
        if let Entry::Units { first, count } = *e {
            ids.extend(first..first + count);
        }
    }
    let units = archival::load_with_links(r, &ids)?;
    let mut locs = Vec::new();
    for e in entries {
        match *e {
            Entry::Units { first, count } => {
                for id in first..first + count {
                    locs.clear();
                    let n = units.get(&id).map(|u| u.chunks.len()).unwrap_or(0);
                    archival::unit_locs(&units, id, 0, n, &mut locs)?;
                    for l in &locs {
                        push_extent(out, l.extent());
                    }
                }
            }
            Entry::Zero { len, count } => push_extent(
                out,
                Extent::Zero {
                    len: u64::from(len) * count,
                },
            ),
            _ => {
                return Err(corrupt_meta(
                    "recipe",
                    "a live recipe holds a chunk reference",
                ))
            }
        }
    }
    Ok(())
}

/// The extents of a version, produced a recipe part at a time.
pub(crate) struct Extents {
    parts: VecDeque<Vec<Entry>>,
    ready: VecDeque<Extent>,
    /// Fully resolved extents (archival versions).
    resolved: bool,
}

impl Extents {
    /// Extents resolved up front (an archival version, or positions `auto` resolved).
    pub(crate) fn resolved(extents: Vec<Extent>) -> Self {
        Extents {
            parts: VecDeque::new(),
            ready: extents.into(),
            resolved: true,
        }
    }

    pub(crate) fn next(&mut self, r: &impl MetaRead) -> Result<Option<Extent>> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            if self.resolved {
                return Ok(None);
            }
            let Some(part) = self.parts.pop_front() else {
                return Ok(None);
            };
            let mut v = Vec::new();
            live_part_extents(r, &part, &mut v)?;
            self.ready.extend(v);
        }
    }
}

pub(crate) fn version_extents(
    r: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
) -> Result<(Extents, u32)> {
    let parts = recipe_entries(r, series, v)?;
    match v.form {
        RecipeForm::Live => Ok((
            Extents {
                parts: parts.into(),
                ready: VecDeque::new(),
                resolved: false,
            },
            0,
        )),
        RecipeForm::Archival => {
            let (extents, depth) = archival::resolve_archival(r, series, v, parts)?;
            Ok((Extents::resolved(extents), depth))
        }
    }
}

pub(crate) fn load_catalog(
    r: &impl MetaRead,
    s: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<catalog::Entry>> {
    let what = format!("{} version {}", s.name, v.number);
    catalog::decode(&what, &catalog_parts(r, s, v)?)
}

/// A tree version's catalog as stored (encoded parts).
pub(crate) fn catalog_parts(
    r: &impl MetaRead,
    s: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<Vec<u8>>> {
    version_parts(r, CF_CATALOGS, "catalog", s, v, v.catalog_parts)
}
