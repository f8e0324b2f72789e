//! Bad days for the durable tier, each once found by review: a store whose disk went back in
//! time, a recovery landing between a sync's fence check and its head, a stranger's objects in
//! the bucket, a truncated object read through a prefetch, the uploader's records lost with
//! containers evicted, an init killed half-way, deletions that failed and are retried, and a
//! descriptor edited in the bucket by someone without the key.

mod common;

use std::time::Duration;

use common::*;
use revault_engine::{DedupUnit, ExpireSel, GcOptions, OpenMode, Store};
use revault_remote::{recover, EvictOptions, RecoverOptions, Remote, RemoteUrl};

fn rebuild(url: &RemoteUrl, key: &std::path::Path) -> (tempfile::TempDir, Store, Remote) {
    let dir = tempfile::tempdir().unwrap();
    let (s, r, _) = recover(&RecoverOptions {
        url: url.clone(),
        key_file: key.to_path_buf(),
        store: dir.path().join("s"),
        data_dir: None,
        lazy: false,
    })
    .unwrap();
    (dir, s, r)
}

/// The store at `root` opened again with its remote, as a restarted process does.
fn reopen(root: &std::path::Path) -> (Store, Remote) {
    let store = Store::open(root, OpenMode::ReadWrite, "test").unwrap();
    let remote = Remote::attach(&store, None).unwrap().unwrap();
    (store, remote)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// A store's disk put back from a snapshot (metadata and the uploader's records together) must
/// not publish its older state over the newer one in the bucket, nor delete what that needs.
#[test]
fn a_store_whose_disk_went_back_in_time_uploads_and_deletes_nothing() {
    let url = fresh_url("rollback");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(1_200_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    drop(remote);
    drop(store);
    copy_dir(&root, &dir.path().join("snapshot"));
    let (store, remote) = reopen(&root);
    let v2 = random(1_200_000, 2);
    backup_bytes(&store, "ns/a", &v2, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    remote
        .evict(
            &store,
            &EvictOptions {
                older_than: Duration::ZERO,
            },
        )
        .unwrap();
    drop(remote);
    drop(store);
    // The snapshot comes back, and changes something.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::rename(dir.path().join("snapshot"), &root).unwrap();
    let (store, remote) = reopen(&root);
    // As the CLI does: containers go up as they are sealed. The rolled-back store reuses the
    // session (so the container names) of version 2, whose only copy is in the bucket now.
    remote.upload_as_sealed(&store);
    backup_bytes(&store, "ns/a", &random(300_000, 3), DedupUnit::Chunk);
    let e = remote.sync(&store).unwrap_err();
    assert_eq!(e.code(), "remote_diverged", "{e}");
    assert!(e.to_string().contains("revault recover"), "{e}");
    // Early uploads still under way get the time to land (a PUT may, after its process
    // ended): none may have replaced version 2's container.
    std::thread::sleep(Duration::from_secs(2));
    // The bucket still holds the newer state, whole.
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s2, &[("ns/a", vec![(1, v1), (2, v2)])]);
}

/// A recovery that claims the remote between a sync's last fence check and its head: the old
/// store must not report the head as durable (the new owner may never have seen it).
#[test]
fn a_head_written_as_the_store_is_taken_over_is_not_reported_durable() {
    let url = fresh_url("racehead");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(800_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    backup_bytes(&store, "ns/a", &random(800_000, 2), DedupUnit::Chunk);
    let (u, key) = (url.clone(), dir.path().join("key"));
    let taken = std::sync::Arc::new(std::sync::Mutex::new(None));
    let t = taken.clone();
    remote.before_head(Box::new(move || {
        *t.lock().unwrap() = Some(rebuild(&u, &key));
    }));
    let e = remote.sync(&store).unwrap_err();
    assert_eq!(e.code(), "remote_fenced", "{e}");
    assert_eq!(
        remote.durable_version("ns/a"),
        Some(1),
        "version 2 is not claimed durable"
    );
    // The new owner goes on from what it saw: version 1.
    let (_d, s2, r2) = taken.lock().unwrap().take().unwrap();
    assert_holds(&s2, &[("ns/a", vec![(1, v1.clone())])]);
    r2.sync(&s2).unwrap();
    drop((s2, r2));
    let (_d3, s3, _r3) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s3, &[("ns/a", vec![(1, v1)])]);
}

/// Objects anyone could write under `gens/` and `heads/` are no claim and no head.
#[test]
fn a_strangers_claims_and_heads_fence_nothing() {
    let url = fresh_url("stranger");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(500_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Segment);
    remote.sync(&store).unwrap();
    for name in ["gens/ffffffff", "heads/fffffffe-0000000000000001"] {
        let p = s3().object_path(&url, name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"not a claim").unwrap();
    }
    backup_bytes(&store, "ns/a", &random(500_000, 2), DedupUnit::Segment);
    remote
        .sync(&store)
        .expect("a stranger's claim does not fence the store");
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_eq!(s2.versions(&s2.series("ns/a").unwrap()).unwrap().len(), 2);
}

/// A truncated or changed object in the bucket, read through a restore's prefetch, is reported
/// as corrupt and names the object, not as the remote being away.
#[test]
fn a_truncated_object_read_through_a_prefetch_is_corrupt_not_unavailable() {
    let url = fresh_url("truncated");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(6_000_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    let mut victim = String::new();
    store
        .meta()
        .for_each_prefix(revault_engine::keys::CF_CONTAINERS, b"", |k, _| {
            let id = revault_engine::ContainerId(u64::from_be_bytes(k.try_into().unwrap()));
            store.evict_container(id).unwrap();
            victim = format!("data/{:016x}", id.0);
            Ok(true)
        })
        .unwrap();
    let p = s3().object_path(&url, &victim);
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 3]).unwrap();
    let e = restore_bytes(&store, "ns/a", 1).unwrap_err();
    assert_eq!(e.code(), "corrupt_container", "{e}");
    assert!(e.to_string().contains(&victim), "{e}");
}

/// The uploader's records (remote/state) lost while containers are evicted: the next sync finds
/// them in the bucket instead of failing on their missing local files, and they stay readable.
#[test]
fn losing_the_uploaders_records_with_containers_evicted_loses_nothing() {
    let url = fresh_url("state-lost");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    revault_engine::set_retention(&store, "ns/a", manual_live_1()).unwrap();
    let v1 = random(1_500_000, 1);
    let mut v2 = v1.clone();
    v2[..100_000].copy_from_slice(&random(100_000, 2));
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    backup_bytes(&store, "ns/a", &v2, DedupUnit::Chunk);
    revault_engine::slide(&store, "ns/a").unwrap();
    let rep = remote
        .evict(
            &store,
            &EvictOptions {
                older_than: Duration::ZERO,
            },
        )
        .unwrap();
    assert!(rep.evicted > 0, "{rep:?}");
    drop(remote);
    drop(store);
    std::fs::remove_dir_all(root.join("remote/state")).unwrap();
    let (store, remote) = reopen(&root);
    backup_bytes(&store, "ns/a", &random(200_000, 3), DedupUnit::Chunk);
    remote
        .sync(&store)
        .expect("the evicted containers are found in the bucket");
    assert_eq!(restore_bytes(&store, "ns/a", 1).unwrap(), v1);
    let rep = revault_engine::check(&store).unwrap();
    assert!(rep.ok, "{:?}", rep.errors);
}

/// An init killed after it wrote the remote's descriptor and before the store recorded its
/// remote: running it again with the same key file finishes it (the prefix is refused to a
/// different key).
#[test]
fn an_init_killed_half_way_is_finished_by_the_next() {
    let url = fresh_url("half-init");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let store_id = remote.store_id().to_string();
    let root = store.root().to_path_buf();
    drop(remote);
    drop(store);
    // What the killed init left: the descriptor and its claim, nothing else.
    for (name, _) in s3().objects(&url) {
        if name.starts_with("heads/") || name.starts_with("meta/") {
            std::fs::remove_file(s3().object_path(&url, &name)).unwrap();
        }
    }
    std::fs::remove_dir_all(root.join("remote")).unwrap();
    let store = Store::open(&root, OpenMode::ReadWrite, "test").unwrap();
    let other = dir.path().join("other-key");
    revault_remote::create_key_file(&other).unwrap();
    let init = |key: std::path::PathBuf| {
        Remote::init(
            &store,
            &revault_remote::InitRemote {
                url: url.clone(),
                key_file: key,
                object_lock: None,
            },
        )
    };
    let e = init(other).err().unwrap();
    assert_eq!(e.code(), "remote_exists", "{e}");
    let (remote, _) = init(dir.path().join("key")).unwrap();
    assert_eq!(remote.store_id(), store_id, "the same store");
    let v = random(400_000, 9);
    backup_bytes(&store, "ns/a", &v, DedupUnit::Segment);
    remote.sync(&store).unwrap();
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s2, &[("ns/a", vec![(1, v)])]);
}

/// Syncs whose deletions fail, again and again in one process, then one that succeeds: the
/// newest head is always whole (nothing it names was deleted), and the bucket ends up holding
/// exactly what the store needs.
#[test]
fn deletions_that_failed_and_are_retried_never_remove_what_the_newest_head_names() {
    let url = fresh_url("retried-deletes");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let mut kept = Vec::new();
    for i in 0..8u64 {
        let d = random(300_000, 100 + i);
        let v = backup_bytes(&store, "ns/a", &d, DedupUnit::Chunk).version;
        kept.push((v, d));
        if i >= 2 {
            revault_engine::expire(&store, "ns/a", &ExpireSel::Version(kept[0].0)).unwrap();
            kept.remove(0);
            revault_engine::gc(
                &store,
                &GcOptions {
                    full: true,
                    compact_below: 0.9,
                },
            )
            .unwrap();
        }
        remote.set_failpoint((i % 2 == 0).then_some("sync.deleting"));
        let _ = remote.sync(&store);
        let head = remote.head().unwrap();
        let objects: std::collections::BTreeSet<String> =
            s3().objects(&url).into_iter().map(|(n, _)| n).collect();
        for f in &head.meta_files {
            assert!(
                objects.contains(&f.object),
                "round {i}: the newest head names {}, which is gone",
                f.object
            );
        }
    }
    remote.set_failpoint(None);
    remote.sync(&store).unwrap();
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s2, &[("ns/a", kept)]);
}

/// Whoever can write to the bucket but has no key file edits the descriptor (here: switches
/// Object Lock off and keeps the wrapped key): a rebuild refuses it and says why.
#[test]
fn a_descriptor_edited_without_the_key_is_refused() {
    let url = fresh_url("edited-descriptor");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    backup_bytes(&store, "ns/a", &random(100_000, 5), DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    drop(remote);
    drop(store);
    let path = s3().object_path(&url, "revault-remote.json");
    let mut d: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    d["objectLock"] = serde_json::json!({"compliance": false, "seconds": 1});
    std::fs::write(&path, serde_json::to_vec(&d).unwrap()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let e = recover(&RecoverOptions {
        url: url.clone(),
        key_file: dir.path().join("key"),
        store: out.path().join("s"),
        data_dir: None,
        lazy: false,
    })
    .err()
    .expect("the edited descriptor is refused");
    assert_eq!(e.code(), "remote_corrupt", "{e}");
    assert!(e.to_string().contains("revault-remote.json"), "{e}");
    assert!(e.to_string().contains("MAC"), "{e}");
    assert!(!out.path().join("s").join("revault.store").exists());
}

/// A worker killed (or a sync failing) after its head is in the bucket but before it recorded
/// it: the next sync must take that head for its own and go on, not stop as if its disk had
/// gone back in time (found when e2e scenario 7 killed a worker at that moment).
#[test]
fn a_head_written_but_not_recorded_is_the_stores_own() {
    let url = fresh_url("unrecorded");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(900_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    remote.set_failpoint(Some("sync.head_written"));
    assert!(remote.sync(&store).is_err());
    // The process dies there.
    drop(remote);
    drop(store);
    let (store, remote) = reopen(&root);
    let v2 = random(900_000, 2);
    backup_bytes(&store, "ns/a", &v2, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    assert_eq!(remote.durable_version("ns/a"), Some(2));
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s2, &[("ns/a", vec![(1, v1), (2, v2)])]);
}

/// A copy of a store taken after it recorded the head it was about to write but before it
/// wrote it (a disk snapshot at that moment): the original then writes that head itself, with
/// its own bytes. The copy must not take it for the head it was writing, and must not publish
/// over it.
#[test]
fn a_copy_taken_while_a_head_was_being_written_does_not_take_the_originals_head_for_its_own() {
    let url = fresh_url("writingcopy");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let v1 = random(900_000, 1);
    backup_bytes(&store, "ns/a", &v1, DedupUnit::Chunk);
    remote.sync(&store).unwrap();
    let v2 = random(900_000, 2);
    backup_bytes(&store, "ns/a", &v2, DedupUnit::Chunk);
    remote.set_failpoint(Some("sync.head_writing"));
    assert!(remote.sync(&store).is_err());
    drop(remote);
    drop(store);
    copy_dir(&root, &dir.path().join("snapshot"));
    // The original goes on and writes that head (same name, its own bytes).
    let (store, remote) = reopen(&root);
    remote.sync(&store).unwrap();
    assert_eq!(remote.durable_version("ns/a"), Some(2));
    drop(remote);
    drop(store);
    // The copy comes back.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::rename(dir.path().join("snapshot"), &root).unwrap();
    let (store, remote) = reopen(&root);
    backup_bytes(&store, "ns/a", &random(300_000, 3), DedupUnit::Chunk);
    let e = remote.sync(&store).unwrap_err();
    assert_eq!(e.code(), "remote_diverged", "{e}");
    drop(remote);
    drop(store);
    let (_d, s2, _r2) = rebuild(&url, &dir.path().join("key"));
    assert_holds(&s2, &[("ns/a", vec![(1, v1), (2, v2)])]);
}
