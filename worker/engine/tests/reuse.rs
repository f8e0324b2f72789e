//! Reuse: chunks a version repeats are restored from memory, not reread.

mod common;

use common::*;
use revault_engine::{
    CachePolicy, DedupUnit, RestoreOptions, RestoreReport, Store, VersionSel, KIB, MIB,
};

fn latest(store: &Store, cache: CachePolicy, budget: u64, reuse: bool) -> (Vec<u8>, RestoreReport) {
    let opts = RestoreOptions {
        cache,
        cache_bytes: budget,
        reuse,
        ..Default::default()
    };
    restore_with(store, "t/s", VersionSel::Latest, &opts)
}

/// A 16 KiB piece repeated every 600 KiB of otherwise new data: chunk
/// dedup stores it once, in the first container, which every repeat sends
/// a small cache back to.
fn repeating() -> Vec<u8> {
    let piece = random(16 * KIB as usize, 1);
    let mut v = Vec::new();
    for i in 0..12 {
        v.extend(random(600 * KIB as usize, 10 + i));
        v.extend_from_slice(&piece);
    }
    v
}

#[test]
fn a_repeated_piece_is_read_once_whatever_the_cache() {
    let data = repeating();
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "t/s", &data, DedupUnit::Chunk);
    let budget = 3 * MIB / 2;
    for cache in CachePolicy::ALL.into_iter().chain([CachePolicy::Auto]) {
        let (with, r) = latest(&st, cache, budget, true);
        let (without, n) = latest(&st, cache, budget, false);
        assert!(
            with == data && without == data,
            "{cache}: restored bytes differ"
        );
        assert!(r.peak_cache_bytes <= budget, "{cache}: {r:?}");
        assert_eq!(n.reused_bytes, 0, "{cache}");
        if cache == CachePolicy::LruChunk {
            // A chunk cache itself: reuse stays out of its way.
            assert_eq!(r.reused_bytes, 0, "{r:?}");
            continue;
        }
        // Eleven repeats, less the chunks cut across the piece's edges.
        assert!(r.reused_bytes > 8 * 16 * KIB, "{cache}: {r:?}");
        assert!(
            r.container_reads <= n.container_reads,
            "{cache}: {} reads with reuse, {} without",
            r.container_reads,
            n.container_reads
        );
        if matches!(
            cache,
            CachePolicy::Faa | CachePolicy::Opt | CachePolicy::LruContainer
        ) {
            assert!(
                r.container_reads < n.container_reads,
                "{cache}: {} reads with reuse, {} without",
                r.container_reads,
                n.container_reads
            );
        }
    }
}

#[test]
fn reuse_leaves_a_version_without_repeats_alone() {
    let data = random(3 * MIB as usize, 5);
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "t/s", &data, DedupUnit::Chunk);
    let (out, r) = latest(&st, CachePolicy::Auto, 2 * MIB, true);
    assert_eq!(out, data);
    assert_eq!((r.reused_bytes, r.reuse_peak_bytes), (0, 0));
}

fn backup_capped(store: &Store, data: &[u8]) -> revault_engine::BackupReport {
    let opts = revault_engine::BackupOptions {
        unit: Some(DedupUnit::Chunk),
        rewrite: Some(revault_engine::RewriteSettings::Capping {
            segment: 5,
            level: 1,
        }),
        ..Default::default()
    };
    backup_with(store, "t/s", data, &opts)
}

#[test]
fn a_repeat_of_a_chunk_the_backup_already_referenced_is_never_rewritten() {
    // Version 2 references piece A where A's container is the only old one
    // (capping keeps it), then repeats A among pieces of three other old
    // containers, where capping at level 1 keeps one of them. The repeat
    // costs a restore nothing (reuse serves it), so it is not a rewrite
    // candidate and changes no decision: version 2 rewrites exactly what it
    // rewrites without it. (Seen by the policy, it changed what capping
    // rewrote.)
    let a = random(64 * KIB as usize, 20);
    let c = random(4 * MIB as usize, 21);
    let v1 = [&a[..], &c[..]].concat();
    let tail = |with_repeat: bool| {
        let mut v = a.clone();
        v.extend(random(5 * MIB as usize + MIB as usize / 2, 22));
        for at in [0usize, 1_200_000, 2_400_000] {
            v.extend_from_slice(&c[at..at + 300_000]);
        }
        if with_repeat {
            v.extend_from_slice(&a);
        }
        v.extend(random(200 * KIB as usize, 23));
        v
    };
    let mut rewritten = Vec::new();
    for with_repeat in [false, true] {
        let (_d, st) = new_store(small_config());
        backup_capped(&st, &v1);
        let v2 = tail(with_repeat);
        let rep = backup_capped(&st, &v2);
        assert!(rep.rewritten_bytes > 0, "capping rewrote nothing: {rep:?}");
        assert_eq!(restore_bytes(&st, "t/s", 2).0, v2);
        rewritten.push(rep.rewritten_bytes);
    }
    assert_eq!(rewritten[0], rewritten[1]);
}
