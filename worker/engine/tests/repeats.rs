//! `repeats`: chunk data stored more than once, measured on real stores.

mod common;

use common::*;
use revault_engine::config::DedupUnit;
use revault_engine::repeats::repeats;

/// Random data with `r` (smaller than the smallest segment, so no segment
/// lies inside it) inserted after every `gap` bytes, `copies` times.
fn with_repeats(r: &[u8], gap: usize, copies: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..copies {
        out.extend(random(gap, seed + i as u64));
        out.extend_from_slice(r);
    }
    out.extend(random(gap, seed + 99));
    out
}

#[test]
fn far_repeats_inside_new_segments_are_counted_and_chunk_mode_has_none() {
    let r = random(3500, 7);
    // 1.5 MiB apart: more new data than one 1 MiB container, so near links
    // do not reach back.
    let data = with_repeats(&r, 1536 << 10, 3, 100);

    let (_d1, seg) = new_store(small_config());
    backup_bytes(&seg, "t/seg", &data, DedupUnit::Segment);
    let s = repeats(&seg).unwrap();

    let (_d2, chunk) = new_store(small_config());
    backup_bytes(&chunk, "t/chunk", &data, DedupUnit::Chunk);
    let c = repeats(&chunk).unwrap();

    assert_eq!(c.repeat_bytes, 0, "{c:?}");
    assert!(s.repeat_bytes > 0, "{s:?}");
    // Both modes cut the same chunks: without its repeats, the segment store
    // holds exactly what exact chunk dedup holds.
    assert_eq!(s.stored_bytes - s.repeat_bytes, c.stored_bytes);
    assert_eq!(s.distinct_chunks, c.distinct_chunks);
    // The repeats are the chunks inside `r`: at most two extra copies of it,
    // each chunk stored three times, all in the live version's units, none
    // inside one unit.
    assert!(s.repeat_bytes <= 2 * r.len() as u64, "{s:?}");
    assert_eq!(s.repeat_bytes_by_copies, [0, s.repeat_bytes, 0, 0]);
    assert_eq!(s.repeat_bytes_in_live_units, s.repeat_bytes);
    assert_eq!(s.repeat_bytes_same_unit, 0);
    assert!(s.excess_ratio() > 1.0 && c.excess_ratio() == 1.0);
}

#[test]
fn near_repeats_are_linked_not_stored() {
    let r = random(3500, 8);
    // 100 KiB apart: within a container's worth of new data.
    let data = with_repeats(&r, 100 << 10, 3, 200);
    let (_d, seg) = new_store(small_config());
    backup_bytes(&seg, "t/seg", &data, DedupUnit::Segment);
    let s = repeats(&seg).unwrap();
    assert_eq!(s.repeat_bytes, 0, "{s:?}");
    assert_eq!(restore_bytes(&seg, "t/seg", 1).0, data);
}
