//! `repeats`: chunk data stored more than once, measured on real stores.

mod common;

use common::*;
use revault_engine::{repeats, DedupUnit};

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

#[test]
fn a_chunk_repeated_inside_a_segment_is_stored_once() {
    // Each 3 KB piece occurs twice within a few KB (mostly one segment),
    // nowhere else: segment mode then stores what exact chunk dedup stores.
    let mut data = Vec::new();
    for i in 0..16 {
        let r = random(3000, 300 + i);
        data.extend(random(20_000, 400 + i));
        data.extend_from_slice(&r);
        data.extend(random(1500, 500 + i));
        data.extend_from_slice(&r);
    }
    data.extend(random(20_000, 600));
    let (_d1, seg) = new_store(small_config());
    backup_bytes(&seg, "t/seg", &data, DedupUnit::Segment);
    let (_d2, chunk) = new_store(small_config());
    backup_bytes(&chunk, "t/chunk", &data, DedupUnit::Chunk);
    let (s, c) = (repeats(&seg).unwrap(), repeats(&chunk).unwrap());
    assert_eq!(s.repeat_bytes, 0, "{s:?}");
    assert_eq!(s.stored_bytes, c.stored_bytes);
    assert_eq!(restore_bytes(&seg, "t/seg", 1).0, data);
    let check = revault_engine::check(&seg).unwrap();
    assert!(check.ok, "{:?}", check.errors);
}

#[test]
fn links_resolved_by_a_slide_keep_one_copy_per_unit() {
    // Version 1: region A_i holds piece X_i; a little later a short region
    // holds X_i twice, whose chunks both link into A_i (one segment, mostly).
    // Version 2 edits every A_i and keeps the rest, so sliding version 1
    // trims A_i into a container version 1 owns and copies the linked bytes
    // into the surviving segments: once per segment, the repeat linking to
    // that copy.
    let mut v1 = Vec::new();
    let mut edits = Vec::new();
    for i in 0..12 {
        let x = random(3000, 700 + i);
        v1.extend(random(12_000, 800 + i));
        edits.push(v1.len());
        v1.extend_from_slice(&x);
        v1.extend(random(30_000, 900 + i));
        v1.extend_from_slice(&x);
        v1.extend(random(1500, 1000 + i));
        v1.extend_from_slice(&x);
        v1.extend(random(30_000, 1100 + i));
    }
    let mut v2 = v1.clone();
    for (i, at) in edits.iter().enumerate().rev() {
        v2.splice(at - 2000..at + 5000, random(7000, 1200 + i as u64));
    }
    let (_d, st) = new_store(small_config());
    backup_bytes(&st, "t/s", &v1, DedupUnit::Segment);
    backup_bytes(&st, "t/s", &v2, DedupUnit::Segment);
    let rep = revault_engine::slide(&st, "t/s").unwrap();
    assert!(rep.links_resolved > 0 && rep.units_trimmed > 0, "{rep:?}");
    let r = repeats(&st).unwrap();
    assert_eq!(r.repeat_bytes_same_unit, 0, "{r:?}");
    assert_eq!(restore_bytes(&st, "t/s", 1).0, v1);
    assert_eq!(restore_bytes(&st, "t/s", 2).0, v2);
    let check = revault_engine::check(&st).unwrap();
    assert!(check.ok, "{:?}", check.errors);
}
