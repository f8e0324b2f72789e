//! Backups through the sampled, progressive index (`Store::use_sampled_index`): they store
//! about what the exact index stores, every version restores byte-exact, the index stays
//! within its memory budget, and a store reopened rebuilds the same sample.

mod common;

use common::*;
use revault_engine::{check, expire, gc, slide, DedupUnit, ExpireSel, GcOptions, OpenMode, Store};

/// Five versions of a 6 MiB series, each overwriting a few scattered runs of the one before,
/// and a second series that shares half of the first one's content.
fn versions() -> Vec<Vec<u8>> {
    let mut v = random(6 << 20, 1);
    let mut out = vec![v.clone()];
    for i in 0..4u64 {
        for k in 0..6u64 {
            let at = ((i * 7 + k * 13) % 48) as usize * (128 << 10);
            v[at..at + 3000].copy_from_slice(&random(3000, 100 + i * 10 + k));
        }
        out.push(v.clone());
    }
    out
}

/// Backs up every version to `a` and a half-shared series to `b`, sliding `a` after each
/// version in segment mode (the default mode's reverse dedup); returns the bytes stored new.
fn back_up_all(st: &Store, unit: DedupUnit, vs: &[Vec<u8>]) -> u64 {
    let mut stored = 0;
    for v in vs {
        stored += backup_bytes(st, "t/a", v, unit).new_vbytes;
        if unit == DedupUnit::Segment {
            slide(st, "t/a").unwrap();
        }
    }
    let mut b = vs[0][..3 << 20].to_vec();
    b.extend(random(3 << 20, 9));
    stored + backup_bytes(st, "t/b", &b, unit).new_vbytes
}

fn all_restore(st: &Store, vs: &[Vec<u8>]) {
    for (i, v) in vs.iter().enumerate() {
        assert!(
            restore_bytes(st, "t/a", i as u32 + 1).0 == *v,
            "version {} restores byte-exact",
            i + 1
        );
    }
    let c = check(st).unwrap();
    assert!(c.ok, "{:?}", c.errors);
}

#[test]
fn backups_through_a_sampled_index_store_about_what_the_exact_index_stores() {
    let vs = versions();
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let (_d1, exact) = new_store(small_config());
        let want = back_up_all(&exact, unit, &vs);
        // A budget far below the store's units (~9000 chunks or ~430 segments): the index
        // samples.
        let budget = match unit {
            DedupUnit::Chunk => 160 << 10,
            DedupUnit::Segment => 8 << 10,
        };
        let (_d2, sampled) = new_sampled_store(small_config(), budget);
        let got = back_up_all(&sampled, unit, &vs);
        let st = sampled.sampled_index_stats().unwrap();
        assert!(st.shift > 0, "{unit}: the index samples: {st:?}");
        assert!(st.ram_bytes <= budget, "{unit}: {st:?}");
        assert!(
            got as f64 <= want as f64 * 1.05,
            "{unit}: sampled stored {got}, exact {want}: {st:?}"
        );
        all_restore(&sampled, &vs);
    }
}

#[test]
fn a_reopened_store_rebuilds_its_sample_and_dedups_as_before() {
    let vs = versions();
    let (dir, st) = new_sampled_store(small_config(), 160 << 10);
    back_up_all(&st, DedupUnit::Chunk, &vs[..2]);
    let before = st.sampled_index_stats().unwrap();
    drop(st);
    let mut st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    st.use_sampled_index(160 << 10).unwrap();
    let after = st.sampled_index_stats().unwrap();
    // The same rate or a higher one (the running index never raises its rate; a rebuilt
    // one takes the highest that fits), within the budget.
    assert!(
        after.shift <= before.shift && after.sampled >= before.sampled,
        "{before:?} {after:?}"
    );
    assert!(after.ram_bytes <= 160 << 10, "{after:?}");
    // The same version again: everything is found.
    let rep = backup_bytes(&st, "t/a", &vs[1], DedupUnit::Chunk);
    assert!(
        rep.new_vbytes * 100 <= rep.logical_bytes,
        "{rep:?} {:?}",
        st.sampled_index_stats()
    );
    all_restore(&st, &vs[..2]);
}

#[test]
fn expired_data_leaves_the_sample_and_what_is_stored_again_restores() {
    let vs = versions();
    let (_d, st) = new_sampled_store(small_config(), 160 << 10);
    backup_bytes(&st, "t/a", &vs[0], DedupUnit::Chunk);
    let sampled = st.sampled_index_stats().unwrap().sampled;
    assert!(sampled > 0);
    expire(&st, "t/a", &ExpireSel::Version(1)).unwrap();
    gc(&st, &GcOptions::default()).unwrap();
    assert_eq!(
        st.sampled_index_stats().unwrap().sampled,
        0,
        "nothing stored, nothing sampled"
    );
    // The same data again is new data, stored whole, and restores.
    let rep = backup_bytes(&st, "t/a", &vs[0], DedupUnit::Chunk);
    assert!(rep.new_vbytes >= vs[0].len() as u64 * 99 / 100, "{rep:?}");
    assert!(restore_bytes(&st, "t/a", 2).0 == vs[0]);
    let c = check(&st).unwrap();
    assert!(c.ok, "{:?}", c.errors);
}
