//! What a backup may deduplicate against ([`DedupScope`]), from the store's dedup domain
//! and the series' latest version (see `store::domain`).

use std::ops::Range;

use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::recipe::Entry;
use crate::format::records::{RecipeForm, SeriesRecord, VersionRecord};
use crate::meta::MetaRead;
use crate::store::domain::{domain_tag, DedupDomain, DedupScope};

/// The scope of a backup of series `name` (its record and latest version, if any).
pub(super) fn dedup_scope(
    domain: DedupDomain,
    meta: &impl MetaRead,
    name: &str,
    series: Option<&SeriesRecord>,
    latest: Option<&VersionRecord>,
) -> Result<DedupScope> {
    if domain == DedupDomain::Store {
        return Ok(DedupScope::Any);
    }
    // Only segment mode needs the list: in chunk mode the chunk predictor hands the dedup
    // stage the previous version's units, pinned, without a lookup, and a chunk-mode recipe
    // is runs of one unit (its list would take memory in proportion to the version). A
    // recipe that cannot be read costs dedup against old units, not the backup.
    let own = match (series, latest) {
        (Some(s), Some(v)) if s.unit == DedupUnit::Segment => own_units(meta, s, v)
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "the latest recipe is unreadable: no dedup against the series' own older units");
                Vec::new()
            }),
        _ => Vec::new(),
    };
    Ok(DedupScope::Domain {
        tag: domain_tag(name),
        own,
    })
}

/// The unit ids a live version references, as sorted disjoint ranges (a live recipe is
/// runs of consecutive ids, so this stays small). An archival version (not the latest of
/// a series in practice) admits nothing extra.
fn own_units(
    meta: &impl MetaRead,
    series: &SeriesRecord,
    v: &VersionRecord,
) -> Result<Vec<Range<u64>>> {
    if v.form != RecipeForm::Live {
        return Ok(Vec::new());
    }
    let mut runs: Vec<Range<u64>> = crate::recipe::recipe_entries(meta, series, v)?
        .into_iter()
        .flatten()
        .filter_map(|e| match e {
            Entry::Units { first, count } if count > 0 => Some(first..first + count),
            _ => None,
        })
        .collect();
    runs.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    Ok(out)
}
