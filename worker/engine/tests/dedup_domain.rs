//! Dedup domains (`Store::set_dedup_domain`): with `namespace`, a series deduplicates only
//! within its namespace and against its own data, so what a backup stores and reports
//! (`newBytes`) does not depend on what other namespaces hold; with `store` (the default)
//! everything dedups against everything. Both units, with restores, slides, expiry and gc.

mod common;

use common::*;
use revault_engine::{
    check, expire, gc, slide, DedupDomain, DedupUnit, ExpireSel, GcOptions, OpenMode, Store,
};

const UNITS: [DedupUnit; 2] = [DedupUnit::Segment, DedupUnit::Chunk];
const SIZE: usize = 2 << 20;

fn store(domain: DedupDomain) -> (tempfile::TempDir, Store) {
    let (d, mut st) = new_store(small_config());
    st.set_dedup_domain(domain).unwrap();
    (d, st)
}

fn assert_clean(st: &Store) {
    let c = check(st).unwrap();
    assert!(c.ok, "check: {:?}", c.errors);
}

#[test]
fn the_store_domain_dedups_across_namespaces() {
    let data = random(SIZE, 1);
    for unit in UNITS {
        let (_d, st) = store(DedupDomain::Store);
        backup_bytes(&st, "team-a/db", &data, unit);
        let b = backup_bytes(&st, "team-b/db", &data, unit);
        assert!(
            b.new_vbytes < SIZE as u64 / 10,
            "{unit}: team-b stored {} new bytes of content team-a holds",
            b.new_vbytes
        );
        assert!(restore_bytes(&st, "team-b/db", 1).0 == data, "{unit}");
    }
}

#[test]
fn a_namespace_domain_stores_its_own_copy_and_dedups_within_the_namespace() {
    let data = random(SIZE, 2);
    for unit in UNITS {
        let (_d, st) = store(DedupDomain::Namespace);
        let a = backup_bytes(&st, "team-a/db", &data, unit);
        let b = backup_bytes(&st, "team-b/db", &data, unit);
        assert!(
            b.new_vbytes >= SIZE as u64 * 95 / 100,
            "{unit}: team-b stored only {} new bytes: it deduplicated against team-a",
            b.new_vbytes
        );
        let a2 = backup_bytes(&st, "team-a/web", &data, unit);
        assert!(
            a2.new_vbytes < SIZE as u64 / 10,
            "{unit}: a second series of team-a stored {} new bytes (first: {})",
            a2.new_vbytes,
            a.new_vbytes
        );
        for s in ["team-a/db", "team-b/db", "team-a/web"] {
            assert!(restore_bytes(&st, s, 1).0 == data, "{unit}: {s}");
        }
        assert_clean(&st);
    }
}

/// What a tenant can observe of a backup (its report) is the same whether or not another
/// namespace holds the content.
#[test]
fn a_namespace_learns_nothing_from_another_namespaces_content() {
    let secret = random(SIZE, 3);
    let mut probe = random(SIZE / 2, 4);
    probe.extend_from_slice(&secret[..SIZE / 2]);
    for unit in UNITS {
        let (_d1, with) = store(DedupDomain::Namespace);
        backup_bytes(&with, "victim/db", &secret, unit);
        let seen = backup_bytes(&with, "attacker/probe", &probe, unit);
        let (_d2, without) = store(DedupDomain::Namespace);
        let baseline = backup_bytes(&without, "attacker/probe", &probe, unit);
        assert_eq!(
            (seen.new_vbytes, seen.new_units),
            (baseline.new_vbytes, baseline.new_units),
            "{unit}: the probe's newBytes depend on the victim's data"
        );
        // storedBytes (container bytes written) carry unit and container ids as varints,
        // so they move by a few bytes with how much the store wrote before; never by what.
        let (s, b) = (seen.new_container_bytes, baseline.new_container_bytes);
        assert!(
            s.abs_diff(b) * 1000 < b,
            "{unit}: the probe's storedBytes depend on the victim's data ({s} vs {b})"
        );
        assert!(
            restore_bytes(&with, "attacker/probe", 1).0 == probe,
            "{unit}"
        );
        assert!(restore_bytes(&with, "victim/db", 1).0 == secret, "{unit}");
    }
}

/// Turning domains on later: a series keeps deduplicating against its own latest version,
/// even where those units were written (untagged) by another namespace's series, and slides,
/// expiry and gc keep every version whole.
#[test]
fn turning_namespace_domains_on_keeps_each_series_deduplicating_against_its_own_data() {
    let v1 = random(SIZE, 5);
    let mut v2 = v1.clone();
    v2[SIZE / 3..SIZE / 3 + 4096].copy_from_slice(&random(4096, 6));
    for unit in UNITS {
        let (dir, st) = store(DedupDomain::Store);
        backup_bytes(&st, "team-a/db", &v1, unit);
        let shared = backup_bytes(&st, "team-b/db", &v1, unit);
        assert!(
            shared.new_vbytes < SIZE as u64 / 10,
            "{unit}: shared in store mode"
        );
        drop(st);

        let mut st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        st.set_dedup_domain(DedupDomain::Namespace).unwrap();
        let b2 = backup_bytes(&st, "team-b/db", &v2, unit);
        assert!(
            b2.new_vbytes < SIZE as u64 / 10,
            "{unit}: team-b's next version stored {} new bytes: its own data is no dedup target",
            b2.new_vbytes
        );
        let c = backup_bytes(&st, "team-c/db", &v1, unit);
        assert!(
            c.new_vbytes >= SIZE as u64 * 95 / 100,
            "{unit}: a new namespace deduplicated ({} new bytes) against units written before",
            c.new_vbytes
        );
        if unit == DedupUnit::Segment {
            slide(&st, "team-b/db").unwrap();
        }
        // team-a goes; what team-b and team-c reference stays.
        expire(&st, "team-a/db", &ExpireSel::Version(1)).unwrap();
        gc(&st, &GcOptions::default()).unwrap();
        assert!(
            restore_bytes(&st, "team-b/db", 1).0 == v1,
            "{unit}: team-b v1"
        );
        assert!(
            restore_bytes(&st, "team-b/db", 2).0 == v2,
            "{unit}: team-b v2"
        );
        assert!(
            restore_bytes(&st, "team-c/db", 1).0 == v1,
            "{unit}: team-c v1"
        );
        assert_clean(&st);
    }
}

/// Units keep their domain through a slide's and gc's repacking, and across reopening.
#[test]
fn units_keep_their_domain_through_slides_gc_and_reopening() {
    let mut vs = vec![random(SIZE, 7)];
    for i in 0..3u64 {
        let mut v = vs.last().unwrap().clone();
        let at = (i as usize * 300_000) % (SIZE - 8192);
        v[at..at + 8192].copy_from_slice(&random(8192, 10 + i));
        vs.push(v);
    }
    let (dir, st) = store(DedupDomain::Namespace);
    for v in &vs {
        backup_bytes(&st, "team-a/db", v, DedupUnit::Segment);
        slide(&st, "team-a/db").unwrap();
    }
    expire(&st, "team-a/db", &ExpireSel::Version(1)).unwrap();
    expire(&st, "team-a/db", &ExpireSel::Version(2)).unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    drop(st);
    let mut st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    st.set_dedup_domain(DedupDomain::Namespace).unwrap();
    let last = vs.last().unwrap();
    let same_ns = backup_bytes(&st, "team-a/copy", last, DedupUnit::Segment);
    let other_ns = backup_bytes(&st, "team-b/copy", last, DedupUnit::Segment);
    assert!(
        same_ns.new_vbytes < SIZE as u64 / 10,
        "team-a's units lost their domain: a new team-a series stored {} new bytes",
        same_ns.new_vbytes
    );
    assert!(
        other_ns.new_vbytes >= SIZE as u64 * 95 / 100,
        "team-b deduplicated ({} new bytes) against team-a's repacked units",
        other_ns.new_vbytes
    );
    for (i, v) in vs.iter().enumerate().skip(2) {
        assert!(
            restore_bytes(&st, "team-a/db", i as u32 + 1).0 == *v,
            "version {}",
            i + 1
        );
    }
    assert_clean(&st);
}

/// Each domain has its own copy lists in the index: however many namespaces store the same
/// content after one did (more than the copies the index keeps of one fingerprint, or the one
/// hint the sampled index keeps), that namespace's next series finds its own copy, and its
/// report is what it would be had nobody else stored the content.
#[test]
fn other_namespaces_copies_never_crowd_a_namespaces_own_out_of_the_index() {
    let data = random(SIZE, 12);
    for unit in UNITS {
        for sampled in [false, true] {
            let open = || {
                let (d, mut st) = if sampled {
                    new_sampled_store(small_config(), 64 << 20)
                } else {
                    new_store(small_config())
                };
                st.set_dedup_domain(DedupDomain::Namespace).unwrap();
                (d, st)
            };
            let (_d1, crowded) = open();
            backup_bytes(&crowded, "a/first", &data, unit);
            for ns in ["b", "c", "d", "e", "f", "g"] {
                backup_bytes(&crowded, &format!("{ns}/x"), &data, unit);
            }
            let seen = backup_bytes(&crowded, "a/second", &data, unit);
            let (_d2, alone) = open();
            backup_bytes(&alone, "a/first", &data, unit);
            let baseline = backup_bytes(&alone, "a/second", &data, unit);
            assert!(
                seen.new_vbytes < SIZE as u64 / 10,
                "{unit} (sampled: {sampled}): a's second series stored {} new bytes: six other namespaces' copies hid a's own",
                seen.new_vbytes
            );
            assert_eq!(
                (seen.new_vbytes, seen.new_units),
                (baseline.new_vbytes, baseline.new_units),
                "{unit} (sampled: {sampled}): a's report depends on what other namespaces stored"
            );
            assert!(restore_bytes(&crowded, "a/second", 1).0 == data);
            assert_clean(&crowded);
        }
    }
}

fn marker_format(dir: &std::path::Path) -> u64 {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("revault.store")).unwrap()).unwrap();
    m["format"].as_u64().unwrap()
}

fn set_marker_format(dir: &std::path::Path, format: u64) {
    let path = dir.join("revault.store");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["format"] = format.into();
    std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
}

/// A store that namespace domains were turned on for is marked format 3, so that a release
/// from before domains refuses to open it (instead of reporting its tagged units corrupt); a
/// store that never used them stays at format 2, which those releases read. The mark follows
/// the metadata: a crash before the marker was rewritten is finished by the next read-write
/// open, and a store rebuilt from its metadata alone (the durable tier) is marked too.
#[test]
fn turning_namespace_domains_on_marks_the_store_for_releases_that_cannot_read_domains() {
    let (plain, st) = store(DedupDomain::Store);
    backup_bytes(&st, "a/db", &random(1 << 20, 13), DedupUnit::Segment);
    drop(st);
    assert_eq!(marker_format(plain.path()), 2);
    let (dir, st) = store(DedupDomain::Namespace);
    let data = random(1 << 20, 14);
    backup_bytes(&st, "a/db", &data, DedupUnit::Segment);
    drop(st);
    assert_eq!(marker_format(dir.path()), 3);
    // This release reads it, read-only too, and restores what it holds.
    let ro = Store::open(dir.path(), OpenMode::ReadOnly, "test").unwrap();
    assert!(restore_bytes(&ro, "a/db", 1).0 == data);
    drop(ro);

    // The marker rewrite lost (a crash after the metadata recorded domains): a read-write
    // open, in either mode, marks it again.
    set_marker_format(dir.path(), 2);
    drop(Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap());
    assert_eq!(
        marker_format(dir.path()),
        3,
        "the next read-write open marks the store"
    );

    // A store rebuilt around a copy of its metadata (what `revault recover` does).
    let rebuilt = tempfile::tempdir().unwrap();
    copy_dir(&dir.path().join("meta"), &rebuilt.path().join("meta"));
    Store::init_recovered(rebuilt.path(), None).unwrap();
    assert_eq!(
        marker_format(rebuilt.path()),
        3,
        "a rebuilt store keeps the mark"
    );
    let plain_rebuilt = tempfile::tempdir().unwrap();
    copy_dir(
        &plain.path().join("meta"),
        &plain_rebuilt.path().join("meta"),
    );
    Store::init_recovered(plain_rebuilt.path(), None).unwrap();
    assert_eq!(marker_format(plain_rebuilt.path()), 2);
}

/// gc compacting every container while a namespace-mode backup that deduplicated against its
/// series' own units from before domains (written by another namespace's series) waits to
/// commit: those units are pinned, so they stay whole, and every version restores.
#[test]
fn gc_during_a_namespace_backup_keeps_the_own_units_it_found() {
    let v1 = random(SIZE, 15);
    let mut v2 = v1.clone();
    v2[SIZE / 2..SIZE / 2 + 4096].copy_from_slice(&random(4096, 16));
    let (dir, st) = store(DedupDomain::Store);
    backup_bytes(&st, "team-a/db", &v1, DedupUnit::Segment);
    backup_bytes(&st, "team-b/db", &v1, DedupUnit::Segment);
    drop(st);
    let mut st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    st.set_dedup_domain(DedupDomain::Namespace).unwrap();
    let ran = at(&st, "backup.before_commit", |st| {
        // team-a's version goes: team-b's v1 still references the units, and its backup
        // in flight has them pinned.
        expire(st, "team-a/db", &ExpireSel::Version(1)).unwrap();
        gc(
            st,
            &GcOptions {
                compact_below: 1.0,
                full: true,
            },
        )
        .unwrap();
    });
    let rep = backup_bytes(&st, "team-b/db", &v2, DedupUnit::Segment);
    reached(&ran, "backup.before_commit");
    assert!(
        rep.new_vbytes < SIZE as u64 / 10,
        "team-b's v2 stored {} new bytes: its own older units were no dedup target",
        rep.new_vbytes
    );
    gc(&st, &GcOptions::default()).unwrap();
    assert!(restore_bytes(&st, "team-b/db", 1).0 == v1, "team-b v1");
    assert!(restore_bytes(&st, "team-b/db", 2).0 == v2, "team-b v2");
    assert_clean(&st);
}
