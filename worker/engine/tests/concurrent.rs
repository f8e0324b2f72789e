//! A backup that dedups against data which another series deletes while the
//! backup runs. A backup pins every copy it may reference before it trusts it;
//! an expiry and a gc running meanwhile must leave those copies alone, and
//! the backup must never reference one they freed. And a backup that commits
//! in the middle of a slide (forced with a pause point) keeps what it uses.

mod common;

use std::io::{Cursor, Read};
use std::sync::Arc;

use common::*;
use revault_engine::{
    backup, catalog, check, expire, gc, BackupOptions, BackupReport, DedupUnit, ExpireSel,
    GcOptions, Source, Store,
};

/// Streams `data` and, once `at` bytes have been read, runs `during` once
/// (on the backup's reading thread, while earlier parts are being deduped).
struct Interrupting {
    data: Cursor<Vec<u8>>,
    at: u64,
    during: Option<Box<dyn FnOnce() + Send>>,
}

impl Source for Interrupting {
    fn next_piece(&mut self) -> revault_engine::Result<bool> {
        Ok(self.data.position() == 0)
    }

    fn read(&mut self, buf: &mut [u8]) -> revault_engine::Result<usize> {
        if self.data.position() >= self.at {
            if let Some(f) = self.during.take() {
                f();
            }
        }
        Ok(self.data.read(buf).unwrap())
    }

    fn finish(self: Box<Self>) -> revault_engine::Result<Option<Vec<catalog::Entry>>> {
        Ok(None)
    }
}

/// Backs `data` up as the next version of `series`, running `during` once
/// `at` bytes have been read; returns the backup's report and what `during`
/// returned.
fn backup_interrupted<T: Send + 'static>(
    st: &Arc<Store>,
    series: &str,
    unit: DedupUnit,
    data: &[u8],
    at: u64,
    during: impl FnOnce(&Store) -> T + Send + 'static,
) -> (BackupReport, T) {
    let st2 = Arc::clone(st);
    let out = Arc::new(std::sync::Mutex::new(None));
    let out2 = Arc::clone(&out);
    let src = Interrupting {
        data: Cursor::new(data.to_vec()),
        at,
        during: Some(Box::new(move || {
            *out2.lock().unwrap() = Some(during(&st2));
        })),
    };
    let opts = BackupOptions {
        unit: Some(unit),
        ..Default::default()
    };
    let rep = backup(st, series, Box::new(src), &opts).unwrap();
    let ran = out.lock().unwrap().take().expect("the interruption ran");
    (rep, ran)
}

/// Series b's only version is expired (and, with `collect`, gc run) once
/// a's backup has read `at` bytes of the data it shares with b.
/// With `sampled`, the backup looks up in a sampled index (whose hints the race leaves
/// stale) instead of the exact one.
fn backup_while_the_shared_series_is_deleted(
    unit: DedupUnit,
    at: u64,
    collect: bool,
    sampled: bool,
) -> bool {
    let (_d, st) = if sampled {
        new_sampled_store(small_config(), 16 << 10)
    } else {
        new_store(small_config())
    };
    let st = Arc::new(st);
    // Series b holds 8 MiB that a's backup repeats, then adds 1 MiB of its own.
    let shared = random(8 << 20, 11);
    backup_bytes(&st, "team/b", &shared, unit);
    let mut mine = shared.clone();
    mine.extend(random(1 << 20, 12));

    let (rep, e) = backup_interrupted(&st, "team/a", unit, &mine, at, move |st| {
        if sampled && at >= 6 << 20 {
            wait_for_a_sample_hit(st);
        }
        let e = expire(st, "team/b", &ExpireSel::Version(1)).unwrap();
        if collect {
            gc(st, &GcOptions::default()).unwrap();
        }
        e
    });
    assert_eq!(e.expired, vec![1]);
    let b_left = st.series("team/b").map(|b| st.versions(&b).unwrap().len());
    assert!(matches!(b_left, Ok(0) | Err(_)), "b's version is gone");
    // Whatever the backup had pinned stayed; everything else it stored again.
    assert!(rep.new_vbytes >= 1 << 20, "{rep:?}");
    let c = check(&st).unwrap();
    assert!(c.ok, "check after the race: {:?}", c.errors);
    assert!(
        restore_bytes(&st, "team/a", 1).0 == mine,
        "a restores byte-exact"
    );

    // Once the backup is done its pins are gone: a later gc keeps only what a
    // references, and a still restores.
    gc(&st, &GcOptions::default()).unwrap();
    let c = check(&st).unwrap();
    assert!(c.ok, "check after gc: {:?}", c.errors);
    assert!(restore_bytes(&st, "team/a", 1).0 == mine);
    let t = st.totals().unwrap();
    assert!(
        t.unit_vbytes <= mine.len() as u64 + (mine.len() as u64 / 8),
        "no copy of b's data left beside a's: {t:?}"
    );
    // Whether the sampled index led the backup to b's copies before they went.
    st.sampled_index_stats()
        .is_some_and(|ix| ix.sample_hits + ix.cache_hits > 0)
}

/// Holds the reading thread until the backup's lookups (on another thread, behind the
/// reader by as much as the pipeline's channels hold) have hit the sampled index, so the
/// late cut deletes b only once the backup has been led to b's copies. On a loaded machine
/// the reader may be several MiB ahead of the first lookup; without this the cut can come
/// before any lookup and the test proves nothing about stale hints. Bounded, so a backup
/// that never hits fails the caller's assertion instead of hanging.
fn wait_for_a_sample_hit(st: &Store) {
    let hit = |st: &Store| {
        st.sampled_index_stats()
            .is_some_and(|ix| ix.sample_hits + ix.cache_hits > 0)
    };
    for _ in 0..3000 {
        if hit(st) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

// The interleavings differ from run to run; each case checks what must hold
// for all of them, at a few points of the backup.
#[test]
fn chunk_mode_backup_survives_expiry_and_gc_of_the_series_it_dedups_against() {
    for (at, collect) in [(1 << 20, true), (4 << 20, false), (6 << 20, true)] {
        let _ = backup_while_the_shared_series_is_deleted(DedupUnit::Chunk, at, collect, false);
    }
}

#[test]
fn segment_mode_backup_survives_expiry_and_gc_of_the_series_it_dedups_against() {
    for (at, collect) in [(1 << 20, true), (4 << 20, false), (6 << 20, true)] {
        let _ = backup_while_the_shared_series_is_deleted(DedupUnit::Segment, at, collect, false);
    }
}

#[test]
fn a_backup_through_the_sampled_index_survives_expiry_and_gc_of_the_series_it_dedups_against() {
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let mut found = false;
        for (at, collect) in [(1 << 20, true), (4 << 20, false), (6 << 20, true)] {
            found |= backup_while_the_shared_series_is_deleted(unit, at, collect, true);
        }
        // An early cut may come before the backup's first lookup; the last waits for one.
        assert!(
            found,
            "{unit}: no backup found b's data through the sampled index"
        );
    }
}

/// A backup references the units of its series' previous version that it
/// predicts (chunk mode: without looking them up; the loading thread pins
/// them as it reads them). A gc that compacts their containers while the
/// backup runs moves those units; every version must still restore.
#[test]
fn backup_survives_gc_compacting_the_previous_versions_containers() {
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        for at in [256 << 10, 3 << 20, 7 << 20] {
            let (_d, st) = new_store(small_config());
            let st = Arc::new(st);
            let (_, v2) = half_shared_versions(&st, "team/a", unit, 21);
            expire(&st, "team/a", &ExpireSel::Version(1)).unwrap();
            let mut v3 = v2.clone();
            v3.extend(random(1 << 20, 13));

            let (rep, g) = backup_interrupted(&st, "team/a", unit, &v3, at, |st| {
                let opts = GcOptions {
                    compact_below: 0.9,
                    ..Default::default()
                };
                gc(st, &opts).unwrap()
            });
            assert!(g.containers_compacted > 0, "{unit} at {at}: {g:?}");
            assert!(
                rep.predicted_bytes * 10 > rep.logical_bytes * 8,
                "{unit} at {at}: {rep:?}"
            );
            for _ in 0..2 {
                let c = check(&st).unwrap();
                assert!(c.ok, "{unit} at {at}: {:?}", c.errors);
                assert!(
                    restore_bytes(&st, "team/a", 2).0 == v2,
                    "{unit} at {at}: v2"
                );
                assert!(
                    restore_bytes(&st, "team/a", 3).0 == v3,
                    "{unit} at {at}: v3"
                );
                // Once the backup has unpinned, a gc may move the rest.
                gc(&st, &GcOptions::default()).unwrap();
            }
        }
    }
}

/// A slide finds the units only the sliding version references and trims
/// them down to the chunks the next version lacks. Another series' backup
/// that deduplicates against such a unit, and commits after the slide read
/// its counts but before the slide claimed it, must find it whole: the pause
/// point runs that backup exactly there. (Segment mode: there a unit holds
/// many chunks and trimming one loses data; 0c5f2c4 made the slide read the
/// counts again once it holds the unit, and this test fails without that.)
#[test]
fn a_backup_committing_inside_a_slide_keeps_the_units_it_references() {
    // Before the slide dooms the units it trims, team-b deduplicates against them; at the
    // slide's commit they are doomed and team-b must not build on what the commit trims.
    for point in ["slide.before_doom", "commit.enter"] {
        backup_inside_a_slide(point, false);
    }
}

#[test]
fn a_backup_through_the_sampled_index_committing_inside_a_slide_keeps_the_units_it_references() {
    // The same race with hints from the sampled index, which learns of the trim only at the
    // slide's commit.
    for point in ["slide.before_doom", "commit.enter"] {
        backup_inside_a_slide(point, true);
    }
}

/// With `sampled`, team-b looks up in a sampled index of 4 KiB (about one segment in two).
fn backup_inside_a_slide(point: &'static str, sampled: bool) {
    let unit = DedupUnit::Segment;
    let (_d, st) = if sampled {
        new_sampled_store(small_config(), 4 << 10)
    } else {
        new_store(small_config())
    };
    // The second version repeats most of the first: the slide trims the
    // first version's own units down to what the second lacks.
    let old = random(2 << 20, 31);
    let mut new = old.clone();
    for j in 0..20u64 {
        let at = j as usize * 100_000 + 500;
        new.splice(at..at + 50, random(64, 300 + j));
    }
    backup_bytes(&st, "team-a/db", &old, unit);
    backup_bytes(&st, "team-a/db", &new, unit);
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (copy, ran2) = (old.clone(), ran.clone());
    st.on_pause_point(
        point,
        Box::new(move |st: &Store| {
            let rep = backup_bytes(st, "team-b/db", &copy, unit);
            if point == "slide.before_doom" {
                assert!(
                    rep.new_vbytes < copy.len() as u64 / 10,
                    "team-b did not dedup against team-a's first version: {rep:?}"
                );
            }
            ran2.store(true, std::sync::atomic::Ordering::SeqCst);
        }),
    );
    let slid = revault_engine::slide(&st, "team-a/db").unwrap();
    assert!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        "{point}: the pause point was not reached"
    );
    assert_eq!(slid.slid, vec![1], "{point}");
    assert_eq!(
        restore_bytes(&st, "team-b/db", 1).0,
        old,
        "{point}: team-b after the slide"
    );
    // What the slide thought the first version alone referenced goes with it.
    expire(&st, "team-a/db", &ExpireSel::Version(1)).unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    assert_eq!(
        restore_bytes(&st, "team-b/db", 1).0,
        old,
        "{point}: team-b after team-a's first version expired"
    );
    assert_eq!(restore_bytes(&st, "team-a/db", 2).0, new, "{point}");
    let c = check(&st).unwrap();
    assert!(c.ok, "{point}: {:?}", c.errors);
    if let Some(ix) = st.sampled_index_stats() {
        assert!(ix.shift > 0, "{point}: the index samples: {ix:?}");
    }
}
