//! The bucket out of reach for a while (its own test binary: it stops the S3 server). Backups
//! go on locally; syncs fail with an error that says the remote is unavailable; once the
//! bucket is back, one sync catches up and nothing is lost. A restore that needs a container
//! only the bucket holds fails with `remote_unavailable`, and works once the bucket is back.

mod common;

use common::*;
use std::sync::Mutex;
use std::time::Duration;

use revault_engine::DedupUnit;
use revault_remote::{recover, EvictOptions, RecoverOptions};

/// The tests of this binary stop the one S3 server in turn.
static OUTAGE: Mutex<()> = Mutex::new(());

#[test]
fn backups_go_on_while_the_bucket_is_away_and_durability_catches_up() {
    let _one = OUTAGE.lock().unwrap_or_else(|p| p.into_inner());
    let url = fresh_url("outage");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let mut versions = Vec::new();
    let d = version_data(3, 0, 250_000);
    versions.push((
        backup_bytes(&store, "ns/a", &d, DedupUnit::Segment).version,
        d,
    ));
    remote.sync(&store).unwrap();
    s3().stop();
    for i in 1..4 {
        let d = version_data(3, i, 250_000);
        versions.push((
            backup_bytes(&store, "ns/a", &d, DedupUnit::Segment).version,
            d,
        ));
        let e = remote.sync(&store).unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert_eq!(e.code(), "remote_unavailable", "{e}");
        assert!(remote.is_behind(&store));
        assert_eq!(
            remote.durable_version("ns/a"),
            Some(1),
            "durability stays at what the bucket holds"
        );
    }
    // Every version restores from local disk meanwhile.
    for (n, data) in &versions {
        assert_eq!(&restore_bytes(&store, "ns/a", *n).unwrap(), data);
    }
    s3().resume();
    remote.sync(&store).unwrap();
    assert!(!remote.is_behind(&store));
    assert_eq!(remote.durable_version("ns/a"), Some(4));
    drop(remote);
    drop(store);
    let rebuilt = tempfile::tempdir().unwrap();
    let (s2, _r2, _) = recover(&RecoverOptions {
        url,
        key_file: dir.path().join("key"),
        store: rebuilt.path().to_path_buf(),
        data_dir: None,
        lazy: false,
    })
    .unwrap();
    assert_holds(&s2, &[("ns/a", versions)]);
}

#[test]
fn restoring_an_evicted_container_while_the_bucket_is_away_says_so_and_serves_nothing() {
    let _one = OUTAGE.lock().unwrap_or_else(|p| p.into_inner());
    let url = fresh_url("outage-evicted");
    let dir = tempfile::tempdir().unwrap();
    let (store, remote) = new_store_with_remote(dir.path(), &url);
    let old = random(600_000, 71);
    let new = random(600_000, 72);
    let v_old = backup_bytes(&store, "ns/a", &old, DedupUnit::Segment).version;
    let v_new = backup_bytes(&store, "ns/a", &new, DedupUnit::Segment).version;
    // Only the newest version stays live; the old one is archival, its containers evictable.
    revault_engine::set_retention(&store, "ns/a", manual_live_1()).unwrap();
    revault_engine::slide(&store, "ns/a").unwrap();
    remote.sync(&store).unwrap();
    let rep = remote
        .evict(
            &store,
            &EvictOptions {
                older_than: Duration::ZERO,
            },
        )
        .unwrap();
    assert!(
        rep.evicted > 0,
        "the old version's containers left the disk: {rep:?}"
    );
    s3().stop();
    let e = restore_bytes(&store, "ns/a", v_old).unwrap_err();
    s3().resume();
    assert_eq!(e.kind().code(), "remote_unavailable", "{e}");
    assert_eq!(
        restore_bytes(&store, "ns/a", v_new).unwrap(),
        new,
        "the latest version is local"
    );
    assert_eq!(restore_bytes(&store, "ns/a", v_old).unwrap(), old);
}
