//! The bucket out of reach for a while (its own test binary: it stops the S3 server). Backups
//! go on locally; syncs fail with an error that says the remote is unavailable; once the
//! bucket is back, one sync catches up and nothing is lost.

mod common;

use common::*;
use revault_engine::DedupUnit;
use revault_remote::{recover, RecoverOptions};

#[test]
fn backups_go_on_while_the_bucket_is_away_and_durability_catches_up() {
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
