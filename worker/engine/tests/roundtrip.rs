//! Model-based round trip: random version histories over several series and
//! both dedup units; every committed version must restore byte-exact, and the
//! store must pass `check`.

mod common;

use common::*;
use proptest::prelude::*;
use revault_engine::DedupUnit;

#[derive(Clone, Debug)]
enum Edit {
    Insert {
        at: f64,
        len: usize,
        seed: u64,
    },
    Delete {
        at: f64,
        len: usize,
    },
    Overwrite {
        at: f64,
        len: usize,
        seed: u64,
    },
    /// Copy an existing region elsewhere (repeated content inside a version).
    Repeat {
        from: f64,
        len: usize,
        to: f64,
    },
    /// A run of zeros (never stored).
    Zeros {
        at: f64,
        len: usize,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0.0..1.0f64, 1usize..20_000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Insert {
            at,
            len,
            seed
        }),
        (0.0..1.0f64, 1usize..30_000).prop_map(|(at, len)| Edit::Delete { at, len }),
        (0.0..1.0f64, 1usize..20_000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Overwrite {
            at,
            len,
            seed
        }),
        (0.0..1.0f64, 1usize..40_000, 0.0..1.0f64).prop_map(|(from, len, to)| Edit::Repeat {
            from,
            len,
            to
        }),
        (0.0..1.0f64, 1usize..100_000).prop_map(|(at, len)| Edit::Zeros { at, len }),
    ]
}

fn apply(data: &mut Vec<u8>, e: &Edit) {
    let pos = |f: f64, d: &Vec<u8>| ((d.len() as f64) * f) as usize;
    match *e {
        Edit::Insert { at, len, seed } => {
            let p = pos(at, data);
            data.splice(p..p, random(len, seed));
        }
        Edit::Delete { at, len } => {
            let p = pos(at, data);
            let end = (p + len).min(data.len());
            data.drain(p..end);
        }
        Edit::Overwrite { at, len, seed } => {
            let p = pos(at, data);
            let end = (p + len).min(data.len());
            data.splice(p..end, random(end - p, seed));
        }
        Edit::Repeat { from, len, to } => {
            let p = pos(from, data);
            let end = (p + len).min(data.len());
            let chunk = data[p..end].to_vec();
            let q = pos(to, data);
            data.splice(q..q, chunk);
        }
        Edit::Zeros { at, len } => {
            let p = pos(at, data);
            data.splice(p..p, std::iter::repeat_n(0u8, len));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_version_restores_byte_exact(
        base_len in 0usize..400_000,
        seed in any::<u64>(),
        steps in proptest::collection::vec((0usize..3, proptest::collection::vec(edit(), 0..4)), 1..10),
    ) {
        let (_dir, store) = new_store(small_config());
        let names = ["default/seg-a", "default/chunk-b", "other/seg-c"];
        let units = [DedupUnit::Segment, DedupUnit::Chunk, DedupUnit::Segment];
        // All series start from the same base: dedup across series.
        let base = random(base_len, seed);
        let mut content: Vec<Vec<u8>> = vec![base.clone(), base.clone(), base];
        let mut expected: Vec<Vec<Vec<u8>>> = vec![vec![], vec![], vec![]];
        for (s, edits) in &steps {
            for e in edits {
                apply(&mut content[*s], e);
            }
            let rep = backup_bytes(&store, names[*s], &content[*s], units[*s]);
            expected[*s].push(content[*s].clone());
            prop_assert_eq!(rep.version as usize, expected[*s].len());
            prop_assert_eq!(rep.logical_bytes as usize, content[*s].len());
        }
        for s in 0..3 {
            for (i, want) in expected[s].iter().enumerate() {
                let (got, _) = restore_bytes(&store, names[s], i as u32 + 1);
                prop_assert!(got == *want, "{} version {} differs ({} vs {} bytes)", names[s], i + 1, got.len(), want.len());
            }
        }
        let c = revault_engine::check(&store).unwrap();
        prop_assert!(c.ok, "check: {:?}", c.errors);
    }
}

#[test]
fn duplicate_versions_store_nothing_new_and_zeros_are_not_stored() {
    let (_dir, store) = new_store(small_config());
    let mut data = random(600_000, 9);
    data.extend(std::iter::repeat_n(0u8, 500_000));
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let name = format!("default/{unit}");
        let a = backup_bytes(&store, &name, &data, unit);
        assert!(
            a.zero_bytes >= 400_000,
            "zero runs detected: {}",
            a.zero_bytes
        );
        assert!(
            a.new_vbytes <= 600_000 + 16_384,
            "zeros are not stored: {} new bytes",
            a.new_vbytes
        );
        let b = backup_bytes(&store, &name, &data, unit);
        assert_eq!(b.new_vbytes, 0, "an identical version adds no data");
        assert_eq!(b.version, 2);
        assert_eq!(restore_bytes(&store, &name, 2).0, data);
    }
}

/// A series' next backup takes its chunk boundaries from the previous
/// version where the data is the same (checked, not scanned for), and cuts
/// exactly the chunks a backup without a previous version cuts.
#[test]
fn the_next_version_predicts_its_chunks_and_cuts_the_same_ones() {
    let (_dir, store) = new_store(small_config());
    let mut data = random(3_000_000, 21);
    data[1_000_000..1_200_000].fill(0);
    let mut next = data.clone();
    for (i, at) in [2_500_000, 1_700_000, 900_000, 10_000]
        .into_iter()
        .enumerate()
    {
        next.splice(at..at, random(3000 + i * 1000, i as u64));
    }
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let name = format!("default/p-{unit}");
        let a = backup_bytes(&store, &name, &data, unit);
        assert_eq!(a.predicted_bytes, 0, "nothing to predict from");
        let b = backup_bytes(&store, &name, &next, unit);
        assert!(
            b.predicted_bytes * 10 > b.logical_bytes * 9,
            "{unit}: {} of {} bytes predicted",
            b.predicted_bytes,
            b.logical_bytes
        );
        // The same content as a first version elsewhere: scanned throughout.
        let fresh = backup_bytes(&store, &format!("other/p-{unit}"), &next, unit);
        assert_eq!(fresh.predicted_bytes, 0);
        assert_eq!((b.chunks, b.units), (fresh.chunks, fresh.units));
        assert_eq!(
            fresh.new_units, 0,
            "{unit}: the same chunks, already stored"
        );
        assert_eq!(restore_bytes(&store, &name, 2).0, next);
    }
}

/// A source of several pieces (as a tree's files are), each read in reads of
/// at most 100 KiB.
struct Pieces {
    pieces: Vec<Vec<u8>>,
    at: Option<(usize, usize)>,
}

impl revault_engine::Source for Pieces {
    fn next_piece(&mut self) -> revault_engine::Result<bool> {
        let i = self.at.map_or(0, |(i, _)| i + 1);
        self.at = Some((i, 0));
        Ok(i < self.pieces.len())
    }

    fn read(&mut self, buf: &mut [u8]) -> revault_engine::Result<usize> {
        let (i, pos) = self.at.expect("next_piece first");
        let rest = &self.pieces[i][pos..];
        let n = rest.len().min(buf.len()).min(100 << 10);
        buf[..n].copy_from_slice(&rest[..n]);
        self.at = Some((i, pos + n));
        Ok(n)
    }

    fn finish(
        self: Box<Self>,
    ) -> revault_engine::Result<Option<Vec<revault_engine::catalog::Entry>>> {
        Ok(None)
    }
}

#[test]
fn every_piece_is_chunked_on_its_own_wherever_the_read_blocks_end() {
    // The backup reads 1 MiB blocks: pieces that end exactly at, just
    // before and just after a block's end, empty ones, and one spanning
    // several blocks. Chunking restarts at every piece, so the chunks are
    // those of each piece chunked alone.
    const MIB: usize = 1 << 20;
    let sizes = [MIB, 0, MIB + 1, 100, 0, MIB - 101, 3 * MIB + 7, 5, 0];
    let pieces: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| random(n, 40 + i as u64))
        .collect();
    let all: Vec<u8> = pieces.concat();
    let (_dir, store) = new_store(small_config());
    let chunker = revault_engine::Chunker::new(store.config().chunk);
    let want: u64 = pieces
        .iter()
        .map(|p| chunker.chunk_all(p).len() as u64)
        .sum();
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let name = format!("default/pieces-{unit}");
        for v in 1..=2 {
            let src = Pieces {
                pieces: pieces.clone(),
                at: None,
            };
            let opts = revault_engine::BackupOptions {
                unit: Some(unit),
                ..Default::default()
            };
            let r = revault_engine::backup(&store, &name, Box::new(src), &opts).unwrap();
            assert_eq!(r.chunks, want, "{unit} v{v}: chunks of each piece alone");
            assert_eq!(r.logical_bytes, all.len() as u64);
            if v == 2 {
                // All but where a block's second half starts (cut on its own
                // thread, from a scan) follows the first version.
                assert_eq!(r.new_units, 0);
                assert!(r.predicted_bytes * 100 > r.logical_bytes * 99, "{r:?}");
            }
            assert!(
                restore_bytes(&store, &name, v).0 == all,
                "{unit} v{v} restores"
            );
        }
    }
}

#[test]
fn empty_input_is_a_valid_zero_length_version() {
    let (_dir, store) = new_store(small_config());
    let r = backup_bytes(&store, "default/empty", &[], DedupUnit::Segment);
    assert_eq!((r.version, r.logical_bytes, r.chunks), (1, 0, 0));
    let (got, rep) = restore_bytes(&store, "default/empty", 1);
    assert!(got.is_empty());
    assert_eq!(rep.container_reads, 0);
    assert!(revault_engine::check(&store).unwrap().ok);
}

#[test]
fn segment_mode_keeps_the_latest_version_contiguous() {
    // A fresh version is laid out in restore order: its restore reads each
    // container once, even with a cache smaller than one container, so the
    // speed factor is about the container size (4 MiB).
    let (_dir, store) = new_store(revault_engine::StoreConfig::default());
    let data = random(24 << 20, 5);
    backup_bytes(&store, "default/big", &data, DedupUnit::Segment);
    let (got, rep) = restore_bytes(&store, "default/big", 1);
    assert_eq!(got, data);
    assert_eq!(rep.container_reads, store.totals().unwrap().containers);
    let sf = rep.speed_factor.unwrap();
    assert!(sf > 3.5 && sf <= 4.0, "speed factor {sf}");
}
