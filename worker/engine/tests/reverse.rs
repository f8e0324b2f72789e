//! Reverse dedup, expiry and gc on hand-built histories with exact expectations.

mod common;

use common::*;
use revault_engine::{
    apply_auto, expire, gc, set_retention, slide, DedupUnit, ExpireSel, GcOptions, RecipeForm,
    Retention, Store,
};

/// `n` versions of a 2 MiB stream, each with a few scattered small edits.
fn history(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut cur = random(2 << 20, seed);
    let mut out = vec![cur.clone()];
    for i in 1..n {
        for j in 0..6 {
            let at = (cur.len() / 7) * (j + 1) + i * 1000;
            let edit = random(300, seed * 1000 + (i * 10 + j) as u64);
            cur.splice(at..at + 100, edit);
        }
        out.push(cur.clone());
    }
    out
}

/// A history's versions with their numbers (the first is version 1).
fn numbered(h: &[Vec<u8>]) -> Vec<(u32, &Vec<u8>)> {
    h.iter()
        .enumerate()
        .map(|(i, v)| (i as u32 + 1, v))
        .collect()
}

fn unit_bytes(st: &Store) -> u64 {
    st.totals().unwrap().unit_vbytes
}

fn assert_all_restore(st: &Store, series: &str, versions: &[(u32, &Vec<u8>)]) {
    for (v, want) in versions {
        assert!(
            restore_bytes(st, series, *v).0 == **want,
            "{series} version {v}"
        );
    }
    let c = revault_engine::check(st).unwrap();
    assert!(c.ok, "{:?}", c.errors);
}

#[test]
fn slide_brings_segment_storage_near_chunk_dedup_and_keeps_every_version() {
    let h = history(5, 1);
    let (_d1, seg) = new_store(small_config());
    let (_d2, chunk) = new_store(small_config());
    for v in &h {
        backup_bytes(&seg, "default/db", v, DedupUnit::Segment);
        backup_bytes(&chunk, "default/db", v, DedupUnit::Chunk);
    }
    let before = unit_bytes(&seg);
    let rep = slide(&seg, "default/db").unwrap();
    assert_eq!(rep.slid, vec![1, 2, 3, 4]);
    assert!(rep.indirect_chunks > 0 && rep.units_trimmed > 0, "{rep:?}");
    let after = unit_bytes(&seg);
    let fine = unit_bytes(&chunk);
    assert!(after < before, "slide freed nothing: {before} -> {after}");
    assert!(
        (after as f64) < fine as f64 * 1.05,
        "after reverse dedup {after} bytes, chunk dedup {fine}: not within 5%"
    );
    let forms: Vec<RecipeForm> = seg
        .versions(&seg.series("default/db").unwrap())
        .unwrap()
        .iter()
        .map(|v| v.form)
        .collect();
    assert_eq!(
        forms,
        [
            RecipeForm::Archival,
            RecipeForm::Archival,
            RecipeForm::Archival,
            RecipeForm::Archival,
            RecipeForm::Live
        ]
    );
    let vs = numbered(&h);
    assert_all_restore(&seg, "default/db", &vs);
    // The oldest version resolves through a chain of four indirect levels.
    assert_eq!(restore_bytes(&seg, "default/db", 1).1.chain_depth, 4);
    assert_eq!(restore_bytes(&seg, "default/db", 5).1.chain_depth, 0);
}

#[test]
fn expiring_the_oldest_version_frees_the_containers_it_owns() {
    let h = history(4, 2);
    let (_d, st) = new_store(small_config());
    for v in &h {
        backup_bytes(&st, "default/db", v, DedupUnit::Segment);
    }
    slide(&st, "default/db").unwrap();
    let before = st.totals().unwrap();
    let rep = expire(&st, "default/db", &ExpireSel::Version(1)).unwrap();
    assert_eq!(rep.expired, vec![1]);
    assert!(rep.spliced.is_empty());
    assert!(rep.containers_freed > 0 && rep.bytes_freed > 0, "{rep:?}");
    let after = st.totals().unwrap();
    assert_eq!(
        after.container_bytes,
        before.container_bytes - rep.bytes_freed
    );
    assert_all_restore(&st, "default/db", &[(2, &h[1]), (3, &h[2]), (4, &h[3])]);
}

#[test]
fn deleting_a_middle_version_splices_the_older_one() {
    let h = history(4, 3);
    let (_d, st) = new_store(small_config());
    for v in &h {
        backup_bytes(&st, "default/db", v, DedupUnit::Segment);
    }
    slide(&st, "default/db").unwrap();
    let rep = expire(&st, "default/db", &ExpireSel::Version(2)).unwrap();
    assert_eq!(rep.spliced, vec![1], "version 1 pointed into version 2");
    assert_all_restore(&st, "default/db", &[(1, &h[0]), (3, &h[2]), (4, &h[3])]);
    // And the live one: version 1 now points into version 3.
    let rep = expire(&st, "default/db", &ExpireSel::Version(3)).unwrap();
    assert_eq!(rep.spliced, vec![1]);
    assert_all_restore(&st, "default/db", &[(1, &h[0]), (4, &h[3])]);
    // Deleting the newest (live) version hands everything to version 1.
    expire(&st, "default/db", &ExpireSel::Version(4)).unwrap();
    assert_all_restore(&st, "default/db", &[(1, &h[0])]);
}

#[test]
fn gc_trims_segments_shared_across_series_once_one_side_expires() {
    // Two series start from the same data, then both change the same places
    // differently. Their first versions share the base segments; slides keep
    // those segments whole (two archival versions reference them directly),
    // although each version needs only the few chunks its successor lacks.
    let base = random(2 << 20, 4);
    let (_d, st) = new_store(small_config());
    let mut a = base.clone();
    let mut b = base.clone();
    for j in 0..20 {
        let at = j * 100_000 + 500;
        a.splice(at..at + 50, random(64, 100 + j as u64));
        b.splice(at..at + 50, random(64, 200 + j as u64));
    }
    for (series, v1, v2) in [("team-a/db", &base, &a), ("team-b/db", &base, &b)] {
        backup_bytes(&st, series, v1, DedupUnit::Segment);
        backup_bytes(&st, series, v2, DedupUnit::Segment);
    }
    slide(&st, "team-a/db").unwrap();
    slide(&st, "team-b/db").unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    expire(&st, "team-a/db", &ExpireSel::Version(1)).unwrap();

    let before = st.totals().unwrap().unit_vbytes;
    let rep = gc(
        &st,
        &GcOptions {
            compact_below: 1.0,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        rep.groups_marked, 1,
        "only the changed series is re-marked: {rep:?}"
    );
    assert!(
        rep.containers_swept > 0 && rep.containers_compacted > 0 && rep.units_trimmed >= 20,
        "{rep:?}"
    );
    let after = st.totals().unwrap().unit_vbytes;
    assert!(after < before, "gc reclaimed nothing: {before} -> {after}");
    // No dead byte is left anywhere: a full mark-and-sweep finds nothing to do.
    let full = gc(
        &st,
        &GcOptions {
            compact_below: 1.0,
            full: true,
        },
    )
    .unwrap();
    assert_eq!(
        (
            full.units_freed,
            full.containers_compacted,
            full.bytes_written
        ),
        (0, 0, 0),
        "{full:?}"
    );
    assert_eq!(full.groups_marked, 2);
    assert_all_restore(&st, "team-a/db", &[(2, &a)]);
    assert_all_restore(&st, "team-b/db", &[(1, &base), (2, &b)]);
    // A second gc with nothing changed marks nothing and sweeps nothing.
    let idle = gc(&st, &GcOptions::default()).unwrap();
    assert_eq!(
        (idle.groups_marked, idle.containers_swept),
        (0, 0),
        "{idle:?}"
    );
}

#[test]
fn retention_applies_automatically_after_each_backup() {
    let h = history(6, 5);
    let (_d, st) = new_store(small_config());
    set_retention(
        &st,
        "default/db",
        Retention {
            keep: Some(3),
            live: 1,
            auto: true,
            ..Default::default()
        },
    )
    .unwrap();
    for v in &h {
        backup_bytes(&st, "default/db", v, DedupUnit::Segment);
    }
    let vs = st.versions(&st.series("default/db").unwrap()).unwrap();
    let got: Vec<(u32, RecipeForm)> = vs.iter().map(|v| (v.number, v.form)).collect();
    assert_eq!(
        got,
        [
            (4, RecipeForm::Archival),
            (5, RecipeForm::Archival),
            (6, RecipeForm::Live)
        ]
    );
    assert_all_restore(&st, "default/db", &[(4, &h[3]), (5, &h[4]), (6, &h[5])]);
}

/// A segment L linking chunks into an earlier segment T of the same backup,
/// and a later version that holds both in the opposite order (files
/// reordered in a tar): the slide of that version keeps the first copy of
/// each chunk in its order, which is L's link. T must keep the chunk the
/// link points to (found by review: the slid version failed to restore,
/// "links to chunk j of unit T, which does not hold it").
#[test]
fn a_slide_keeps_what_a_kept_link_points_to_whatever_the_order() {
    let (t, gap) = (1_000_000, 400_000);
    let mut x = random(2 << 20, 31);
    with_near_repeat(&mut x, t, gap, 32);
    let cut = t + 200_000;
    let x2 = [&x[cut..], &x[..cut]].concat();
    let x3 = random(2 << 20, 33);
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "default/db", &x, DedupUnit::Segment);
    let r2 = backup_bytes(&st, "default/db", &x2, DedupUnit::Segment);
    assert!(
        r2.new_vbytes < x2.len() as u64 / 10,
        "x2 did not dedup: {r2:?}"
    );
    backup_bytes(&st, "default/db", &x3, DedupUnit::Segment);
    let rep = slide(&st, "default/db").unwrap();
    assert_eq!(rep.slid, [1, 2]);
    assert!(rep.units_trimmed > 0, "{rep:?}");
    assert_all_restore(&st, "default/db", &[(1, &x), (2, &x2), (3, &x3)]);
    // Expired one by one, they leave the rest restorable and counted right.
    expire(&st, "default/db", &ExpireSel::Version(1)).unwrap();
    assert_all_restore(&st, "default/db", &[(2, &x2), (3, &x3)]);
    expire(&st, "default/db", &ExpireSel::Version(2)).unwrap();
    assert_all_restore(&st, "default/db", &[(3, &x3)]);
}

/// The server's scheduler lists the series whose retention is automatic,
/// then applies it to each. A client that turns automatic retention off in
/// between keeps its versions (issue 18, found by the stress test: the
/// scheduler expired two versions 107 ms after such a change was answered).
#[test]
fn automatic_retention_turned_off_after_a_listing_expires_nothing() {
    let h = history(4, 7);
    let (_d, st) = new_store(small_config());
    let policy = |keep, auto| Retention {
        keep: Some(keep),
        live: 1,
        auto,
        ..Default::default()
    };
    set_retention(&st, "default/db", policy(3, true)).unwrap();
    for v in &h {
        backup_bytes(&st, "default/db", v, DedupUnit::Segment);
    }
    let numbers = |st: &Store| -> Vec<u32> {
        let s = st.series("default/db").unwrap();
        st.versions(&s).unwrap().iter().map(|v| v.number).collect()
    };
    assert_eq!(numbers(&st), [2, 3, 4]);

    let listed: Vec<String> = st
        .list_series()
        .unwrap()
        .into_iter()
        .filter(|s| s.retention.auto)
        .map(|s| s.name)
        .collect();
    assert_eq!(listed, ["default/db"], "what the scheduler saw");
    set_retention(&st, "default/db", policy(1, false)).unwrap();
    for name in &listed {
        assert!(apply_auto(&st, name).unwrap().is_none(), "{name}");
    }
    assert_eq!(
        numbers(&st),
        [2, 3, 4],
        "versions after auto was turned off"
    );

    // Turned on again, the same call applies the stored policy.
    set_retention(&st, "default/db", policy(1, true)).unwrap();
    let (_, ex) = apply_auto(&st, "default/db").unwrap().unwrap();
    assert_eq!(ex.expired, [2, 3]);
    assert_all_restore(&st, "default/db", &[(4, &h[3])]);
}

/// Automatic retention runs after the backup committed: if it fails, the
/// backup still succeeds (reporting why retention did not run), or a client
/// would be told no version was created and store it again.
#[test]
fn a_failing_automatic_retention_does_not_fail_the_committed_backup() {
    let h = history(2, 8);
    let dir = tempfile::tempdir().unwrap();
    Store::init(
        dir.path(),
        &revault_engine::InitOptions {
            config: small_config(),
            data_dir: None,
        },
    )
    .unwrap();
    let open = || Store::open(dir.path(), revault_engine::OpenMode::ReadWrite, "t").unwrap();
    let st = open();
    let policy = Retention {
        keep: Some(1),
        live: 1,
        auto: true,
        ..Default::default()
    };
    set_retention(&st, "default/db", policy).unwrap();
    backup_bytes(&st, "default/db", &h[0], DedupUnit::Segment);
    st.arm_failpoint("slide.before_commit");
    let rep = backup_bytes(&st, "default/db", &h[1], DedupUnit::Segment);
    assert_eq!(rep.version, 2);
    let why = rep
        .retention_error
        .expect("retention failed after the commit");
    assert!(why.contains("slide.before_commit"), "{why}");
    drop(st);
    let st = open();
    assert_all_restore(&st, "default/db", &[(1, &h[0]), (2, &h[1])]);
}

#[test]
fn deleting_everything_and_gc_leaves_an_empty_store() {
    let (_d, st) = new_store(small_config());
    for (s, unit) in [("a/x", DedupUnit::Segment), ("b/y", DedupUnit::Chunk)] {
        for v in history(3, 6) {
            backup_bytes(&st, s, &v, unit);
        }
        slide(&st, s).unwrap();
    }
    for s in ["a/x", "b/y"] {
        expire(&st, s, &ExpireSel::Before(i64::MAX)).unwrap();
        expire(&st, s, &ExpireSel::Version(3)).unwrap();
    }
    gc(&st, &GcOptions::default()).unwrap();
    let t = st.totals().unwrap();
    assert_eq!(
        (
            t.containers,
            t.container_bytes,
            t.units,
            t.unit_vbytes,
            t.versions
        ),
        (0, 0, 0, 0, 0),
        "{t:?}"
    );
    assert_eq!(std::fs::read_dir(st.data_dir()).unwrap().count(), 0);
}

#[test]
fn duplicates_inside_a_version_are_stored_once_in_segment_mode() {
    // Each version repeats regions of itself close by (within a container's
    // worth of new data): chunk dedup stores them once, and so must segment
    // dedup (through links), before and after slides.
    let mut h = history(4, 8);
    for v in h.iter_mut() {
        let piece = v[100_000..400_000].to_vec();
        v.splice(400_000..400_000, piece);
        let piece = v[1_200_000..1_300_000].to_vec();
        v.splice(1_500_000..1_500_000, piece);
    }
    let (_d1, seg) = new_store(small_config());
    let (_d2, chunk) = new_store(small_config());
    // One version: its repeats are linked, so segment dedup stores what chunk
    // dedup stores.
    backup_bytes(&seg, "default/db", &h[0], DedupUnit::Segment);
    backup_bytes(&chunk, "default/db", &h[0], DedupUnit::Chunk);
    let (one_seg, one_chunk) = (unit_bytes(&seg) as f64, unit_bytes(&chunk) as f64);
    assert!(
        one_seg <= one_chunk * 1.01,
        "one version: segment {one_seg} bytes, chunk {one_chunk}"
    );
    for v in &h[1..] {
        backup_bytes(&seg, "default/db", v, DedupUnit::Segment);
        backup_bytes(&chunk, "default/db", v, DedupUnit::Chunk);
    }
    let fine = unit_bytes(&chunk) as f64;
    let inline = unit_bytes(&seg) as f64;
    slide(&seg, "default/db").unwrap();
    let slid = unit_bytes(&seg) as f64;
    // What remains is data that skips a version (in V and V+2, not V+1):
    // reverse dedup compares consecutive versions only, as RevDedup does.
    assert!(
        slid <= fine * 1.05,
        "after slides {slid} bytes against chunk dedup's {fine}"
    );
    assert!(inline > slid);
    let vs = numbered(&h);
    assert_all_restore(&seg, "default/db", &vs);
    // Links keep their targets alive through expiry and gc.
    expire(&seg, "default/db", &ExpireSel::Version(4)).unwrap();
    gc(
        &seg,
        &GcOptions {
            compact_below: 1.0,
            full: true,
        },
    )
    .unwrap();
    assert_all_restore(&seg, "default/db", &vs[..3]);
    for v in 1..=3 {
        expire(&seg, "default/db", &ExpireSel::Version(v)).unwrap();
    }
    gc(&seg, &GcOptions::default()).unwrap();
    let t = seg.totals().unwrap();
    assert_eq!((t.units, t.containers), (0, 0), "{t:?}");
}

#[test]
fn a_unit_linking_into_a_slid_version_keeps_its_bytes_after_that_version_expires() {
    // Version 1 repeats a region right after itself with a small change
    // every few KiB, so the copy's segments are new but most of their chunks
    // link into the first copy's. Version 2 edits the first copy only: the
    // edited segment is version 1's alone and is trimmed into a container
    // version 1 owns, while segments linking into it live on in version 2.
    let mut v1 = random(2 << 20, 21);
    let mut copy = Vec::new();
    for (i, part) in v1[100_000..400_000].chunks(6_000).enumerate() {
        copy.extend_from_slice(part);
        copy.extend_from_slice(&random(40, 100 + i as u64));
    }
    v1.splice(400_000..400_000, copy);
    let mut v2 = v1.clone();
    v2.splice(250_000..250_100, random(300, 22));
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "default/db", &v1, DedupUnit::Segment);
    backup_bytes(&st, "default/db", &v2, DedupUnit::Segment);
    let rep = slide(&st, "default/db").unwrap();
    assert_eq!(rep.slid, vec![1]);
    assert!(rep.links_resolved > 0 && rep.units_trimmed > 0, "{rep:?}");
    assert_all_restore(&st, "default/db", &[(1, &v1), (2, &v2)]);
    expire(&st, "default/db", &ExpireSel::Version(1)).unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    assert_all_restore(&st, "default/db", &[(2, &v2)]);
    // Version 2 alone is left, stored about as compactly as chunk dedup
    // stores it (its own repeat is linked).
    let only = unit_bytes(&st) as f64;
    let (_d2, fine) = new_store(small_config());
    backup_bytes(&fine, "default/db", &v2, DedupUnit::Chunk);
    let fine = unit_bytes(&fine) as f64;
    assert!(
        only <= fine * 1.03,
        "{only} bytes stored, chunk dedup stores {fine}"
    );
}

#[test]
fn a_chunk_repeated_far_apart_in_a_slid_version_is_kept_once() {
    // Version 1 repeats 200 KB about 1.5 MB later (too far to link); version
    // 2 shares nothing with it. Once version 1 is archival it keeps one copy.
    let mut v1 = random(2 << 20, 31);
    let piece = v1[100_000..300_000].to_vec();
    v1.splice(1_800_000..1_800_000, piece);
    let v2 = random(1 << 20, 32);
    let (_d1, seg) = new_store(small_config());
    let (_d2, chunk) = new_store(small_config());
    for v in [&v1, &v2] {
        backup_bytes(&seg, "default/db", v, DedupUnit::Segment);
        backup_bytes(&chunk, "default/db", v, DedupUnit::Chunk);
    }
    let inline = unit_bytes(&seg) as f64;
    slide(&seg, "default/db").unwrap();
    let (slid, fine) = (unit_bytes(&seg) as f64, unit_bytes(&chunk) as f64);
    assert!(
        slid <= fine * 1.02 && slid < inline,
        "inline {inline}, slid {slid}, chunk dedup {fine}"
    );
    assert_all_restore(&seg, "default/db", &[(1, &v1), (2, &v2)]);
}
