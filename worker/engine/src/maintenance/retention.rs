//! Which versions a series' retention keeps. Pure, so it is table-tested.
//!
//! A version is kept when *any* rule keeps it (like restic's `forget`):
//! `keep N` keeps the newest N; `keep-within D` keeps versions whose time is
//! within D of the *newest version's* time (not of the clock, so a series that
//! stopped backing up is not emptied). With neither rule everything is kept,
//! and the newest version is always kept.

use crate::config::DedupUnit;
use crate::error::{Error, Result};
use crate::format::records::{Retention, SeriesRecord, VersionRecord};
use crate::meta::MetaRead;
use crate::store::commit::Txn;
use crate::store::{check_series_name, now_unix, Store};

/// Stores a series' retention, creating the series (without versions) if it
/// does not exist yet, so a policy can be set before the first backup. Returns
/// the series and whether this call created it (decided under the series'
/// claim: of two callers only one creates it, the other finds it busy or made).
/// `auto` as the caller gave it or, when it did not say, what the series has now (a new
/// series: the default, automatic). A `retention set --keep 14` on a series someone turned
/// to manual slides must not turn automatic expiry back on.
pub fn auto_or_current(store: &Store, series: &str, auto: Option<bool>) -> Result<bool> {
    match auto {
        Some(a) => Ok(a),
        None => Ok(store
            .meta
            .series(series)?
            .map_or(Retention::default().auto, |s| s.retention.auto)),
    }
}

pub fn set_retention(store: &Store, series: &str, r: Retention) -> Result<(SeriesRecord, bool)> {
    store.require_writable()?;
    check_series_name(series)?;
    if r.live == 0 {
        return Err(Error::Invalid(
            "the live window must hold at least one version".into(),
        ));
    }
    if r.keep == Some(0) {
        return Err(Error::Invalid(
            "keep must be at least 1 (the newest version is always kept)".into(),
        ));
    }
    if let Some(k) = r.keep {
        if r.live > k {
            return Err(Error::Invalid(format!(
                "the live window ({}) cannot be larger than keep ({k})",
                r.live
            )));
        }
    }
    let _claim = store.claim_series(series)?;
    let (id, created) = match store.meta.series(series)? {
        Some(s) => (s.id, false),
        None => (store.alloc_series(), true),
    };
    let name = series.to_string();
    let mut txn = Txn::default();
    let r2 = r.clone();
    txn.series_updates.push((
        name.clone(),
        Box::new(move |cur| match cur {
            Some(mut s) => {
                s.retention = r2;
                s
            }
            None => SeriesRecord {
                id,
                name,
                unit: DedupUnit::default(),
                created_unix: now_unix(),
                next_version: 1,
                retention: r2,
                generation: 0,
                deleted_since_gc: false,
                rewrite: Default::default(),
                last: Default::default(),
            },
        }),
    ));
    store.commit(txn)?;
    Ok((store.series(series)?, created))
}

/// A series' versions in ascending order → the numbers its retention no longer keeps (what
/// the next expiry by retention removes).
pub fn plan_expiry(versions: &[VersionRecord], r: &Retention) -> Vec<u32> {
    let at: Vec<(u32, i64)> = versions.iter().map(|v| (v.number, v.time_unix)).collect();
    plan(&at, r)
}

/// Versions (number, time) in ascending order → the numbers to expire.
fn plan(versions: &[(u32, i64)], r: &Retention) -> Vec<u32> {
    if versions.is_empty() || (r.keep.is_none() && r.keep_within_secs.is_none()) {
        return Vec::new();
    }
    let newest_time = versions.iter().map(|v| v.1).max().unwrap_or(0);
    let n = versions.len();
    versions
        .iter()
        .enumerate()
        .filter(|(i, (_, t))| {
            let by_count = r.keep.is_some_and(|k| n - i <= k as usize);
            let by_age = r
                .keep_within_secs
                .is_some_and(|d| newest_time - t <= d as i64);
            let newest = *i == n - 1;
            !(by_count || by_age || newest)
        })
        .map(|(_, (v, _))| *v)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{InitOptions, OpenMode};

    #[test]
    fn storing_a_retention_says_whether_it_created_the_series() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let store = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        let keep = |k| Retention {
            keep: Some(k),
            ..Default::default()
        };
        let (s, created) = set_retention(&store, "default/db", keep(3)).unwrap();
        assert!(created);
        assert_eq!(s.retention.keep, Some(3));
        let (s, created) = set_retention(&store, "default/db", keep(2)).unwrap();
        assert!(!created, "the second call replaces the retention");
        assert_eq!(s.retention.keep, Some(2));
        assert_eq!(store.series("default/db").unwrap().retention.keep, Some(2));
    }

    fn r(keep: Option<u32>, within: Option<u64>) -> Retention {
        Retention {
            keep,
            keep_within_secs: within,
            ..Default::default()
        }
    }

    #[test]
    fn retention_table() {
        let day = 86_400i64;
        let vs: Vec<(u32, i64)> = (1..=6).map(|v| (v, i64::from(v) * day)).collect();
        let cases: &[(&str, Retention, &[u32])] = &[
            ("no rules keep everything", r(None, None), &[]),
            ("keep 3", r(Some(3), None), &[1, 2, 3]),
            ("keep more than exist", r(Some(10), None), &[]),
            ("keep 1", r(Some(1), None), &[1, 2, 3, 4, 5]),
            (
                "within 2 days of the newest",
                r(None, Some(2 * day as u64)),
                &[1, 2, 3],
            ),
            (
                "within 0 keeps the newest",
                r(None, Some(0)),
                &[1, 2, 3, 4, 5],
            ),
            (
                "union: keep 1 or within 3 days",
                r(Some(1), Some(3 * day as u64)),
                &[1, 2],
            ),
            (
                "union: keep 4 or within 1 day",
                r(Some(4), Some(day as u64)),
                &[1, 2],
            ),
        ];
        for (name, ret, want) in cases {
            assert_eq!(plan(&vs, ret), *want, "{name}");
        }
        assert!(plan(&[], &r(Some(1), None)).is_empty());
        // Out-of-order times: age is measured from the newest time, not the last number.
        let odd = [(1, 100), (2, 50), (3, 90)];
        assert_eq!(plan(&odd, &r(None, Some(15))), vec![2]);
    }
}
