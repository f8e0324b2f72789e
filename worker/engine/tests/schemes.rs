//! Every (rewrite policy, restore cache) pair: versions restore byte-exact,
//! the cache never holds more than its budget, and CBR never rewrites more
//! than its limit.

mod common;

use std::io::Cursor;

use common::*;
use proptest::prelude::*;
use revault_engine::{
    backup, restore, BackupOptions, CachePolicy, DedupUnit, RestoreOptions, RestoreTarget,
    RewriteSettings, StreamSource, VersionSel, MIB,
};

fn policy() -> impl Strategy<Value = RewriteSettings> {
    prop_oneof![
        Just(RewriteSettings::None),
        (1u32..4, 1u32..4).prop_map(|(segment, level)| RewriteSettings::Capping { segment, level }),
        (0.05f64..0.5, 0.05f64..0.5, 0.3f64..0.9, 0.01f64..0.2).prop_map(|(s, d, u, l)| {
            RewriteSettings::Cbr {
                stream_context_mib: s,
                disk_context_mib: d,
                min_utility: u,
                limit: l,
            }
        }),
        (1u32..4, 0.01f64..0.3, 1u32..6).prop_map(|(segment, loss, cap)| RewriteSettings::Fcrc {
            segment,
            loss,
            cap
        }),
        (1u32..6, 0.01f64..0.3, 1u32..6).prop_map(|(window, loss, cap)| RewriteSettings::Lbw {
            window,
            loss,
            cap
        }),
    ]
}

/// Versions that share most data, with duplicates scattered so rewriting has
/// something to decide.
fn history(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut cur = random(600_000, seed);
    let mut out = vec![cur.clone()];
    for i in 1..n {
        for j in 0..5u64 {
            let at = (cur.len() / 6) * (j as usize + 1);
            cur.splice(at..at + 200, random(300, seed ^ (i as u64 * 31 + j)));
        }
        // Old data re-appears: duplicates far from their copies.
        let src = cur.len() / 3;
        let piece = cur[src..src + 40_000].to_vec();
        cur.extend_from_slice(&piece);
        out.push(cur.clone());
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_and_cache_restores_exactly_within_budget(
        seed in any::<u64>(),
        versions in 2usize..5,
        unit in prop_oneof![Just(DedupUnit::Segment), Just(DedupUnit::Chunk)],
        rewrite in policy(),
        budget_mib in 2u64..9,
    ) {
        let (_d, store) = new_store(small_config());
        let h = history(seed, versions);
        for v in &h {
            let src = StreamSource::new("t", Cursor::new(v.clone()));
            let opts = BackupOptions { unit: Some(unit), rewrite: Some(rewrite.clone()), ..Default::default() };
            let rep = backup(&store, "default/s", Box::new(src), &opts).unwrap();
            if let RewriteSettings::Cbr { limit, .. } = rewrite {
                prop_assert!(rep.rewritten_chunks as f64 <= limit * rep.chunks as f64 + 1e-9,
                    "CBR rewrote {} of {} chunks at a limit of {limit}", rep.rewritten_chunks, rep.chunks);
            }
        }
        for cache in CachePolicy::ALL.into_iter().chain([CachePolicy::Auto]) {
            for (i, want) in h.iter().enumerate() {
                let mut out = Vec::new();
                let opts = RestoreOptions { cache, cache_bytes: budget_mib * MIB, ..Default::default() };
                let rep = restore(&store, "default/s", VersionSel::Number(i as u32 + 1), &opts, RestoreTarget::Writer(&mut out)).unwrap();
                prop_assert!(out == *want, "{cache} restored version {} wrong", i + 1);
                prop_assert!(rep.peak_cache_bytes <= rep.cache_bytes,
                    "{cache} held {} bytes with a budget of {}", rep.peak_cache_bytes, rep.cache_bytes);
            }
        }
        let c = revault_engine::check(&store).unwrap();
        prop_assert!(c.ok, "{:?}", c.errors);
    }
}

#[test]
fn opt_never_reads_more_containers_than_lru() {
    // Belady's cache is the floor for container caches of the same size.
    let (_d, store) = new_store(small_config());
    for v in history(11, 6) {
        backup_bytes(&store, "default/s", &v, DedupUnit::Chunk);
    }
    let reads = |cache| {
        let mut out = Vec::new();
        let opts = RestoreOptions {
            cache,
            cache_bytes: 3 * MIB,
            ..Default::default()
        };
        restore(
            &store,
            "default/s",
            VersionSel::Latest,
            &opts,
            RestoreTarget::Writer(&mut out),
        )
        .unwrap()
        .container_reads
    };
    let (opt, lru) = (reads(CachePolicy::Opt), reads(CachePolicy::LruContainer));
    assert!(opt <= lru, "opt {opt} reads, lru-container {lru}");
}

/// Container reads of the latest version of `series`, and the cache that ran.
fn latest_reads(store: &revault_engine::Store, cache: CachePolicy, budget: u64) -> (u64, String) {
    let mut out = Vec::new();
    let opts = RestoreOptions {
        cache,
        cache_bytes: budget,
        ..Default::default()
    };
    let rep = restore(
        store,
        "default/s",
        VersionSel::Latest,
        &opts,
        RestoreTarget::Writer(&mut out),
    )
    .unwrap();
    (rep.container_reads, rep.cache)
}

/// 1 MiB containers; a version that repeats its first 2 MiB after 2 MiB of
/// other data. With 3 MiB of memory the assembly area has forgotten the
/// repeat's containers by then; a container cache can keep them.
fn repeat_after_a_gap() -> (tempfile::TempDir, revault_engine::Store) {
    let (d, store) = new_store(small_config());
    let (a, b) = (random(2 << 20, 21), random(2 << 20, 22));
    backup_bytes(
        &store,
        "default/s",
        &[a.clone(), b, a].concat(),
        DedupUnit::Chunk,
    );
    (d, store)
}

/// 1 MiB containers; a version woven from 64 KiB pieces of eight earlier
/// ones. With 3 MiB of memory every window needs all eight containers, more
/// than fit in a container cache.
fn woven_from_eight() -> (tempfile::TempDir, revault_engine::Store) {
    let (d, store) = new_store(small_config());
    let olds: Vec<Vec<u8>> = (0..8).map(|i| random(1 << 20, 30 + i)).collect();
    for o in &olds {
        backup_bytes(&store, "default/s", o, DedupUnit::Chunk);
    }
    let mut woven = Vec::new();
    for k in 0..16 {
        for o in &olds {
            woven.extend_from_slice(&o[k << 16..(k + 1) << 16]);
        }
    }
    backup_bytes(&store, "default/s", &woven, DedupUnit::Chunk);
    (d, store)
}

#[test]
fn auto_runs_whichever_of_faa_and_opt_reads_fewer_containers() {
    let budget = 3 * MIB;

    let (_d, store) = repeat_after_a_gap();
    let (faa, _) = latest_reads(&store, CachePolicy::Faa, budget);
    let (opt, _) = latest_reads(&store, CachePolicy::Opt, budget);
    assert!(opt < faa, "opt {opt} reads, faa {faa}");
    let (auto, ran) = latest_reads(&store, CachePolicy::Auto, budget);
    assert_eq!((auto, ran.as_str()), (opt, "opt"));

    let (_d, store) = woven_from_eight();
    let (faa, _) = latest_reads(&store, CachePolicy::Faa, budget);
    let (opt, _) = latest_reads(&store, CachePolicy::Opt, budget);
    assert!(faa < opt, "faa {faa} reads, opt {opt}");
    let (auto, ran) = latest_reads(&store, CachePolicy::Auto, budget);
    assert_eq!((auto, ran.as_str()), (faa, "faa"));
}

#[test]
fn dasm_adapts_to_both_a_repeat_and_a_weave() {
    // DASM splits its memory between an assembly area and a container cache
    // by what lies ahead: on the repeat it keeps the repeated containers and
    // reads fewer than the assembly area alone; on the weave it keeps none
    // and reads no more than it. (4 MiB for the repeat: at 3 MiB, a 1 MiB
    // container of cache leaves too small an area to pay off.)
    let (_d, store) = repeat_after_a_gap();
    let (faa, _) = latest_reads(&store, CachePolicy::Faa, 4 * MIB);
    let (dasm, _) = latest_reads(&store, CachePolicy::Dasm, 4 * MIB);
    assert!(dasm < faa, "repeat: dasm {dasm} reads, faa {faa}");

    let budget = 3 * MIB;
    let (_d, store) = woven_from_eight();
    let (faa, _) = latest_reads(&store, CachePolicy::Faa, budget);
    let (opt, _) = latest_reads(&store, CachePolicy::Opt, budget);
    let (dasm, _) = latest_reads(&store, CachePolicy::Dasm, budget);
    assert!(
        dasm <= faa && dasm < opt,
        "weave: dasm {dasm}, faa {faa}, opt {opt}"
    );
}

#[test]
fn the_default_cache_restores_with_less_memory_than_one_container() {
    // 4 MiB containers, 1-3 MiB of restore memory: containers that do not fit
    // are read chunk by chunk, exact and within the budget.
    let (_d, store) = new_store(revault_engine::StoreConfig::default());
    let mut h = vec![random(9 << 20, 7)];
    for i in 0..3u64 {
        let mut v = h.last().unwrap().clone();
        let at = (v.len() / 4) * (i as usize + 1);
        v.splice(at..at + 5_000, random(7_000, 70 + i));
        h.push(v);
    }
    for v in &h {
        let src = StreamSource::new("t", Cursor::new(v.clone()));
        backup(
            &store,
            "default/s",
            Box::new(src),
            &BackupOptions::default(),
        )
        .unwrap();
    }
    for budget_mib in 1..=3 {
        for (i, want) in h.iter().enumerate() {
            let mut out = Vec::new();
            let opts = RestoreOptions {
                cache_bytes: budget_mib * MIB,
                ..Default::default()
            };
            let rep = restore(
                &store,
                "default/s",
                VersionSel::Number(i as u32 + 1),
                &opts,
                RestoreTarget::Writer(&mut out),
            )
            .unwrap();
            assert!(
                out == *want,
                "version {} restored wrong with {budget_mib} MiB",
                i + 1
            );
            assert!(
                rep.peak_cache_bytes <= rep.cache_bytes,
                "held {} bytes with a budget of {}",
                rep.peak_cache_bytes,
                rep.cache_bytes
            );
            // Each block is read about once, not once per chunk.
            assert!(rep.read_amplification < 1.5, "{rep:?}");
        }
    }
}

#[test]
fn zero_chunks_do_not_split_opt_reads_of_a_container_larger_than_the_budget() {
    // 4 MiB containers, 1 MiB of restore memory: opt serves each container
    // from its blocks, one read per run of its chunks, and the zero chunks
    // between them (stored nowhere) do not end the run.
    let (_d, store) = new_store(revault_engine::StoreConfig::default());
    let mut data = random(9 << 20, 8);
    for k in 1..9 {
        data[k << 20..(k << 20) + (200 << 10)].fill(0);
    }
    backup_bytes(&store, "default/s", &data, DedupUnit::Segment);
    let mut out = Vec::new();
    let opts = RestoreOptions {
        cache: CachePolicy::Opt,
        cache_bytes: MIB,
        ..Default::default()
    };
    let rep = restore(
        &store,
        "default/s",
        VersionSel::Latest,
        &opts,
        RestoreTarget::Writer(&mut out),
    )
    .unwrap();
    assert!(out == data, "restored wrong");
    assert_eq!(rep.container_reads, store.totals().unwrap().containers);
}

#[test]
fn repeats_of_existing_data_inside_a_version_are_referenced_by_every_policy() {
    // Version 2 is version 1 with a region of it repeated: all old data. With
    // budgets that allow no rewriting, no policy may store anything new, even
    // for repeats seen while the first occurrence waits for its decision.
    let v1 = random(3 << 20, 41);
    let mut v2 = v1.clone();
    v2.extend_from_slice(&v1[100_000..900_000]);
    let policies = [
        RewriteSettings::None,
        RewriteSettings::Capping {
            segment: 5,
            level: 100_000,
        },
        RewriteSettings::Cbr {
            stream_context_mib: 5.0,
            disk_context_mib: 2.0,
            min_utility: 0.7,
            limit: 0.0,
        },
        RewriteSettings::Fcrc {
            segment: 5,
            loss: 0.0,
            cap: 100_000,
        },
        RewriteSettings::Lbw {
            window: 5,
            loss: 0.0,
            cap: 100_000,
        },
    ];
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        for rewrite in &policies {
            let (_d, store) = new_store(small_config());
            for v in [&v1, &v2] {
                let src = StreamSource::new("t", Cursor::new(v.clone()));
                let opts = BackupOptions {
                    unit: Some(unit),
                    rewrite: Some(rewrite.clone()),
                    ..Default::default()
                };
                let rep = backup(&store, "default/s", Box::new(src), &opts).unwrap();
                if rep.version == 2 {
                    assert_eq!(rep.rewritten_chunks, 0, "{unit:?} {}", rewrite.name());
                    // Only the chunks (or segments) around the splice are new.
                    let limit = if unit == DedupUnit::Chunk {
                        32 << 10
                    } else {
                        200_000
                    };
                    assert!(
                        rep.new_vbytes <= limit,
                        "{unit:?} {}: {} new bytes",
                        rewrite.name(),
                        rep.new_vbytes
                    );
                }
            }
        }
    }
}
