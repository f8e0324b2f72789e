//! Files and units nothing records, and names in the data directory that
//! are not the store's: a store upgraded from a release that kept no freed
//! (`F`) or zombie (`Z`) keys, and a stray directory in `data/`. Both
//! failed before the fixes (issue 18's review): the first with a check
//! error on a healthy store, the second with a committed backup's
//! container deleted.

mod common;

use std::path::Path;

use common::*;
use revault_engine::{
    check, expire, gc,
    keys::{CF_MARKS, MARKS_KEPT_KEY},
    DedupUnit, ExpireSel, GcOptions, InitOptions, OpenMode, Store,
};

fn init(dir: &Path) {
    Store::init(
        dir,
        &InitOptions {
            config: small_config(),
            data_dir: None,
        },
    )
    .unwrap();
}

fn open(dir: &Path) -> Store {
    Store::open(dir, OpenMode::ReadWrite, "review").unwrap()
}

/// A store written by the previous release (4212f98) holds no `F` keys:
/// a container freed by a commit whose unlink a crash cut off (or whose
/// unlink waited for a restore when the server stopped) is, for that
/// release, a harmless orphan that check warns about and gc deletes. After
/// the upgrade it must not turn into a quarantined file and a check error
/// on a healthy store. (Simulated: the crash is a failpoint, and the `F`
/// keys the new commit wrote are removed, as the old release never wrote
/// them.)
#[test]
fn a_freed_container_left_by_the_previous_release_is_no_alarm_after_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path());
    let v2 = random(1 << 20, 2);
    {
        let st = open(dir.path());
        backup_bytes(&st, "team/a", &random(1 << 20, 1), DedupUnit::Chunk);
        backup_bytes(&st, "team/a", &v2, DedupUnit::Chunk);
        st.arm_failpoint("commit.before_unlink");
        assert!(expire(&st, "team/a", &ExpireSel::Version(1)).is_err());
    }
    {
        let st = open(dir.path());
        let keys = st.meta().scan_prefix(CF_MARKS, b"F").unwrap();
        assert!(!keys.is_empty(), "the expiry freed no container");
        let mut b = st.meta().batch();
        for (k, _) in keys {
            b.delete(CF_MARKS, &k);
        }
        // Nor did it say it kept them.
        b.delete("default", MARKS_KEPT_KEY);
        st.meta().write(b, true).unwrap();
    }
    let st = open(dir.path());
    let c = check(&st).unwrap();
    assert!(
        c.ok,
        "check fails on a healthy store upgraded from 4212f98: {:?}",
        c.errors
    );
    let g = gc(&st, &GcOptions::default()).unwrap();
    assert_eq!(
        g.orphans.quarantined_files, 0,
        "gc quarantined the previous release's freed containers: {g:?}"
    );
    assert!(check(&st).unwrap().ok);
    assert_eq!(restore_bytes(&st, "team/a", 2).0, v2);
}

/// A store from a build that kept `F`/`Z` keys but not yet the key saying
/// so: its unexplained container files are what they are on any store that
/// keeps them, possibly the only copy of data whose metadata lost a commit.
/// Its first open must adopt none of them as freed, so gc quarantines them
/// instead of deleting them.
#[test]
fn a_store_that_keeps_freed_keys_adopts_no_unexplained_file() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path());
    let v2 = random(1 << 20, 4);
    {
        let st = open(dir.path());
        backup_bytes(&st, "team/a", &random(1 << 20, 3), DedupUnit::Chunk);
        backup_bytes(&st, "team/a", &v2, DedupUnit::Chunk);
        st.arm_failpoint("commit.before_unlink");
        assert!(expire(&st, "team/a", &ExpireSel::Version(1)).is_err());
    }
    let (meta, saved) = (dir.path().join("meta"), dir.path().join("meta.saved"));
    {
        let st = open(dir.path());
        assert!(!st.meta().scan_prefix(CF_MARKS, b"F").unwrap().is_empty());
        let mut b = st.meta().batch();
        b.delete("default", MARKS_KEPT_KEY);
        st.meta().write(b, true).unwrap();
    }
    copy_dir(&meta, &saved);
    // A backup whose commit the metadata then loses (an older meta/ put
    // back): its container files are named by nothing.
    backup_bytes(
        &open(dir.path()),
        "team/b",
        &random(2 << 20, 5),
        DedupUnit::Chunk,
    );
    std::fs::remove_dir_all(&meta).unwrap();
    std::fs::rename(&saved, &meta).unwrap();

    let st = open(dir.path());
    let g = gc(&st, &GcOptions::default()).unwrap();
    assert!(
        g.orphans.quarantined_files > 0,
        "the lost backup's files were adopted as freed and deleted: {g:?}"
    );
    assert_eq!(restore_bytes(&st, "team/a", 2).0, v2);
}

/// A read-write open takes any hex-named entry of the data directory for a
/// session and never hands out a lower id (`highest_session_on_disk`). A
/// stray directory whose name is 2^40 or more pushes the next session id
/// past what a container id holds (`session << 24`): the session's
/// containers land in the directory of an older session (`00000001/`),
/// while the session itself syncs, aborts and recovers a directory that
/// does not exist, and gc's orphan pass, seeing files of a session that is
/// not in flight, quarantines them under the backup.
#[test]
fn a_stray_hex_directory_does_not_move_new_containers_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path());
    let data = dir.path().join("data");
    {
        let st = open(dir.path());
        backup_bytes(&st, "team/a", &random(1 << 20, 1), DedupUnit::Chunk);
        // Session 1's containers are freed: its directory goes away.
        backup_bytes(&st, "team/a", &random(1 << 20, 2), DedupUnit::Chunk);
        expire(&st, "team/a", &ExpireSel::Version(1)).unwrap();
    }
    std::fs::create_dir(data.join("10000000000")).unwrap();
    let st = open(dir.path());
    let v3 = random(1 << 20, 3);
    let ran = at(&st, "backup.before_commit", |st| {
        gc(st, &GcOptions::default()).unwrap();
    });
    backup_bytes(&st, "team/a", &v3, DedupUnit::Chunk);
    reached(&ran, "backup.before_commit");
    let c = check(&st).unwrap();
    assert!(c.ok, "{:?}", c.errors);
    assert_eq!(restore_bytes(&st, "team/a", 3).0, v3);
}
