//! Which versions a series' retention keeps. Pure, so it is table-tested, and checked against
//! restic's `forget` on the same timestamps (`tests/retention_restic.rs`).
//!
//! The rules are restic's `forget` policy, evaluated the way restic 0.14 does: versions are
//! taken newest first (by time), and a version is kept when *any* rule keeps it:
//! - `keep N` keeps the newest N;
//! - `keep-within D` keeps versions strictly less than D older than the newest version's time
//!   (the newest not in the future; not the clock, so a series that stopped backing up is not
//!   emptied); a D of 0 is no rule;
//! - each calendar count (`hourly`, `daily`, `weekly`, `monthly`, `yearly`) keeps, walking
//!   newest first, every version whose hour (day, ISO week, month, year) in the retention's
//!   time zone differs from that of the last version the same count kept, until N are kept —
//!   the newest version of each of the last N periods that have one.
//!
//! With no rule everything is kept. Two additions restic has no need for: the newest version
//! (by number: the last backup) is always kept, and so are the live window's versions.

use crate::config::DedupUnit;
use crate::error::{Error, Result};
use crate::format::records::{Calendar, Retention, SeriesRecord, VersionRecord};
use crate::meta::MetaRead;
use crate::store::commit::Txn;
use crate::store::{check_series_name, now_unix, Store};

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

/// Stores a series' retention, creating the series (without versions) if it
/// does not exist yet, so a policy can be set before the first backup. Returns
/// the series and whether this call created it (decided under the series'
/// claim: of two callers only one creates it, the other finds it busy or made).
pub fn set_retention(
    store: &Store,
    series: &str,
    mut r: Retention,
) -> Result<(SeriesRecord, bool)> {
    store.require_writable()?;
    check_series_name(series)?;
    validate(&r)?;
    // Stored as what it means: no rule (a worker before calendar retention read a 0 as
    // "keep only the newest").
    r.keep_within_secs = r.keep_within_secs.filter(|d| *d > 0);
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
                moved_to: None,
            },
        }),
    ));
    store.commit(txn)?;
    Ok((store.series(series)?, created))
}

/// A series' versions in ascending order → the numbers its retention no longer keeps (what
/// the next expiry by retention removes). An error when the retention's time zone is not one
/// this build knows (it was checked when set; nothing is planned on a guess).
pub fn plan_expiry(versions: &[VersionRecord], r: &Retention) -> Result<Vec<u32>> {
    let at: Vec<(u32, i64)> = versions.iter().map(|v| (v.number, v.time_unix)).collect();
    Ok(plan(&at, r, &zone(&r.calendar)?, now_unix()))
}

/// The retention's time zone (UTC when it names none).
fn zone(c: &Calendar) -> Result<jiff::tz::TimeZone> {
    match c.timezone.as_deref() {
        None => Ok(jiff::tz::TimeZone::UTC),
        Some(name) => jiff::tz::TimeZone::get(name).map_err(|e| {
            Error::Invalid(format!(
                "time zone {name:?}: {e} (expected an IANA name such as Europe/Berlin or UTC)"
            ))
        }),
    }
}

/// The periods of the calendar a time falls in, in the order of [`Calendar::counts`], each
/// a number that differs between periods: YYYYMMDDHH, YYYYMMDD, ISO year and week, YYYYMM,
/// YYYY.
fn periods(t: i64, tz: &jiff::tz::TimeZone) -> [i64; 5] {
    // A time jiff cannot represent (beyond ±9999 years) is a period of its own.
    let Ok(ts) = jiff::Timestamp::from_second(t) else {
        return [t; 5];
    };
    let d = tz.to_datetime(ts);
    let (y, m, day, h) = (
        i64::from(d.year()),
        i64::from(d.month()),
        i64::from(d.day()),
        i64::from(d.hour()),
    );
    let w = d.date().iso_week_date();
    [
        ((y * 100 + m) * 100 + day) * 100 + h,
        (y * 100 + m) * 100 + day,
        i64::from(w.year()) * 100 + i64::from(w.week()),
        y * 100 + m,
        y,
    ]
}

/// Versions (number, time) in ascending order of number → the numbers to expire, in
/// ascending order; `now` bounds which version counts as the newest for `keep-within`.
fn plan(versions: &[(u32, i64)], r: &Retention, tz: &jiff::tz::TimeZone, now: i64) -> Vec<u32> {
    let within = r.keep_within_secs.filter(|d| *d > 0);
    let counts = r.calendar.counts().map(|(_, n)| n.unwrap_or(0));
    if versions.is_empty() || (r.keep.is_none() && within.is_none() && counts == [0; 5]) {
        return Vec::new();
    }
    // Newest first by time; of equal times the higher number first.
    let mut order = versions.to_vec();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let newest_time = order.iter().map(|v| v.1).filter(|t| *t <= now).max();
    // Always kept: the newest version by number and the live window (the last `live`).
    let mut by_number: Vec<u32> = versions.iter().map(|v| v.0).collect();
    by_number.sort_unstable();
    let protected = &by_number[by_number.len().saturating_sub(r.live.max(1) as usize)..];
    let mut left = counts;
    let mut last_kept: [Option<i64>; 5] = [None; 5];
    let mut doomed = Vec::new();
    for (i, &(n, t)) in order.iter().enumerate() {
        let mut keep = protected.contains(&n) || r.keep.is_some_and(|k| i < k as usize);
        if let Some(d) = within {
            // Strictly newer than newest − D; no newest (all in the future): all kept.
            keep |= newest_time.is_none_or(|newest| t > newest.saturating_sub(d as i64));
        }
        let p = if left == [0; 5] {
            [0; 5]
        } else {
            periods(t, tz)
        };
        for (level, left) in left.iter_mut().enumerate() {
            if *left == 0 {
                continue;
            }
            let p = p[level];
            if last_kept[level] != Some(p) {
                last_kept[level] = Some(p);
                *left -= 1;
                keep = true;
            }
        }
        if !keep {
            doomed.push(n);
        }
    }
    doomed.sort_unstable();
    doomed
}

/// The longest keep-within stored (the API's limit too).
const MAX_KEEP_WITHIN_SECS: u64 = 10_000_000_000;

/// Checks a retention before it is stored: every count at least 1, a live window that fits,
/// a time zone this build knows. (A `keep-within` of 0 is no rule, as in restic.)
fn validate(r: &Retention) -> Result<()> {
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
    if r.keep_within_secs.is_some_and(|d| d > MAX_KEEP_WITHIN_SECS) {
        return Err(Error::Invalid(format!(
            "keep-within is at most {MAX_KEEP_WITHIN_SECS} seconds (about 300 years)"
        )));
    }
    for (name, n) in r.calendar.counts() {
        if n == Some(0) {
            return Err(Error::Invalid(format!(
                "keep-{name} must be at least 1 (omit it to keep no {name} versions)"
            )));
        }
    }
    if let Some(k) = r.keep {
        if r.live > k {
            return Err(Error::Invalid(format!(
                "the live window ({}) cannot be larger than keep ({k})",
                r.live
            )));
        }
    }
    zone(&r.calendar).map(|_| ())
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

    const NOW: i64 = 4_000_000_000;

    fn utc(vs: &[(u32, i64)], r: &Retention) -> Vec<u32> {
        plan(vs, r, &jiff::tz::TimeZone::UTC, NOW)
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
                "within 2 days: strictly newer than the newest minus 2 days",
                r(None, Some(2 * day as u64)),
                &[1, 2, 3, 4],
            ),
            (
                "union: keep 1 or within 3 days",
                r(Some(1), Some(3 * day as u64)),
                &[1, 2, 3],
            ),
            (
                "union: keep 4 or within 1 day",
                r(Some(4), Some(day as u64)),
                &[1, 2],
            ),
        ];
        for (name, ret, want) in cases {
            assert_eq!(utc(&vs, ret), *want, "{name}");
        }
        assert!(utc(&[], &r(Some(1), None)).is_empty());
        // A keep-within of 0 is no rule (restic's reading): nothing else, nothing expires.
        assert!(utc(&vs, &r(None, Some(0))).is_empty());
        // The newest by number is kept even when an older version has a later time (an
        // import with --time): restic would expire it (15 s older than the newest).
        assert!(utc(&[(1, 100), (2, 50)], &r(None, Some(15))).is_empty());
        // keep 1 counts by time (v1 is the newest); v3 is kept as the newest by number.
        assert_eq!(
            utc(&[(1, 100), (2, 50), (3, 60)], &r(Some(1), None)),
            vec![2]
        );
        // Out-of-order times: age is measured from the newest time, not the last number.
        let odd = [(1, 100), (2, 50), (3, 90)];
        assert_eq!(utc(&odd, &r(None, Some(15))), vec![2]);
        // A version from the future is kept, but the newest for keep-within is the newest
        // of the others (as restic's forget does).
        let future = [(1, 100), (2, 200), (3, NOW + 1000)];
        assert_eq!(utc(&future, &r(None, Some(150))), Vec::<u32>::new());
        assert_eq!(utc(&future, &r(None, Some(50))), vec![1]);
    }

    fn cal(f: impl FnOnce(&mut Calendar)) -> Retention {
        let mut c = Calendar::default();
        f(&mut c);
        Retention {
            calendar: c,
            ..Default::default()
        }
    }

    #[test]
    fn calendar_table() {
        let h = 3_600i64;
        // 2026-01-01 00:00 UTC, a Thursday; versions every 5 hours for 3 weeks.
        let t0 = 1_767_225_600;
        let vs: Vec<(u32, i64)> = (1..=101).map(|v| (v, t0 + i64::from(v) * 5 * h)).collect();
        let kept = |r: &Retention, tz: &jiff::tz::TimeZone| -> Vec<u32> {
            let gone = plan(&vs, r, tz, NOW);
            vs.iter()
                .map(|v| v.0)
                .filter(|n| !gone.contains(n))
                .collect()
        };
        let utc = jiff::tz::TimeZone::UTC;
        // The newest of each of the last 3 days: v101 (Jan 22 01:00), v100 (Jan 21 20:00,
        // the last of Jan 21) and v95 (Jan 20 19:00; v96 is Jan 21 00:00).
        assert_eq!(kept(&cal(|c| c.daily = Some(3)), &utc), vec![95, 100, 101]);
        // Hourly: every version is in an hour of its own.
        assert_eq!(
            kept(&cal(|c| c.hourly = Some(4)), &utc),
            vec![98, 99, 100, 101]
        );
        // ISO weeks begin on Monday: the last versions before Jan 5 (v19, Jan 4 23:00),
        // Jan 12 (v52), Jan 19 (v86), and the newest; week 1 of 2026 began on Dec 29.
        assert_eq!(
            kept(&cal(|c| c.weekly = Some(10)), &utc),
            vec![19, 52, 86, 101]
        );
        // More periods asked for than there are: one per period, the rest expire.
        assert_eq!(kept(&cal(|c| c.monthly = Some(5)), &utc), vec![101]);
        assert_eq!(kept(&cal(|c| c.yearly = Some(5)), &utc), vec![101]);
        // In Tokyo (UTC+9) days begin 9 hours earlier, so other versions end a day:
        // v98 (Jan 21 10:00 UTC, 19:00 there) and v94 (Jan 20 14:00 UTC, 23:00 there).
        let tokyo = jiff::tz::TimeZone::get("Asia/Tokyo").unwrap();
        assert_eq!(kept(&cal(|c| c.daily = Some(3)), &tokyo), vec![94, 98, 101]);
        // The live window is kept whatever the rules say.
        let mut live3 = cal(|c| c.monthly = Some(1));
        live3.live = 3;
        assert_eq!(kept(&live3, &utc), vec![99, 100, 101]);
    }

    #[test]
    fn what_cannot_be_stored_is_refused_with_what_was_wrong() {
        let bad: &[(Retention, &str)] = &[
            (cal(|c| c.daily = Some(0)), "keep-daily must be at least 1"),
            (
                cal(|c| c.timezone = Some("Mars/Olympus".into())),
                "Mars/Olympus",
            ),
            (r(Some(0), None), "keep must be at least 1"),
        ];
        for (ret, want) in bad {
            let e = validate(ret).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            assert_eq!(e.code(), "invalid_argument", "{e}");
        }
        assert!(validate(&cal(|c| c.timezone = Some("Europe/Berlin".into()))).is_ok());
    }
}
