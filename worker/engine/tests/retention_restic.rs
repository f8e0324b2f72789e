//! Retention has restic's `forget` semantics (issue 22): the same snapshots, taken at the
//! same instants, are kept and removed by restic 0.14 (Debian's package, which
//! hack/install-tools.sh installs) and by a Revault series with the same policy — calendar
//! counts in a time zone with daylight saving time, keep-last, keep-within and mixtures,
//! over three months that cross the end of daylight saving time (with snapshots in the
//! repeated hour) and a new year.

mod common;

use std::process::Command;

use common::*;
use revault_engine::{
    expire, plan_expiry, set_retention, BackupOptions, Calendar, DedupUnit, ExpireSel, Retention,
    Store,
};

const ZONE: &str = "America/New_York";

/// Runs restic on `repo` with TZ set to [`ZONE`]; its stdout, or a panic with its stderr.
fn restic(repo: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Vec<u8> {
    let mut c = Command::new("restic");
    c.args(args)
        .env("TZ", ZONE)
        .env("RESTIC_PASSWORD", "revault-test")
        .env("RESTIC_REPOSITORY", repo)
        .env("RESTIC_CACHE_DIR", repo.with_extension("cache"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| {
        panic!("restic is needed for this test (hack/install-tools.sh installs it): {e}")
    });
    {
        use std::io::Write;
        let mut w = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            w.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "restic {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A restic snapshot taken at `civil`, a local time in [`ZONE`].
fn snapshot_at(repo: &std::path::Path, civil: &str) {
    restic(
        repo,
        &[
            "backup",
            "-q",
            "--stdin",
            "--stdin-filename",
            "volume",
            "--time",
            civil,
        ],
        Some("the same bytes"),
    );
}

fn unix(rfc3339: &str) -> i64 {
    rfc3339
        .parse::<jiff::Timestamp>()
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .as_second()
}

/// The policies, as restic's `forget` flags.
const POLICIES: &[&[&str]] = &[
    &["--keep-hourly", "9"],
    &["--keep-daily", "7"],
    &["--keep-daily", "90"],
    &["--keep-hourly", "60"],
    &["--keep-weekly", "6"],
    &["--keep-monthly", "4"],
    &["--keep-yearly", "3"],
    &[
        "--keep-last",
        "2",
        "--keep-daily",
        "5",
        "--keep-weekly",
        "3",
        "--keep-monthly",
        "3",
        "--keep-yearly",
        "2",
    ],
    &["--keep-within", "10d", "--keep-monthly", "2"],
    &[
        "--keep-within",
        "100h",
        "--keep-hourly",
        "3",
        "--keep-weekly",
        "2",
    ],
];

/// The Revault retention of restic's `forget` flags, in [`ZONE`], read as
/// `revault retention set` reads its own (`--keep`, and `humantime` durations).
fn retention(flags: &[&str]) -> Retention {
    let mut r = Retention {
        calendar: Calendar {
            timezone: Some(ZONE.into()),
            ..Default::default()
        },
        live: 1,
        auto: false,
        ..Default::default()
    };
    for pair in flags.chunks(2) {
        let [flag, value] = pair else {
            panic!("{flags:?}: a flag without a value")
        };
        let n = || Some(value.parse::<u32>().unwrap());
        let c = &mut r.calendar;
        match *flag {
            "--keep-last" => r.keep = n(),
            "--keep-within" => {
                r.keep_within_secs = Some(humantime::parse_duration(value).unwrap().as_secs())
            }
            "--keep-hourly" => c.hourly = n(),
            "--keep-daily" => c.daily = n(),
            "--keep-weekly" => c.weekly = n(),
            "--keep-monthly" => c.monthly = n(),
            "--keep-yearly" => c.yearly = n(),
            other => panic!("{other}: not a flag this test maps"),
        }
    }
    r
}

#[test]
fn retention_keeps_and_removes_what_restic_forget_does() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("restic");
    // The semantics are restic 0.14's (Debian 12's package); from 0.16 on, forget also keeps
    // the oldest snapshot while a count has some left.
    let v = String::from_utf8(restic(&repo, &["version"], None)).unwrap();
    assert!(
        v.starts_with("restic 0.14."),
        "this test compares with restic 0.14 (hack/install-tools.sh installs Debian's), found {v}"
    );
    restic(&repo, &["init", "-q"], None);
    // Snapshots from late October on, 10 minutes to 6 days apart (pseudo-random, fixed), so
    // that some share an hour or a day and the span crosses the end of daylight saving time,
    // a new year and its start again.
    let start = jiff::civil::date(2024, 10, 20)
        .at(7, 13, 0, 0)
        .to_zoned(jiff::tz::TimeZone::get(ZONE).unwrap())
        .unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut at = start.clone();
    for i in 0..44 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let gap_min = if i % 5 == 0 {
            10 + seed % 50
        } else {
            60 + seed % (6 * 24 * 60)
        };
        at = at
            .checked_add(jiff::Span::new().minutes(gap_min as i64))
            .unwrap();
        let civil = at.strftime("%Y-%m-%d %H:%M:%S").to_string();
        snapshot_at(&repo, &civil);
    }
    // Around the end of daylight saving time (2024-11-03 02:00 EDT is 01:00 EST): before,
    // twice in the repeated hour (as restic's --time reads an ambiguous local time), after.
    for civil in [
        "2024-11-02 23:50:00",
        "2024-11-03 01:20:00",
        "2024-11-03 01:40:00",
        "2024-11-03 03:05:00",
    ] {
        snapshot_at(&repo, civil);
    }
    // The instants restic recorded are the versions' times.
    let listed: serde_json::Value =
        serde_json::from_slice(&restic(&repo, &["snapshots", "--json"], None)).unwrap();
    let mut times: Vec<i64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| unix(s["time"].as_str().unwrap()))
        .collect();
    times.sort_unstable();
    assert_eq!(times.len(), 48);

    let (_d, store) = new_store(small_config());
    let series = "ns/db";
    for (i, t) in times.iter().enumerate() {
        let r = backup_with(
            &store,
            series,
            &random(4096, i as u64),
            &BackupOptions {
                unit: Some(DedupUnit::Chunk),
                time_unix: Some(*t),
                ..Default::default()
            },
        );
        assert_eq!(r.version as usize, i + 1);
    }
    let versions = store.versions(&store.series(series).unwrap()).unwrap();
    let number_at = |t: i64| times.iter().position(|x| *x == t).unwrap() as u32 + 1;

    for flags in POLICIES {
        let mut args = vec!["forget", "--dry-run", "--json"];
        args.extend_from_slice(flags);
        let groups: serde_json::Value =
            serde_json::from_slice(&restic(&repo, &args, None)).unwrap();
        let mut removed: Vec<u32> = groups
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["remove"].as_array().cloned().unwrap_or_default())
            .map(|s| number_at(unix(s["time"].as_str().unwrap())))
            .collect();
        removed.sort_unstable();
        let planned = plan_expiry(&versions, &retention(flags)).unwrap();
        assert_eq!(planned, removed, "{flags:?}");
        assert!(
            !removed.is_empty() && removed.len() < times.len() - 1,
            "{flags:?}: a policy that keeps some and removes some ({} removed)",
            removed.len()
        );
    }

    // And expiry by retention removes exactly those versions from the series.
    let mixed = retention(POLICIES[7]);
    let want = plan_expiry(&versions, &mixed).unwrap();
    set_retention(&store, series, mixed).unwrap();
    let rep = expire(&store, series, &ExpireSel::Retention).unwrap();
    assert_eq!(rep.expired, want);
    let left: Vec<u32> = versions_of(&store, series);
    let expect: Vec<u32> = (1..=48).filter(|n| !want.contains(n)).collect();
    assert_eq!(left, expect, "the versions the policy keeps, and no other");
    for n in left {
        let (got, _) = restore_bytes(&store, series, n);
        assert_eq!(got, random(4096, u64::from(n) - 1), "v{n} restores");
    }
}

fn versions_of(store: &Store, series: &str) -> Vec<u32> {
    store
        .versions(&store.series(series).unwrap())
        .unwrap()
        .iter()
        .map(|v| v.number)
        .collect()
}
