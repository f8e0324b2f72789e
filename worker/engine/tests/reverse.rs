//! Reverse dedup, expiry and gc on hand-built histories with exact expectations.

mod common;

use common::*;
use revault_engine::config::DedupUnit;
use revault_engine::expire::{expire, ExpireSel};
use revault_engine::gc::{gc, GcOptions};
use revault_engine::meta::{RecipeForm, Retention};
use revault_engine::retention::set_retention;
use revault_engine::slide::slide;
use revault_engine::store::Store;

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
    let c = revault_engine::check::check(st).unwrap();
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
    let vs: Vec<(u32, &Vec<u8>)> = h
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u32 + 1, v))
        .collect();
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
