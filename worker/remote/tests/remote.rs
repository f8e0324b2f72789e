//! The durable tier against a real S3 server (versitygw): what a user checks after losing a
//! node — every version restores byte-exact from a store rebuilt from the bucket alone — and
//! what an attacker or a bad day does to the bucket.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use revault_engine::{DedupUnit, OpenMode, Store};
use revault_remote::{
    owner, recover, rotate_key, EvictOptions, RecoverOptions, Remote, RotateOptions,
};

type History = Vec<(&'static str, Vec<(u32, Vec<u8>)>)>;

fn recover_into(
    dir: &std::path::Path,
    url: &revault_remote::RemoteUrl,
    key: &std::path::Path,
    lazy: bool,
) -> (Store, Remote) {
    let (store, remote, rep) = recover(&RecoverOptions {
        url: url.clone(),
        key_file: key.to_path_buf(),
        store: dir.to_path_buf(),
        data_dir: None,
        lazy,
    })
    .unwrap();
    assert!(rep.generation >= 2, "{rep:?}");
    (store, remote)
}

fn check_clean(store: &Store) {
    let rep = revault_engine::check(store).unwrap();
    assert!(rep.ok, "check: {:?}", rep.errors);
}

/// Backs up `n` versions of two series (segment and chunk units) and syncs after each.
fn history(store: &Store, remote: &Remote, n: u64) -> History {
    let mut seg = Vec::new();
    let mut chunk = Vec::new();
    for i in 0..n {
        let a = version_data(1, i, 1_300_000);
        let b = version_data(2, i, 900_000);
        let ra = backup_bytes(store, "ns/seg", &a, DedupUnit::Segment);
        let rb = backup_bytes(store, "ns/chunk", &b, DedupUnit::Chunk);
        remote.sync(store).unwrap();
        assert_eq!(remote.durable_version("ns/seg"), Some(ra.version));
        assert_eq!(remote.durable_version("ns/chunk"), Some(rb.version));
        seg.push((ra.version, a));
        chunk.push((rb.version, b));
    }
    vec![("ns/seg", seg), ("ns/chunk", chunk)]
}

/// [`history`] of 4 versions, the segment series slid (reverse dedup rewrites the older
/// versions' recipes and repacks their data), all of it synced.
fn slid_history(store: &Store, remote: &Remote) -> History {
    let expected = history(store, remote, 4);
    revault_engine::set_retention(store, "ns/seg", manual_live_1()).unwrap();
    revault_engine::slide(store, "ns/seg").unwrap();
    remote.sync(store).unwrap();
    expected
}

#[test]
fn a_store_rebuilt_from_the_bucket_alone_restores_every_version() {
    let url = fresh_url("rebuild");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let expected = slid_history(&store, &remote);
    // The node is gone: only the bucket and the key file are left.
    drop(remote);
    drop(store);
    let key = dir.path().join("key");
    std::fs::remove_dir_all(dir.path().join("store")).unwrap();

    let eager = tempfile::tempdir().unwrap();
    let (s2, _r2) = recover_into(eager.path(), &url, &key, false);
    assert_holds(&s2, &expected);
    check_clean(&s2);
    let archival = s2.versions(&s2.series("ns/seg").unwrap()).unwrap();
    assert_eq!(
        archival[0].form,
        revault_engine::RecipeForm::Archival,
        "the slide survived"
    );
    drop(s2);
    drop(_r2);

    // A lazy recovery downloads nothing and reads every container from the bucket.
    let lazy = tempfile::tempdir().unwrap();
    let (s3_, r3) = recover_into(lazy.path(), &url, &key, true);
    assert_eq!(
        count_files(s3_.data_dir()),
        0,
        "lazy: no container was downloaded"
    );
    assert_holds(&s3_, &expected);
    check_clean(&s3_);
    // It goes on: a backup into the rebuilt store is durable and restores.
    let next = version_data(1, 9, 1_300_000);
    let v = backup_bytes(&s3_, "ns/seg", &next, DedupUnit::Segment).version;
    r3.sync(&s3_).unwrap();
    assert_eq!(r3.durable_version("ns/seg"), Some(v));
    assert_eq!(restore_bytes(&s3_, "ns/seg", v).unwrap(), next);
}

/// Restores `series` version `v` with `cache` under `budget` bytes.
fn restore_with(
    store: &Store,
    series: &str,
    v: u32,
    cache: revault_engine::CachePolicy,
    budget: u64,
) -> revault_engine::Result<Vec<u8>> {
    let mut out = Vec::new();
    revault_engine::restore(
        store,
        series,
        revault_engine::VersionSel::Number(v),
        &revault_engine::RestoreOptions {
            cache_bytes: budget,
            cache,
            ..Default::default()
        },
        revault_engine::RestoreTarget::Writer(&mut out),
    )?;
    Ok(out)
}

/// From the bucket alone, every restore cache reads ahead (the container caches fetch whole
/// containers in the background, then open them from what was fetched) and restores every
/// version byte-exact, with a cache that holds everything and one that holds two
/// containers. Containers tampered in
/// the bucket are then reported by name by every cache, never served: what is read ahead is
/// authenticated as much as what is read on demand.
#[test]
fn every_restore_cache_reads_ahead_from_the_bucket_byte_exact() {
    let url = fresh_url("ahead");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let expected = slid_history(&store, &remote);
    let small = 2 * store.config().container_bytes;
    let key = dir.path().join("key");
    drop(remote);
    drop(store);
    let lazy = tempfile::tempdir().unwrap();
    let (s2, r2) = recover_into(lazy.path(), &url, &key, true);
    assert_eq!(count_files(s2.data_dir()), 0, "lazy: nothing downloaded");
    use revault_engine::CachePolicy::{LruChunk, LruContainer, Opt};
    for budget in [64 << 20, small] {
        for cache in revault_engine::CachePolicy::ALL {
            let opened_whole = r2.whole_opens();
            for (series, versions) in &expected {
                for (n, data) in versions {
                    let got = restore_with(&s2, series, *n, cache, budget)
                        .unwrap_or_else(|e| panic!("{cache} {budget}: {series} v{n}: {e}"));
                    assert!(
                        got == *data,
                        "{cache} {budget}: {series} v{n} not byte-exact"
                    );
                }
            }
            if matches!(cache, Opt | LruContainer | LruChunk) {
                assert!(
                    r2.whole_opens() > opened_whole,
                    "{cache} {budget}: nothing was read ahead"
                );
            }
        }
    }
    // Two restores at once through the one tier, asking for the same containers ahead:
    // neither one's end withdraws what the other still reads ahead.
    let (series, versions) = &expected[0];
    let (n, data) = versions.last().unwrap();
    std::thread::scope(|sc| {
        let runs: Vec<_> = (0..2)
            .map(|_| sc.spawn(|| restore_with(&s2, series, *n, Opt, 64 << 20)))
            .collect();
        for r in runs {
            assert!(r.join().unwrap().unwrap() == *data, "a concurrent restore");
        }
    });
    // Tampered in the bucket: in the middle of one container, at the end (trailer and
    // footer, what its stub is built from) of another; a third is followed by 8 MiB that
    // are no part of it (a read ahead fetches no more than the container can be, and
    // reading it on demand serves the container as it was). A store opened afresh, so
    // nothing fetched before the tampering is at hand.
    drop(r2);
    drop(s2);
    let names: Vec<String> = bucket_containers(&url).into_iter().take(3).collect();
    let (victims, extended) = (&names[..2], &names[2]);
    for (i, victim) in victims.iter().enumerate() {
        let path = s3().object_path(&url, victim);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = if i == 0 {
            bytes.len() / 2
        } else {
            bytes.len() - 20
        };
        bytes[at] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
    }
    let path = s3().object_path(&url, extended);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.resize(bytes.len() + (8 << 20), 0x5a);
    std::fs::write(&path, &bytes).unwrap();
    let s2 = Store::open(lazy.path(), OpenMode::ReadWrite, "test").unwrap();
    let _r2 = Remote::attach(&s2, None).unwrap().unwrap();
    for cache in revault_engine::CachePolicy::ALL {
        let mut failures = 0;
        for (series, versions) in &expected {
            for (n, data) in versions {
                match restore_with(&s2, series, *n, cache, 64 << 20) {
                    Ok(got) => assert!(got == *data, "{cache}: {series} v{n}: wrong bytes"),
                    Err(e) => {
                        failures += 1;
                        let m = e.to_string();
                        assert_eq!(e.code(), "corrupt_container", "{cache}: {m}");
                        assert!(
                            victims.iter().any(|v| m.contains(v.as_str())),
                            "{cache}: names the object: {m}"
                        );
                    }
                }
            }
        }
        assert!(
            failures > 0,
            "{cache}: some version reads the tampered container"
        );
    }
}

fn count_files(d: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(d).unwrap().flatten() {
        if e.path().is_dir() {
            n += count_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

/// The containers in the bucket: exactly those the store's metadata names.
fn bucket_containers(url: &revault_remote::RemoteUrl) -> BTreeSet<String> {
    s3().objects(url)
        .into_iter()
        .filter(|(n, _)| n.starts_with("data/"))
        .map(|(n, _)| n)
        .collect()
}

fn store_containers(store: &Store) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    store
        .meta()
        .for_each_prefix(revault_engine::keys::CF_CONTAINERS, b"", |k, _| {
            out.insert(format!(
                "data/{:016x}",
                u64::from_be_bytes(k.try_into().unwrap())
            ));
            Ok(true)
        })
        .unwrap();
    out
}

#[test]
fn expiry_and_gc_delete_what_they_free_from_the_bucket() {
    let url = fresh_url("expire");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    // Versions that share little, so expiring them frees whole containers.
    let mut expected: History = vec![("ns/seg", Vec::new()), ("ns/chunk", Vec::new())];
    for i in 0..5 {
        for (k, (series, unit)) in [
            ("ns/seg", DedupUnit::Segment),
            ("ns/chunk", DedupUnit::Chunk),
        ]
        .into_iter()
        .enumerate()
        {
            let d = random(1_200_000, 100 + i * 2 + k as u64);
            let v = backup_bytes(&store, series, &d, unit).version;
            expected[k].1.push((v, d));
        }
        remote.sync(&store).unwrap();
    }
    assert_eq!(bucket_containers(&url), store_containers(&store));
    let before = bucket_containers(&url).len();
    // Expire the three oldest versions of each series, then collect and compact.
    for series in ["ns/seg", "ns/chunk"] {
        for v in 1..=3 {
            revault_engine::expire(&store, series, &revault_engine::ExpireSel::Version(v)).unwrap();
        }
    }
    revault_engine::gc(
        &store,
        &revault_engine::GcOptions {
            full: true,
            compact_below: 0.9,
        },
    )
    .unwrap();
    remote.sync(&store).unwrap();
    for (_, vs) in expected.iter_mut() {
        vs.retain(|(n, _)| *n > 3);
    }
    let after = bucket_containers(&url);
    assert_eq!(
        after,
        store_containers(&store),
        "the bucket holds exactly the store's containers"
    );
    assert!(
        after.len() < before,
        "freed containers left the bucket ({before} -> {})",
        after.len()
    );
    // Only one head, and only the metadata files it names.
    let objects = s3().objects(&url);
    let heads: Vec<_> = objects
        .iter()
        .filter(|(n, _)| n.starts_with("heads/"))
        .collect();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let head = remote.head().unwrap();
    let meta: BTreeSet<String> = objects
        .iter()
        .filter(|(n, _)| n.starts_with("meta/"))
        .map(|(n, _)| n.clone())
        .collect();
    let named: BTreeSet<String> = head.meta_files.iter().map(|f| f.object.clone()).collect();
    assert_eq!(meta, named);
    // An expired version is gone from a rebuilt store too.
    let key = dir.path().join("key");
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, _r2) = recover_into(rebuilt.path(), &url, &key, false);
    assert_holds(&s2, &expected);
    check_clean(&s2);
}

#[test]
fn evicted_containers_are_read_back_from_the_bucket() {
    let url = fresh_url("evict");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let expected = history(&store, &remote, 4);
    revault_engine::set_retention(&store, "ns/seg", manual_live_1()).unwrap();
    revault_engine::slide(&store, "ns/seg").unwrap();
    let live = revault_engine::live_containers(&store).unwrap();
    let rep = remote
        .evict(
            &store,
            &EvictOptions {
                older_than: Duration::ZERO,
            },
        )
        .unwrap();
    assert!(rep.evicted > 0, "{rep:?}");
    assert_eq!(rep.live as usize, live.len(), "{rep:?}");
    for id in &live {
        assert!(
            id.path(store.data_dir()).exists(),
            "a container a live version reads stays local"
        );
    }
    // Every version restores, the archival ones through ranged GETs of the bucket.
    assert_holds(&store, &expected);
    check_clean(&store);
    // gc compacts evicted containers (reading them back) and the result is durable.
    for v in 1..=2 {
        revault_engine::expire(&store, "ns/chunk", &revault_engine::ExpireSel::Version(v)).unwrap();
    }
    revault_engine::gc(
        &store,
        &revault_engine::GcOptions {
            full: true,
            compact_below: 0.99,
        },
    )
    .unwrap();
    remote.sync(&store).unwrap();
    let mut expected = expected;
    expected[1].1.retain(|(n, _)| *n > 2);
    assert_holds(&store, &expected);
    check_clean(&store);
    // A reopened store (a restarted CLI or worker) attaches its remote and still reads them.
    drop(remote);
    drop(store);
    let store = Store::open(&dir.path().join("store"), OpenMode::ReadOnly, "test").unwrap();
    let _r = Remote::attach(&store, None).unwrap().unwrap();
    assert_holds(&store, &expected);
}

#[test]
fn a_tampered_container_is_reported_by_name_and_never_served() {
    let url = fresh_url("tamper");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let expected = history(&store, &remote, 2);
    remote
        .evict(
            &store,
            &EvictOptions {
                older_than: Duration::ZERO,
            },
        )
        .unwrap();
    // Everything is live, so nothing was evicted: evict by hand what version 1 of the chunk
    // series reads, as an older window would.
    let evicted: Vec<_> = store_containers(&store).into_iter().collect();
    let victim = evicted[0].clone();
    let path = s3().object_path(&url, &victim);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    // Remove every local copy so reads must go to the bucket.
    for name in &evicted {
        let id = revault_engine::ContainerId(u64::from_str_radix(&name[5..], 16).unwrap());
        store.evict_container(id).unwrap();
    }
    let mut failures = 0;
    for (series, versions) in &expected {
        for (n, data) in versions {
            match restore_bytes(&store, series, *n) {
                Ok(got) => assert!(got == *data, "{series} v{n}: wrong bytes served"),
                Err(e) => {
                    failures += 1;
                    let m = e.to_string();
                    assert_eq!(e.code(), "corrupt_container", "{m}");
                    assert!(
                        m.contains(&victim) && m.contains(&url.bucket),
                        "names the object: {m}"
                    );
                }
            }
        }
    }
    assert!(failures > 0, "some version reads the tampered container");
    let rep = revault_engine::check(&store).unwrap();
    assert!(
        !rep.ok && rep.errors.iter().any(|e| e.contains(&victim)),
        "{:?}",
        rep.errors
    );
    // A rebuild refuses the tampered container instead of installing it.
    let key = dir.path().join("key");
    let rebuilt = tempfile::tempdir().unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: key,
        store: rebuilt.path().to_path_buf(),
        data_dir: None,
        lazy: false,
    })
    .err()
    .unwrap();
    assert_eq!(e.code(), "remote_corrupt", "{e}");
    assert!(e.to_string().contains(&victim), "{e}");
}

#[test]
fn tampered_metadata_stops_a_rebuild_and_names_the_object() {
    let url = fresh_url("tampermeta");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    history(&store, &remote, 2);
    let head = remote.head().unwrap();
    let key = dir.path().join("key");
    // One metadata file swapped for another (both validly sealed, under other names).
    let a = s3().object_path(&url, &head.meta_files[0].object);
    let b = s3().object_path(&url, &head.meta_files[1].object);
    let saved = std::fs::read(&a).unwrap();
    std::fs::copy(&b, &a).unwrap();
    let target = tempfile::tempdir().unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: key.clone(),
        store: target.path().join("s"),
        data_dir: None,
        lazy: true,
    })
    .err()
    .unwrap();
    assert_eq!(e.code(), "remote_corrupt", "{e}");
    assert!(e.to_string().contains(&head.meta_files[0].object), "{e}");
    std::fs::write(&a, saved).unwrap();
    // The head itself edited.
    let hp = s3().object_path(
        &url,
        &format!("heads/{:08x}-{:016x}", head.generation, head.seq),
    );
    let mut h = std::fs::read(&hp).unwrap();
    let last = h.len() - 1;
    h[last] ^= 1;
    std::fs::write(&hp, &h).unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: key,
        store: target.path().join("t"),
        data_dir: None,
        lazy: true,
    })
    .err()
    .unwrap();
    assert_eq!(e.code(), "remote_corrupt", "{e}");
    assert!(e.to_string().contains("heads/"), "{e}");
}

#[test]
fn a_wrong_key_file_opens_nothing() {
    let url = fresh_url("wrongkey");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    history(&store, &remote, 1);
    let other = dir.path().join("other-key");
    revault_remote::create_key_file(&other).unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: other.clone(),
        store: dir.path().join("rebuilt"),
        data_dir: None,
        lazy: false,
    })
    .err()
    .unwrap();
    assert_eq!(e.code(), "wrong_key", "{e}");
    assert!(e.to_string().contains(&url.to_string()), "{e}");
    assert!(!dir.path().join("rebuilt").join("revault.store").exists());
    drop(remote);
    let e = Remote::attach(&store, Some(&other)).err().unwrap();
    assert_eq!(e.code(), "wrong_key", "{e}");
}

/// A leaked key file is replaced without re-encrypting anything, in two runs of the same
/// rotation: after the first both key files open the remote (the new one is copied away, or
/// rolled out to a cluster, meanwhile); after the second (told to drop the old key file) the
/// old one opens nothing, an escrow key file added earlier still does, the store goes on syncing
/// with the key file it now records, and the new one rebuilds every version. A rotation given
/// a key file that does not open the remote, or the same key twice, changes nothing.
#[test]
fn a_rotated_key_file_replaces_the_old_one() {
    let url = fresh_url("rotate");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let mut expected = history(&store, &remote, 2);
    // Reopened without its remote, as `revault remote rotate-key --store` holds it.
    drop(remote);
    drop(store);
    let root = dir.path().join("store");
    let store = Store::open(&root, OpenMode::ReadWrite, "test").unwrap();
    let key = |name: &str| dir.path().join(name);
    let (old, new, escrow) = (key("key"), key("new-key"), key("escrow-key"));
    let rotation = |from: &std::path::Path, to: &std::path::Path, drop_old: bool| {
        rotate_key(&RotateOptions {
            url: url.clone(),
            key_file: from.to_path_buf(),
            new_key_file: to.to_path_buf(),
            drop_old,
            store_root: Some(root.clone()),
        })
    };
    let recorded = || {
        revault_remote::LocalConfig::read(&root)
            .unwrap()
            .unwrap()
            .key_file
    };
    let stranger = key("stranger");
    revault_remote::create_key_file(&stranger).unwrap();
    let e = rotation(&stranger, &new, false).unwrap_err();
    assert_eq!(e.code(), "wrong_key", "{e}");
    assert!(!new.exists(), "a refused rotation creates no key file");
    let same = rotation(&old, &old, false).unwrap();
    assert!(same.same_key && same.removed.is_none(), "{same:?}");
    let e = rotation(&old, &root.join("key"), false).unwrap_err();
    assert!(e.to_string().contains("inside the store"), "{e}");
    // An escrow key kept offline: added beside the old one (a first run), never dropped.
    let esc = rotation(&old, &escrow, false).unwrap();
    assert!(
        esc.added && !esc.finished && esc.removed.is_none(),
        "{esc:?}"
    );

    let first = rotation(&old, &new, false).unwrap();
    assert!(
        first.created_key_file && first.added && !first.finished,
        "{first:?}"
    );
    assert_eq!(first.key_files.len(), 3, "{first:?}");
    assert_eq!(
        recorded(),
        old,
        "the store keeps its key file until the old one is dropped"
    );
    // The first step run again (its answer lost, say) adds nothing and drops nothing.
    let again = rotation(&old, &new, false).unwrap();
    assert!(
        !again.added && !again.finished && again.removed.is_none(),
        "{again:?}"
    );
    for k in [&old, &new, &escrow] {
        owner(&url, k).unwrap();
    }
    // A wrong key file given as the one to replace, half-way: not mistaken for a finished
    // rotation (the new key file opens the remote, but so do others).
    let e = rotation(&stranger, &new, true).unwrap_err();
    assert!(e.to_string().contains("not one of them"), "{e}");
    owner(&url, &old).unwrap();

    let second = rotation(&old, &new, true).unwrap();
    assert!(!second.added && second.finished, "{second:?}");
    assert!(second.removed.is_some(), "{second:?}");
    assert_eq!(second.key_files.len(), 2, "{second:?}");
    assert_eq!(recorded(), new);
    assert_eq!(owner(&url, &old).unwrap_err().code(), "wrong_key");
    owner(&url, &escrow).unwrap();
    // Run again, with the escrow key file still there: which key file is the old one cannot
    // be told, so it is refused rather than said to be finished; and a drop before its add
    // (a key file that opens nothing yet) is refused and creates nothing.
    let e = rotation(&old, &new, true).unwrap_err();
    assert_eq!(e.code(), "invalid_argument", "{e}");
    let e = rotation(&new, &new, true).unwrap_err();
    assert_eq!(e.code(), "invalid_argument", "{e}");
    let e = rotation(&new, &key("later"), true).unwrap_err();
    assert!(e.to_string().contains("without --drop-old first"), "{e}");
    assert!(!key("later").exists());

    // The store reads the new key file from its record, and goes on.
    let remote = Remote::attach(&store, None).unwrap().unwrap();
    let next = version_data(1, 7, 1_300_000);
    let v = backup_bytes(&store, "ns/seg", &next, DedupUnit::Segment).version;
    remote.sync(&store).unwrap();
    assert_eq!(remote.durable_version("ns/seg"), Some(v));
    expected[0].1.push((v, next));
    drop(remote);
    drop(store);

    let rebuilt = tempfile::tempdir().unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: old.clone(),
        store: rebuilt.path().join("old"),
        data_dir: None,
        lazy: false,
    })
    .err()
    .unwrap();
    assert_eq!(e.code(), "wrong_key", "{e}");
    let (s2, _r2) = recover_into(&rebuilt.path().join("new"), &url, &new, false);
    assert_holds(&s2, &expected);
    check_clean(&s2);
}

/// A descriptor copied over this store's from another store opened by the same key file (a
/// cluster's stores share one) opens and verifies; a rotation must refuse it rather than
/// rewrite it, which would leave this store's data key wrapped only in an older version.
#[test]
fn a_rotation_refuses_a_descriptor_copied_from_another_store() {
    let (a, b) = (fresh_url("rotate-swap-a"), fresh_url("rotate-swap-b"));
    let dir = tempfile::tempdir().unwrap();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let (sa, ra) = new_store_with_remote(&da, &a);
    std::fs::copy(da.join("key"), db.join("key")).unwrap();
    let (sb, rb) = store_with_remote_and_key(&db, &b);
    history(&sa, &ra, 1);
    history(&sb, &rb, 1);
    let desc = |u: &revault_remote::RemoteUrl| s3().object_path(u, "revault-remote.json");
    std::fs::copy(desc(&b), desc(&a)).unwrap();
    let before = std::fs::read(desc(&a)).unwrap();
    let e = rotate_key(&RotateOptions {
        url: a.clone(),
        key_file: da.join("key"),
        new_key_file: dir.path().join("new-key"),
        drop_old: false,
        store_root: None,
    })
    .unwrap_err();
    assert_eq!(e.code(), "remote_corrupt", "{e}");
    assert!(e.to_string().contains("no generation claim"), "{e}");
    assert_eq!(
        std::fs::read(desc(&a)).unwrap(),
        before,
        "nothing was written"
    );
}

/// Under Object Lock the descriptor's name takes a new version at each write; the rotation
/// works the same, counts the older versions (they still wrap the data key for the old key
/// file), and the new key file alone rebuilds the store.
#[test]
fn a_key_file_rotates_under_object_lock() {
    let url = fresh_url("rotate-locked");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = locked_store(dir.path(), &url, 8);
    let expected = history(&store, &remote, 1);
    drop(remote);
    drop(store);
    let (old, new) = (dir.path().join("key"), dir.path().join("new-key"));
    let rotation = |drop_old: bool| {
        rotate_key(&RotateOptions {
            url: url.clone(),
            key_file: old.clone(),
            new_key_file: new.clone(),
            drop_old,
            store_root: None,
        })
        .unwrap()
    };
    let first = rotation(false);
    assert!(first.added && !first.finished, "{first:?}");
    let second = rotation(true);
    assert!(second.removed.is_some() && second.finished, "{second:?}");
    assert_eq!(second.older_descriptor_versions, Some(2), "{second:?}");
    assert_eq!(owner(&url, &old).unwrap_err().code(), "wrong_key");
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, _r2) = recover_into(rebuilt.path(), &url, &new, true);
    assert_holds(&s2, &expected);
}

#[test]
fn a_recovered_store_fences_the_old_one_out() {
    let url = fresh_url("fence");
    let dir = tempfile::tempdir().unwrap();
    let (old, old_remote) = new_store_with_remote(dir.path(), &url);
    let mut expected = history(&old, &old_remote, 3);
    let key = dir.path().join("key");
    // The node was only partitioned: its store lives on while another node rebuilds it.
    let newdir = tempfile::tempdir().unwrap();
    let (new, new_remote) = recover_into(newdir.path(), &url, &key, false);
    // The old store keeps changing: a backup, then expiry and gc that free containers the
    // new store still needs. None of it may reach the bucket.
    backup_bytes(&old, "ns/seg", &random(100_000, 77), DedupUnit::Segment);
    let e = old_remote.sync(&old).unwrap_err();
    assert_eq!(e.code(), "remote_fenced", "{e}");
    for v in 1..=2 {
        revault_engine::expire(&old, "ns/seg", &revault_engine::ExpireSel::Version(v)).unwrap();
    }
    revault_engine::gc(
        &old,
        &revault_engine::GcOptions {
            full: true,
            compact_below: 0.9,
        },
    )
    .unwrap();
    assert_eq!(old_remote.sync(&old).unwrap_err().code(), "remote_fenced");
    // The new store goes on, and a third rebuild has all of its history.
    let next = version_data(1, 7, 1_300_000);
    let v = backup_bytes(&new, "ns/seg", &next, DedupUnit::Segment).version;
    new_remote.sync(&new).unwrap();
    expected[0].1.push((v, next));
    let third = tempfile::tempdir().unwrap();
    let (s3_, _r3) = recover_into(third.path(), &url, &key, false);
    assert_holds(&s3_, &expected);
    check_clean(&s3_);
}

/// A sync stopped at each of its steps (as a killed process would) leaves a bucket a store
/// can be rebuilt from, holding at least what the previous sync published; and when the
/// process restarts instead, its first sync publishes and removes what the stopped one left.
#[test]
fn a_sync_stopped_at_any_step_leaves_a_recoverable_bucket() {
    for step in [
        "sync.uploaded",
        "sync.meta",
        "sync.head_writing",
        "sync.head_written",
        "sync.published",
        "sync.deleting",
    ] {
        for after in [After::NodeDies, After::Restarts, After::GoesOn] {
            // Without and with early uploads (the CLI's): the containers of the new version
            // and of gc's compaction then go up while they are written.
            for early in [false, true] {
                stopped_sync(step, after, early);
            }
        }
    }
}

/// What happens after a sync stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
enum After {
    /// The node is lost: the store is rebuilt from the bucket.
    NodeDies,
    /// The process restarts and syncs.
    Restarts,
    /// The same process syncs again (a worker retrying): it must clean up as a new process
    /// would, though it opened with clean records and never listed the bucket.
    GoesOn,
}

fn stopped_sync(step: &str, after_stop: After, early: bool) {
    let url = fresh_url(&step.replace(['.', '_'], "-"));
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    if early {
        remote.upload_as_sealed(&store);
    }
    let mut expected = history(&store, &remote, 2);
    // What the stopped sync was to publish: a new version, an expiry, a gc.
    let extra = version_data(1, 5, 1_300_000);
    let v = backup_bytes(&store, "ns/seg", &extra, DedupUnit::Segment).version;
    revault_engine::expire(&store, "ns/chunk", &revault_engine::ExpireSel::Version(1)).unwrap();
    revault_engine::gc(
        &store,
        &revault_engine::GcOptions {
            full: true,
            compact_below: 0.9,
        },
    )
    .unwrap();
    remote.set_failpoint(Some(step));
    assert!(remote.sync(&store).is_err(), "{step}");
    let key = dir.path().join("key");
    let mut after = expected.clone();
    after[0].1.push((v, extra));
    after[1].1.retain(|(n, _)| *n != 1);
    if after_stop == After::NodeDies {
        if matches!(
            step,
            "sync.head_written" | "sync.published" | "sync.deleting"
        ) {
            expected = after;
        }
        let rebuilt = tempfile::tempdir().unwrap();
        let (s2, _r2) = recover_into(rebuilt.path(), &url, &key, false);
        assert_holds(&s2, &expected);
        check_clean(&s2);
        return;
    }
    let (store, remote) = if after_stop == After::Restarts {
        drop(remote);
        drop(store);
        let store = Store::open(&dir.path().join("store"), OpenMode::ReadWrite, "test").unwrap();
        let remote = Remote::attach(&store, None).unwrap().unwrap();
        if early {
            remote.upload_as_sealed(&store);
        }
        (store, remote)
    } else {
        remote.set_failpoint(None);
        (store, remote)
    };
    remote.sync(&store).unwrap();
    assert_eq!(
        bucket_containers(&url),
        store_containers(&store),
        "{step}, {after_stop:?}, early {early}: leftover containers"
    );
    let named: BTreeSet<String> = remote
        .head()
        .unwrap()
        .meta_files
        .into_iter()
        .map(|f| f.object)
        .collect();
    let meta: BTreeSet<String> = s3()
        .objects(&url)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("meta/"))
        .collect();
    assert_eq!(
        meta, named,
        "{step}, {after_stop:?}, early {early}: leftover metadata files"
    );
    let heads = s3()
        .objects(&url)
        .into_iter()
        .filter(|(n, _)| n.starts_with("heads/"))
        .count();
    assert_eq!(heads, 1, "{step}");
    let rebuilt = tempfile::tempdir().unwrap();
    let (s3_, _r3) = recover_into(rebuilt.path(), &url, &key, false);
    assert_holds(&s3_, &after);
}

/// A store in `dir` whose remote writes every object with Object Lock (compliance mode) for
/// `seconds`.
fn locked_store(
    dir: &std::path::Path,
    url: &revault_remote::RemoteUrl,
    seconds: u64,
) -> (Store, Remote) {
    let root = dir.join("store");
    Store::init(
        &root,
        &revault_engine::InitOptions {
            config: small_config(),
            data_dir: None,
        },
    )
    .unwrap();
    let store = Store::open(&root, OpenMode::ReadWrite, "test").unwrap();
    let (remote, _) = Remote::init(
        &store,
        &revault_remote::InitRemote {
            url: url.clone(),
            key_file: dir.join("key"),
            object_lock: Some(revault_remote::ObjectLock {
                compliance: true,
                seconds,
            }),
        },
    )
    .unwrap();
    (store, remote)
}

/// Each object is locked from its upload; what the newest head still needs keeps being locked
/// long after that (the uploader extends it), so nobody holding the credentials can destroy a
/// backup that can still be restored, however old its data. What is not needed any more is
/// not extended: it is purged once its own retention ends.
#[test]
fn object_lock_keeps_what_is_still_needed_locked() {
    let url = fresh_url("lock-extend");
    let dir = tempfile::tempdir().unwrap();
    let retention = 8;
    let (store, remote) = locked_store(dir.path(), &url, retention);
    let d1 = random(1_500_000, 11);
    let d2 = random(1_500_000, 12);
    backup_bytes(&store, "ns/a", &d1, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    let first: BTreeSet<String> = store_containers(&store);
    backup_bytes(&store, "ns/b", &d2, DedupUnit::Chunk);
    backup_bytes(&store, "ns/b", &random(300_000, 13), DedupUnit::Chunk);
    // An idle worker's uploader, for twice the retention: a sync when one is due. In the
    // second half a change waits and every upload fails: the upkeep must go on regardless.
    let mut extended = 0;
    let t0 = std::time::Instant::now();
    let mut failing = false;
    while t0.elapsed() < Duration::from_secs(2 * retention) {
        if !failing && t0.elapsed() >= Duration::from_secs(retention) {
            failing = true;
            remote.set_failpoint(Some("sync.uploaded"));
            backup_bytes(&store, "ns/c", &random(200_000, 14), DedupUnit::Chunk);
        }
        if remote.needs_sync(&store) {
            match remote.sync(&store) {
                Ok(rep) => extended += rep.locks_extended,
                Err(e) => assert!(failing, "{e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Still failing: the oldest objects (uploaded 2 retentions ago) are locked all the same.
    let versions = remote.versions_for_test().unwrap();
    let oldest: Vec<_> = versions
        .iter()
        .filter(|(n, _, latest, _)| {
            *latest && (first.contains(n.as_str()) || n.as_str() == "revault-remote.json")
        })
        .collect();
    assert_eq!(oldest.len(), first.len() + 1, "{versions:?}");
    for (name, id, _, _) in oldest {
        let e = match remote.delete_version_for_test(name, id) {
            Ok(()) => panic!("{name} could be deleted while uploads failed"),
            Err(e) => e,
        };
        assert_eq!(e.code(), "remote_denied", "{name}: {e}");
    }
    remote.set_failpoint(None);
    remote.sync(&store).unwrap();
    assert!(extended > 0, "the retention of needed objects was extended");
    // ns/b's first version goes: its containers are hidden, and not extended.
    revault_engine::expire(&store, "ns/b", &revault_engine::ExpireSel::Version(1)).unwrap();
    remote.sync(&store).unwrap();
    let versions = remote.versions_for_test().unwrap();
    let current: Vec<_> = versions
        .iter()
        .filter(|(_, _, latest, marker)| *latest && !marker)
        .collect();
    let data: BTreeSet<String> = current
        .iter()
        .filter(|(n, ..)| n.starts_with("data/"))
        .map(|(n, ..)| n.clone())
        .collect();
    assert_eq!(
        data,
        store_containers(&store),
        "what is current is what the store needs"
    );
    assert!(data.is_superset(&first), "ns/a's containers are current");
    // Someone with the worker's credentials tries to destroy what the head needs, the oldest
    // objects (the descriptor, version 1's containers) locked from uploads two retentions
    // ago. (Metadata files the failed syncs uploaded and no head names are not needed: the
    // next process's first sync deletes them.)
    let head = remote.head().unwrap();
    let meta: BTreeSet<&str> = head.meta_files.iter().map(|f| f.object.as_str()).collect();
    let needed: Vec<_> = current
        .iter()
        .filter(|(n, ..)| !n.starts_with("meta/") || meta.contains(n.as_str()))
        .collect();
    assert!(needed.len() > first.len() + meta.len(), "{needed:?}");
    for (name, id, _, _) in needed {
        let e = match remote.delete_version_for_test(name, id) {
            Ok(()) => panic!("{name}, still needed, could be deleted"),
            Err(e) => e,
        };
        assert_eq!(e.code(), "remote_denied", "{name} is still needed: {e}");
    }
    // What ns/b freed was locked from its upload only: it is purged once that ends.
    std::thread::sleep(Duration::from_secs(2 * retention + 2));
    while remote.needs_sync(&store) {
        remote.sync(&store).unwrap();
    }
    let left: Vec<_> = remote
        .versions_for_test()
        .unwrap()
        .into_iter()
        .filter(|(n, _, latest, _)| n.starts_with("data/") && !latest)
        .collect();
    assert!(
        left.is_empty(),
        "what ns/b freed was not kept locked: {left:?}"
    );
    drop(remote);
    drop(store);
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, _r2) = recover_into(rebuilt.path(), &url, &dir.path().join("key"), false);
    assert_holds(&s2, &[("ns/a", vec![(1, d1)])]);
}

/// With Object Lock, what expiry and gc free is only hidden (a delete marker): its bytes stay,
/// and nobody holding the credentials can delete them before their retention ends. Then the
/// next sync purges them.
#[test]
fn object_lock_keeps_freed_objects_until_their_retention_ends() {
    let url = fresh_url("lock");
    let dir = tempfile::tempdir().unwrap();
    let retention = 4;
    let (store, remote) = locked_store(dir.path(), &url, retention);
    let d1 = random(1_500_000, 1);
    let d2 = random(1_500_000, 2);
    backup_bytes(&store, "ns/a", &d1, DedupUnit::Chunk);
    backup_bytes(&store, "ns/a", &d2, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    revault_engine::expire(&store, "ns/a", &revault_engine::ExpireSel::Version(1)).unwrap();
    remote.sync(&store).unwrap();
    // What S3 lists (the current versions) is what the store holds.
    let versions = remote.versions_for_test().unwrap();
    let current = |vs: &[(String, String, bool, bool)]| -> BTreeSet<String> {
        vs.iter()
            .filter(|(n, _, latest, marker)| n.starts_with("data/") && *latest && !marker)
            .map(|(n, _, _, _)| n.clone())
            .collect()
    };
    assert_eq!(current(&versions), store_containers(&store));
    let hidden: Vec<_> = versions
        .iter()
        .filter(|(n, _, latest, marker)| n.starts_with("data/") && !latest && !marker)
        .collect();
    assert!(
        !hidden.is_empty(),
        "version 1's containers are kept behind delete markers: {versions:?}"
    );
    // Large objects go up in parts, with Object Lock too.
    let big = random(40 << 20, 9);
    assert!(remote.put_get_for_test("test/big", big.clone()).unwrap() == big);
    // Someone with the worker's credentials tries to destroy them for good.
    let (name, id, _, _) = hidden[0];
    let e = remote.delete_version_for_test(name, id).unwrap_err();
    assert_eq!(e.code(), "remote_denied", "{e}");
    // Once the retention is over, the next sync purges them.
    std::thread::sleep(Duration::from_secs(2 * retention + 2));
    remote.sync(&store).unwrap();
    let after = remote.versions_for_test().unwrap();
    let left: Vec<_> = after
        .iter()
        .filter(|(n, _, latest, _)| n.starts_with("data/") && !latest)
        .collect();
    assert!(left.is_empty(), "purged: {left:?}");
    assert_eq!(
        current(&after),
        store_containers(&store),
        "nothing current was purged"
    );
    drop(remote);
    drop(store);
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, r2) = recover_into(rebuilt.path(), &url, &dir.path().join("key"), false);
    assert_holds(&s2, &[("ns/a", vec![(2, d2)])]);
    // The rebuilt store keeps writing with Object Lock.
    let d3 = random(200_000, 3);
    backup_bytes(&s2, "ns/a", &d3, DedupUnit::Chunk);
    r2.sync(&s2).unwrap();
    let objects = r2.versions_for_test().unwrap();
    let (name, id, _, _) = objects
        .iter()
        .find(|(n, _, l, _)| n.starts_with("heads/00000002") && *l)
        .expect("a head of generation 2");
    let e = r2.delete_version_for_test(name, id).unwrap_err();
    assert_eq!(
        e.code(),
        "remote_denied",
        "the rebuilt store's objects are locked too: {e}"
    );
}

/// A rebuild cut short (a crash, a power cut) leaves its staging directory and whatever it had
/// moved: no store marker, so nothing opens it as a store, and the next `recover` clears it and
/// completes. An unrelated non-empty directory is refused.
#[test]
fn an_interrupted_rebuild_is_finished_by_the_next_one() {
    let url = fresh_url("interrupted");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let expected = history(&store, &remote, 2);
    let key = dir.path().join("key");
    let target = dir.path().join("rebuilt");
    // What a rebuild killed half-way leaves.
    std::fs::create_dir_all(target.join(".recovering/meta")).unwrap();
    std::fs::write(target.join(".recovering/meta/000001.sst"), b"partial").unwrap();
    std::fs::create_dir_all(target.join("data/00000001")).unwrap();
    std::fs::write(target.join("data/00000001/000000.rvc"), b"partial").unwrap();
    let e = Store::open(&target, OpenMode::ReadOnly, "test")
        .err()
        .unwrap();
    assert_eq!(e.code(), "not_initialised", "{e}");
    let (s2, _r2) = recover_into(&target, &url, &key, false);
    assert!(!target.join(".recovering").exists());
    assert_holds(&s2, &expected);
    check_clean(&s2);
    // A directory that holds something else is not ours to clear.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let e = recover(&RecoverOptions {
        url,
        key_file: key,
        store: other.clone(),
        data_dir: None,
        lazy: true,
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("is not empty"), "{e}");
    assert_eq!(std::fs::read(other.join("notes.txt")).unwrap(), b"mine");
}
