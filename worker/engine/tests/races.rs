//! Races between gc, expiry, slides, backups and restores, replayed
//! deterministically: a pause point stops the engine inside one operation
//! (after gc's mark phase, before it dooms units, inside its orphan removal,
//! at the start of a commit, ...) and runs the other operation right there,
//! so each known race window is exercised on every run, not by luck. After
//! each one: every acknowledged version restores byte-exact and `check` is
//! clean.

mod common;

use std::sync::{mpsc, Arc, Mutex};

use common::*;
use revault_engine::{
    backup, check, expire, gc, restore, slide, BackupOptions, DedupUnit, ExpireSel, GcOptions,
    OpenMode, RestoreTarget, Store, StreamSource, VersionSel,
};

fn assert_clean(st: &Store, what: &str) {
    let c = check(st).unwrap();
    assert!(c.ok, "{what}: check: {:?}", c.errors);
}

fn compact_all() -> GcOptions {
    GcOptions {
        compact_below: 1.0,
        full: true,
    }
}

/// Two series back up the same base, then change it in the same places
/// differently, and both slide: the base's segments are then referenced by
/// two archival versions only, each needing a few of their chunks. A gc
/// trims those segments (RevDedup's leftovers inside shared units). Returns
/// the base.
fn shared_leftovers(st: &Store) -> Vec<u8> {
    let base = random(2 << 20, 4);
    let mut a = base.clone();
    let mut c = base.clone();
    for j in 0..20 {
        let at = j * 100_000 + 500;
        a.splice(at..at + 50, random(64, 100 + j as u64));
        c.splice(at..at + 50, random(64, 200 + j as u64));
    }
    for (series, v2) in [("team-a/db", &a), ("team-c/db", &c)] {
        backup_bytes(st, series, &base, DedupUnit::Segment);
        backup_bytes(st, series, v2, DedupUnit::Segment);
    }
    slide(st, "team-a/db").unwrap();
    slide(st, "team-c/db").unwrap();
    base
}

/// Defect 1 of issue 18: a full gc over partly dead units, and a backup into
/// another series that deduplicates against those units and commits while
/// the gc runs. The gc must not trim what the new version references.
#[test]
fn gc_never_trims_a_unit_a_backup_committed_during_the_gc_references() {
    // Before gc dooms the units it trims, team-b deduplicates against them; once they are
    // doomed (before the sweep commit) it may not, and stores its own copy.
    for point in [
        "gc.after_mark",
        "gc.before_doom",
        "commit.enter",
        "gc.before_sweep_commit",
    ] {
        let (_d, st) = new_store(small_config());
        let base = shared_leftovers(&st);
        let copy = base.clone();
        let doomed = point == "gc.before_sweep_commit";
        let ran = at(&st, point, move |st| {
            let rep = backup_bytes(st, "team-b/db", &copy, DedupUnit::Segment);
            let deduped = rep.new_vbytes < copy.len() as u64 / 10;
            assert_eq!(
                deduped, !doomed,
                "team-b deduplicated against the shared segments: {deduped}: {rep:?}"
            );
        });
        let g = gc(&st, &compact_all()).unwrap();
        reached(&ran, point);
        assert_eq!(
            restore_bytes(&st, "team-b/db", 1).0,
            base,
            "{point}: team-b's version, committed during gc ({g:?})"
        );
        assert_clean(&st, point);
        // Later gcs still reclaim what is dead, and keep what is live.
        gc(&st, &compact_all()).unwrap();
        assert_eq!(restore_bytes(&st, "team-b/db", 1).0, base, "{point}");
        assert_clean(&st, point);
    }
}

/// Issue 18, found by the stress test: a segment L links chunks to an
/// earlier segment T of the same backup. Versions that slid away need
/// neither the linked chunks of T nor the linking ones of L, so gc's marks
/// cover neither. A backup in flight has deduplicated against L (not T),
/// which keeps L whole; gc must then keep T's linked chunks too, or the new
/// version, referencing L whole, cannot be restored. A unit another links
/// into is trimmed only once the links are gone.
#[test]
fn gc_keeps_the_chunks_a_unit_kept_whole_links_to() {
    let (_d, st) = new_store(small_config());
    let (t, gap) = (1_000_000, 40_000);
    let mut base = random(2 << 20, 4);
    with_near_repeat(&mut base, t, gap, 5);
    // Both series change T and L next to the repeated piece, not inside it,
    // and slide: T and L are then needed by two archival versions, each
    // needing only their changed chunks.
    for (i, series) in ["team-a/db", "team-c/db"].into_iter().enumerate() {
        let mut v2 = base.clone();
        for at in [t + 3500, t + gap + 3500] {
            v2[at..at + 64].copy_from_slice(&random(64, 10 + i as u64 * 7 + at as u64));
        }
        backup_bytes(&st, series, &base, DedupUnit::Segment);
        backup_bytes(&st, series, &v2, DedupUnit::Segment);
    }
    slide(&st, "team-a/db").unwrap();
    slide(&st, "team-c/db").unwrap();
    assert_clean(&st, "after the slides");

    // A new series holds L's segment, not T's: the first copy is replaced.
    let mut b = base.clone();
    b[t - 2000..t + 5000].copy_from_slice(&random(7000, 6));
    let ran = at(&st, "backup.before_commit", |st| {
        let g = gc(st, &compact_all()).unwrap();
        assert_eq!(
            g.units_trimmed, 0,
            "T (linked into) and L (pinned) stay whole: {g:?}"
        );
    });
    let rep = backup_bytes(&st, "team-b/db", &b, DedupUnit::Segment);
    reached(&ran, "backup.before_commit");
    assert!(
        rep.new_vbytes < b.len() as u64 / 10,
        "team-b did not dedup against the base: {rep:?}"
    );
    assert_eq!(restore_bytes(&st, "team-b/db", 1).0, b, "team-b's version");
    assert_clean(&st, "after gc and the backup");

    // Without team-b, a full gc trims L, which drops its links; only then
    // can T be trimmed, and an incremental gc (what the scheduler runs)
    // does it: the commit that dropped the last link flagged T's container.
    // Everything still restores, checks clean.
    expire(&st, "team-b/db", &ExpireSel::Version(1)).unwrap();
    let incremental = GcOptions {
        full: false,
        ..compact_all()
    };
    let trimmed: Vec<u64> = [compact_all(), incremental.clone(), incremental]
        .iter()
        .map(|opts| {
            let g = gc(&st, opts).unwrap();
            assert_clean(&st, "after team-b expired");
            g.units_trimmed
        })
        .collect();
    assert_eq!(trimmed, [1, 1, 0], "units trimmed by each gc (L, then T)");
    for series in ["team-a/db", "team-c/db"] {
        assert_eq!(restore_bytes(&st, series, 1).0, base, "{series} v1");
    }
}

/// A restore of a version whose client stops at its first write until
/// released: the restore has planned its reads from its snapshot and is
/// stuck sending, holding every container file it will read.
struct StalledRestore {
    go: mpsc::Sender<()>,
    out: Arc<Mutex<Vec<u8>>>,
    thread: std::thread::JoinHandle<revault_engine::Result<revault_engine::RestoreReport>>,
}

struct StallingWriter {
    out: Arc<Mutex<Vec<u8>>>,
    started: Option<mpsc::Sender<()>>,
    go: Option<mpsc::Receiver<()>>,
}

impl std::io::Write for StallingWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(s) = self.started.take() {
            s.send(()).unwrap();
            self.go.take().unwrap().recv().unwrap();
        }
        self.out.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl StalledRestore {
    /// Starts restoring `series` version `v`; returns once it is stuck.
    fn start(st: &Arc<Store>, series: &str, v: u32) -> StalledRestore {
        let (started_tx, started) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let mut w = StallingWriter {
            out: out.clone(),
            started: Some(started_tx),
            go: Some(go_rx),
        };
        let (st, series) = (st.clone(), series.to_string());
        let thread = std::thread::spawn(move || {
            restore(
                &st,
                &series,
                VersionSel::Number(v),
                &small_restore(),
                RestoreTarget::Writer(&mut w),
            )
        });
        started.recv().unwrap();
        StalledRestore { go, out, thread }
    }

    /// Lets the client read on; returns how the restore ended and its bytes.
    fn finish(
        self,
    ) -> (
        revault_engine::Result<revault_engine::RestoreReport>,
        Vec<u8>,
    ) {
        self.go.send(()).unwrap();
        let r = self.thread.join().unwrap();
        let out = std::mem::take(&mut *self.out.lock().unwrap());
        (r, out)
    }
}

/// A slow client restores version 2 of a half-shared series while the `expired` versions
/// expire and gc compacts twice; the restore must finish byte-exact. Then gc runs once more and
/// the store checks clean. Returns the store, for what the caller expects left on disk, and the
/// first gc's report.
fn restore_across_expiry_and_gc(
    unit: DedupUnit,
    seed: u64,
    expired: &[u32],
) -> (tempfile::TempDir, Arc<Store>, revault_engine::GcReport) {
    let (d, st) = new_store(small_config());
    let st = Arc::new(st);
    let (_, v2) = half_shared_versions(&st, "team/a", unit, seed);
    let restoring = StalledRestore::start(&st, "team/a", 2);
    for &v in expired {
        expire(&st, "team/a", &ExpireSel::Version(v)).unwrap();
    }
    let g1 = gc(&st, &compact_all()).unwrap();
    gc(&st, &compact_all()).unwrap();
    let (r, out) = restoring.finish();
    assert!(r.is_ok(), "{unit}: the restore was cut off: {r:?}");
    assert!(out == v2, "{unit}: restored bytes differ");
    // Once the restore is over, nothing it held is left behind.
    gc(&st, &compact_all()).unwrap();
    assert_clean(&st, &format!("{unit}"));
    (d, st, g1)
}

/// Defect 2 of issue 18: a slow client restores version 2 while version 1
/// expires and gc runs twice. The first gc compacts the containers version 2
/// shares with version 1 (their files' unlink waits for the restore); the
/// second's orphan removal must not delete them under the restore.
#[test]
fn gc_keeps_container_files_a_running_restore_still_reads() {
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let (_d, st, g1) = restore_across_expiry_and_gc(unit, 21, &[1]);
        assert!(g1.containers_compacted > 0, "{unit}: {g1:?}");
        let t = st.totals().unwrap();
        assert_eq!(
            files_in(st.data_dir()),
            t.containers,
            "{unit}: container files on disk vs. records"
        );
    }
}

/// A move deletes the versions it moved from the old worker while a restore from there may still
/// be streaming one of them (a RestoreJob started before the switch). The restore's own version
/// is expired, every other version too, and gc runs twice: the restore finishes byte-exact, and
/// nothing it held is left behind afterwards.
#[test]
fn a_restore_finishes_byte_exact_while_its_own_version_is_expired_and_collected() {
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let (_d, st, _) = restore_across_expiry_and_gc(unit, 23, &[1, 2]);
        let t = st.totals().unwrap();
        assert_eq!(
            t.containers, 0,
            "{unit}: nothing is left once the restore is over: {t:?}"
        );
        assert_eq!(
            files_in(st.data_dir()),
            0,
            "{unit}: container files left on disk"
        );
    }
}

/// A restore that ends hands the files whose unlink waited for it to its
/// own thread, which unlinks them without the commit lock. A gc may look at
/// the data directory in between: the files are then freed, held by no
/// reader, and still there, and they vanish before gc removes them. Gone is
/// what gc wanted; it must not fail (it answered 500 under load in
/// worker/revault/tests/stress.rs).
#[test]
fn gc_orphan_removal_lets_a_finished_restore_unlink_its_files_meanwhile() {
    let (_d, st) = new_store(small_config());
    let st = Arc::new(st);
    let (_, v2) = half_shared_versions(&st, "team/a", DedupUnit::Chunk, 31);

    let restoring = StalledRestore::start(&st, "team/a", 2);
    // Files freed while the restore reads: their unlink waits for it.
    expire(&st, "team/a", &ExpireSel::Version(1)).unwrap();
    let g = gc(&st, &compact_all()).unwrap();
    assert!(g.containers_compacted > 0, "{g:?}");
    assert!(
        files_in(st.data_dir()) > st.totals().unwrap().containers,
        "freed container files wait for the restore"
    );

    // When the restore ends and has let go of those files, a gc surveys the
    // data directory; it removes what it found only once the restore's
    // thread has unlinked them. The gc waits on its own thread for the
    // restore to reach that point.
    let (start_tx, start) = mpsc::channel::<()>();
    let (surveyed_tx, surveyed) = mpsc::channel::<()>();
    let (gc_go, gc_go_rx) = mpsc::channel::<()>();
    let surveying = at(&st, "gc.orphans.surveyed", move |_| {
        surveyed_tx.send(()).unwrap();
        gc_go_rx.recv().unwrap();
    });
    let st3 = st.clone();
    let collecting = std::thread::spawn(move || {
        start.recv().unwrap();
        gc(&st3, &GcOptions::default())
    });
    let unlinking = at(&st, "read.end.unlink", move |_| {
        start_tx.send(()).unwrap();
        surveyed.recv().unwrap();
    });
    let (r, out) = restoring.finish();
    assert!(r.is_ok(), "the restore was cut off: {r:?}");
    assert!(out == v2, "restored bytes differ");
    reached(&unlinking, "read.end.unlink");
    gc_go.send(()).unwrap();
    let g = collecting.join().unwrap();
    reached(&surveying, "gc.orphans.surveyed");
    assert!(
        g.is_ok(),
        "gc failed on files a restore unlinked meanwhile: {g:?}"
    );

    gc(&st, &compact_all()).unwrap();
    assert_clean(&st, "after the gcs");
    assert_eq!(restore_bytes(&st, "team/a", 2).0, v2);
    let t = st.totals().unwrap();
    assert_eq!(
        files_in(st.data_dir()),
        t.containers,
        "container files on disk vs. records"
    );
}

/// gc's orphan removal against a backup that commits while gc looks at the
/// data directory: the backup's containers are not orphans.
#[test]
fn gc_orphan_removal_keeps_the_containers_of_a_backup_committing_meanwhile() {
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "team/a", &random(1 << 20, 1), DedupUnit::Chunk);
    let data = random(3 << 20, 2);
    let copy = data.clone();
    let ran = at(&st, "gc.orphans.scanned", move |st| {
        backup_bytes(st, "team/b", &copy, DedupUnit::Chunk);
    });
    gc(&st, &GcOptions::default()).unwrap();
    reached(&ran, "gc.orphans.scanned");
    assert_eq!(restore_bytes(&st, "team/b", 1).0, data);
    assert_clean(&st, "after gc");
}

/// The same, with a backup that has written and synced its containers but
/// not committed when gc lists the data directory, and commits after gc
/// is done: its session started after gc read the metadata.
#[test]
fn gc_orphan_removal_keeps_the_containers_of_a_backup_in_flight() {
    let (_d, st) = new_store(small_config());
    let st = Arc::new(st);
    backup_bytes(&st, "team/a", &random(1 << 20, 1), DedupUnit::Chunk);
    let data = random(3 << 20, 3);
    let (ready_tx, ready) = mpsc::channel::<()>();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    st.on_pause_point(
        "backup.before_commit",
        Box::new(move |_| {
            ready_tx.send(()).unwrap();
            go_rx.lock().unwrap().recv().unwrap();
        }),
    );
    let handle: Arc<Mutex<Option<std::thread::JoinHandle<_>>>> = Arc::default();
    let (st2, h2, copy) = (st.clone(), handle.clone(), data.clone());
    let ran = at(&st, "gc.orphans.scanned", move |_| {
        let st3 = st2.clone();
        *h2.lock().unwrap() = Some(std::thread::spawn(move || {
            let src = StreamSource::new("test input", std::io::Cursor::new(copy));
            let opts = BackupOptions {
                unit: Some(DedupUnit::Chunk),
                ..Default::default()
            };
            backup(&st3, "team/b", Box::new(src), &opts)
        }));
        ready.recv().unwrap();
    });
    gc(&st, &GcOptions::default()).unwrap();
    reached(&ran, "gc.orphans.scanned");
    go.send(()).unwrap();
    let h = handle.lock().unwrap().take().unwrap();
    h.join().unwrap().unwrap();
    assert_eq!(restore_bytes(&st, "team/b", 1).0, data);
    assert_clean(&st, "after the backup");
}

/// A unit whose references reach zero while a backup has it pinned becomes
/// a zombie that a later gc frees. The zombie must survive a restart: after
/// the backup is abandoned and the store reopened, gc still frees it.
#[test]
fn units_freed_while_pinned_are_collected_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    Store::init(
        dir.path(),
        &revault_engine::InitOptions {
            config: small_config(),
            data_dir: None,
        },
    )
    .unwrap();
    {
        let st = Arc::new(Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap());
        let shared = random(4 << 20, 5);
        backup_bytes(&st, "team/b", &shared, DedupUnit::Chunk);
        // team/a's backup dedups against team/b's data; just before its
        // commit, team/b's only version expires (the units are pinned by
        // the backup, so they are not freed), and then the process dies
        // before the backup commits.
        let ran = at(&st, "backup.before_commit", move |st| {
            expire(st, "team/b", &ExpireSel::Version(1)).unwrap();
            st.arm_failpoint("commit.before_write");
        });
        let opts = BackupOptions {
            unit: Some(DedupUnit::Chunk),
            ..Default::default()
        };
        let src = StreamSource::new("test input", std::io::Cursor::new(shared));
        let r = backup(&st, "team/a", Box::new(src), &opts);
        reached(&ran, "backup.before_commit");
        assert!(r.is_err(), "the backup was to crash: {r:?}");
        let t = st.totals().unwrap();
        assert!(t.units > 0, "the pinned units were freed at once: {t:?}");
    }
    let st = Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    let t = st.totals().unwrap();
    assert_eq!(
        (t.units, t.containers, t.unit_vbytes),
        (0, 0, 0),
        "nothing references them any more: {t:?}"
    );
    assert_eq!(files_in(st.data_dir()), 0);
    assert_clean(&st, "after gc");
}

/// If the metadata loses its latest writes (a deleted RocksDB log, a
/// restored old copy), the containers of the lost commits look like orphans.
/// They are the only copy of acknowledged data: gc must not delete them, and
/// check must not call the store healthy.
#[test]
fn containers_no_record_names_are_kept_when_the_metadata_may_be_behind() {
    for how in ["old copy of meta/", "deleted log"] {
        let dir = tempfile::tempdir().unwrap();
        Store::init(
            dir.path(),
            &revault_engine::InitOptions {
                config: small_config(),
                data_dir: None,
            },
        )
        .unwrap();
        let open = || Store::open(dir.path(), OpenMode::ReadWrite, "t").unwrap();
        let v1 = random(1 << 20, 7);
        let v2 = random(2 << 20, 8);
        {
            let st = open();
            backup_bytes(&st, "team/a", &v1, DedupUnit::Chunk);
        }
        // A read-write open writes what the log holds to tables; after it,
        // the log holds only the next command's writes.
        drop(open());
        let meta = dir.path().join("meta");
        let saved = dir.path().join("meta.saved");
        copy_dir(&meta, &saved);
        {
            let st = open();
            backup_bytes(&st, "team/a", &v2, DedupUnit::Chunk);
        }
        let lost_files = files_in(&dir.path().join("data"));
        if how == "deleted log" {
            for f in std::fs::read_dir(&meta).unwrap().flatten() {
                if f.path().extension().is_some_and(|e| e == "log") {
                    std::fs::remove_file(f.path()).unwrap();
                }
            }
        } else {
            std::fs::remove_dir_all(&meta).unwrap();
            std::fs::rename(&saved, &meta).unwrap();
        }

        if how == "deleted log" {
            // RocksDB notices the missing log: the store does not open, and
            // nothing is deleted.
            let e = Store::open(dir.path(), OpenMode::ReadWrite, "t")
                .err()
                .unwrap();
            assert_eq!(e.code(), "corrupt_metadata", "{e}");
            assert!(e.to_string().contains("log files are missing"), "{e}");
            assert_eq!(files_in(&dir.path().join("data")), lost_files);
            continue;
        }
        let st = open();
        let listed = st.versions(&st.series("team/a").unwrap()).unwrap().len();
        assert_eq!(listed, 1, "{how}: the second backup's commit is to be lost");
        let c = check(&st).unwrap();
        assert!(
            !c.ok,
            "{how}: check calls a store whose metadata lost a commit healthy: {c:?}"
        );
        assert!(
            c.errors.iter().any(|e| e.contains("no record names")),
            "{how}: {:?}",
            c.errors
        );
        gc(&st, &GcOptions::default()).unwrap();
        assert_eq!(
            files_in(&dir.path().join("data")),
            lost_files,
            "{how}: gc deleted container files of a commit the metadata lost"
        );
        let c = check(&st).unwrap();
        assert!(
            c.errors.iter().any(|e| e.contains("quarantine")),
            "{how}: {:?}",
            c.errors
        );
        // New backups do not collide with the lost session's files.
        backup_bytes(&st, "team/a", &random(1 << 20, 9), DedupUnit::Chunk);
        assert_eq!(restore_bytes(&st, "team/a", 1).0, v1, "{how}");
        assert!(files_in(&dir.path().join("data")) > lost_files, "{how}");
    }
}

/// A thread of the backup pipeline that panics is an internal failure (a
/// 5xx for the server), not the caller's mistake, and leaves no version.
#[test]
fn a_panicking_source_is_an_internal_error() {
    struct Panics;
    impl revault_engine::Source for Panics {
        fn next_piece(&mut self) -> revault_engine::Result<bool> {
            Ok(true)
        }
        fn read(&mut self, _: &mut [u8]) -> revault_engine::Result<usize> {
            panic!("a source that fails in a way nobody expected")
        }
        fn finish(
            self: Box<Self>,
        ) -> revault_engine::Result<Option<Vec<revault_engine::catalog::Entry>>> {
            Ok(None)
        }
    }
    let (_d, st) = new_store(small_config());
    let e = backup(&st, "team/a", Box::new(Panics), &BackupOptions::default()).unwrap_err();
    assert_eq!(e.code(), "internal", "{e}");
    assert!(!e.is_user_error(), "{e}");
    assert!(
        st.series("team/a").is_err()
            || st
                .versions(&st.series("team/a").unwrap())
                .unwrap()
                .is_empty()
    );
}
