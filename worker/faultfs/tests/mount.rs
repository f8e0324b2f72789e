//! The filesystem mounted for real: the system calls a store makes reach the
//! log, and a cut keeps exactly what was synced.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use faultfs::{Mount, OpKind};

/// Mounts on a new temporary directory, or says loudly why it cannot.
fn mount() -> Option<(tempfile::TempDir, Mount)> {
    if let Some(why) = faultfs::unavailable() {
        eprintln!("SKIPPED: faultfs cannot mount here: {why}");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = Mount::new(dir.path()).expect("mount faultfs (root, or fusermount3 installed)");
    Some((dir, m))
}

fn sync_dir(p: &Path) {
    File::open(p).unwrap().sync_all().unwrap();
}

fn read_at(recording: &faultfs::Recording, pos: usize, rel: &str) -> Option<Vec<u8>> {
    let d = tempfile::tempdir().unwrap();
    recording.materialise(pos, d.path()).unwrap();
    std::fs::read(d.path().join(rel)).ok()
}

#[test]
fn a_cut_keeps_what_was_synced_and_nothing_else() {
    let Some((_tmp, m)) = mount() else { return };
    let root = m.dir().to_path_buf();
    let d = root.join("d");
    std::fs::create_dir(&d).unwrap();
    sync_dir(&root);

    // A file synced, in a directory not yet synced: lost.
    let mut f = File::create(d.join("a")).unwrap();
    f.write_all(b"first").unwrap();
    f.sync_data().unwrap();
    let file_synced = m.position();
    sync_dir(&d);
    let dir_synced = m.position();
    f.write_all(b" second").unwrap();
    let unsynced_write = m.position();
    f.sync_all().unwrap();
    let second_synced = m.position();

    // A marker replaced by rename, then unlinked.
    std::fs::write(d.join("m.new"), b"new").unwrap();
    File::open(d.join("m.new")).unwrap().sync_all().unwrap();
    std::fs::rename(d.join("m.new"), d.join("a")).unwrap();
    let renamed = m.position();
    sync_dir(&d);
    let rename_synced = m.position();

    // fallocate as RocksDB does it (keep size), a truncation, and flock.
    let g = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(d.join("g"))
        .unwrap();
    // SAFETY: a valid open descriptor.
    let r = unsafe { libc::fallocate(g.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(g.metadata().unwrap().len(), 0);
    g.set_len(10).unwrap();
    g.try_lock().unwrap();
    assert!(File::open(d.join("g")).unwrap().try_lock().is_err());
    g.sync_all().unwrap();
    sync_dir(&d);
    let end = m.position();

    // O_DSYNC: each write is durable when it returns; chmod is logged.
    let mut h = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(d.join("g"))
        .unwrap();
    h.write_all(b"dsync").unwrap();
    let dsync_written = m.position();
    std::fs::set_permissions(d.join("g"), std::fs::Permissions::from_mode(0o600)).unwrap();
    drop((f, g, h));

    let rec = m.unmount().unwrap();
    let kinds: Vec<_> = rec.ops().iter().map(|o| o.to_string()).collect();
    assert!(
        rec.ops().iter().any(|o| matches!(o.kind, OpKind::Fallocate { mode, .. } if mode == libc::FALLOC_FL_KEEP_SIZE)),
        "{kinds:#?}"
    );
    assert!(rec.ops()[renamed - 1]
        .to_string()
        .contains("rename d/m.new -> d/a"));

    assert_eq!(
        read_at(&rec, file_synced, "d/a"),
        None,
        "its directory was not synced"
    );
    assert_eq!(read_at(&rec, dir_synced, "d/a").unwrap(), b"first");
    assert_eq!(read_at(&rec, unsynced_write, "d/a").unwrap(), b"first");
    assert_eq!(
        read_at(&rec, second_synced, "d/a").unwrap(),
        b"first second"
    );
    assert_eq!(read_at(&rec, renamed, "d/a").unwrap(), b"first second");
    assert_eq!(read_at(&rec, renamed, "d/m.new"), None);
    assert_eq!(read_at(&rec, rename_synced, "d/a").unwrap(), b"new");
    assert_eq!(read_at(&rec, end, "d/g").unwrap(), vec![0; 10]);
    assert_eq!(
        read_at(&rec, dsync_written, "d/g").unwrap(),
        b"dsync\0\0\0\0\0"
    );
    assert_eq!(rec.ops().last().unwrap().to_string(), "chmod d/g 600");
}
