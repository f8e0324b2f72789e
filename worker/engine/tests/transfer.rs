//! Block transfer: a version sent as stored blocks and assembled by the
//! receiver comes out byte-exact, as a stream, a tar stream or a directory;
//! a cut or damaged stream is refused, never written out as data.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use revault_engine::{
    backup, restore,
    transfer::{send, Destination, Receiver},
    BackupOptions, DedupUnit, RestoreOptions, RestoreTarget, Store, TreeSource, VersionSel, MIB,
};

fn opts(cache_bytes: u64) -> RestoreOptions {
    RestoreOptions {
        cache_bytes,
        ..Default::default()
    }
}

fn send_latest(store: &Store, series: &str, cache_bytes: u64) -> Vec<u8> {
    let mut wire = Vec::new();
    send(
        store,
        series,
        VersionSel::Latest,
        &opts(cache_bytes),
        &mut wire,
    )
    .unwrap();
    wire
}

/// Feeds the stream in pieces of random sizes, as a network delivers it.
fn receive(wire: &[u8], dest: Destination, seed: u64) -> revault_engine::Result<()> {
    let mut rx = Receiver::new(dest);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut at = 0;
    while at < wire.len() {
        let n = rng.random_range(1..200_000).min(wire.len() - at);
        rx.feed(&wire[at..at + n])?;
        at += n;
    }
    rx.finish().map(|_| ())
}

/// Two versions with repeats, zeros and edits, so the latest reads many
/// containers over several windows.
fn two_versions(store: &Store, unit: DedupUnit) -> Vec<u8> {
    let mut v1 = random(3 << 20, 1);
    v1.extend(std::iter::repeat_n(0u8, 300_000));
    v1.extend_from_slice(&random(1 << 20, 2));
    backup_bytes(store, "t/s", &v1, unit);
    let mut v2 = v1.clone();
    v2[100_000..140_000].copy_from_slice(&random(40_000, 3));
    v2.extend_from_slice(&v1[..700_000]);
    v2.splice(2_000_000..2_000_000, random(50_000, 4));
    backup_bytes(store, "t/s", &v2, unit);
    v2
}

#[test]
fn a_stream_version_arrives_byte_exact_with_the_faa_plan() {
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let (_d, store) = new_store(small_config());
        let want = two_versions(&store, unit);
        let mut wire = Vec::new();
        let sent = send(&store, "t/s", VersionSel::Latest, &opts(MIB), &mut wire).unwrap();
        let out = Shared::default();
        receive(&wire, Destination::Writer(Box::new(out.clone())), 7).unwrap();
        assert!(
            *out.0.lock().unwrap() == want,
            "{unit}: restored bytes differ"
        );
        // The sender reads what a local FAA restore reads, and ships less.
        let mut local = Vec::new();
        let faa = restore(
            &store,
            "t/s",
            VersionSel::Latest,
            &RestoreOptions {
                cache_bytes: MIB,
                cache: "faa".parse().unwrap(),
                ..Default::default()
            },
            RestoreTarget::Writer(&mut local),
        )
        .unwrap();
        assert_eq!(sent.container_reads, faa.container_reads, "{unit}");
        assert!(
            sent.container_reads > 2,
            "{unit}: {} reads",
            sent.container_reads
        );
    }
}

#[test]
fn a_tree_version_arrives_as_the_same_tar_stream_and_as_a_directory() {
    let (_d, store) = new_store(small_config());
    let src = tempfile::tempdir().unwrap();
    for i in 0..30 {
        let dir = src.path().join(format!("d{}", i % 4));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("f{i}")),
            random(1_000 + i * 3_001, i as u64),
        )
        .unwrap();
    }
    std::fs::create_dir_all(src.path().join("empty")).unwrap();
    std::os::unix::fs::symlink("d0/f0", src.path().join("link")).unwrap();
    backup(
        &store,
        "t/tree",
        Box::new(TreeSource::new(src.path()).unwrap()),
        &BackupOptions {
            unit: Some(DedupUnit::Segment),
            ..Default::default()
        },
    )
    .unwrap();
    let wire = send_latest(&store, "t/tree", MIB);

    let tar = Shared::default();
    receive(&wire, Destination::Writer(Box::new(tar.clone())), 1).unwrap();
    let mut local = Vec::new();
    restore(
        &store,
        "t/tree",
        VersionSel::Latest,
        &opts(MIB),
        RestoreTarget::Writer(&mut local),
    )
    .unwrap();
    assert!(*tar.0.lock().unwrap() == local, "the tar streams differ");

    let out = tempfile::tempdir().unwrap();
    let root = out.path().join("restored");
    receive(&wire, Destination::Dir(root.clone()), 2).unwrap();
    for i in 0..30 {
        let rel = format!("d{}/f{i}", i % 4);
        assert_eq!(
            std::fs::read(root.join(&rel)).unwrap(),
            std::fs::read(src.path().join(&rel)).unwrap(),
            "{rel}"
        );
    }
    assert!(root.join("empty").is_dir());
    assert_eq!(
        std::fs::read_link(root.join("link")).unwrap(),
        std::path::Path::new("d0/f0")
    );
}

#[test]
fn a_cut_stream_is_refused() {
    let (_d, store) = new_store(small_config());
    two_versions(&store, DedupUnit::Segment);
    let wire = send_latest(&store, "t/s", MIB);
    for cut in [
        5,
        200,
        wire.len() / 3,
        wire.len() / 2,
        wire.len() - 9,
        wire.len() - 1,
    ] {
        let err = receive(
            &wire[..cut],
            Destination::Writer(Box::new(Shared::default())),
            3,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("ended"), "cut at {cut}: {err}");
    }
}

#[test]
fn a_block_damaged_on_the_way_is_reported_not_written() {
    let (_d, store) = new_store(small_config());
    two_versions(&store, DedupUnit::Chunk);
    let mut wire = send_latest(&store, "t/s", MIB);
    // The first window frame follows the header frame; its first block's
    // stored bytes follow the group's id, block count and block records.
    let header_len = 9 + u64::from_le_bytes(wire[1..9].try_into().unwrap()) as usize;
    assert_eq!(wire[header_len], b'W');
    let group = header_len + 9 + 4;
    let n_blocks = u32::from_le_bytes(wire[group + 8..group + 12].try_into().unwrap()) as usize;
    wire[group + 12 + n_blocks * 21] ^= 0x40;
    let out = Shared::default();
    let err = receive(&wire, Destination::Writer(Box::new(out.clone())), 4)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("corrupt container") && err.contains("checksum"),
        "{err}"
    );
    assert!(
        out.0.lock().unwrap().is_empty(),
        "bytes of the damaged window were written"
    );
}

#[test]
fn a_corrupt_container_fails_the_sender() {
    let (dir, store) = new_store(small_config());
    two_versions(&store, DedupUnit::Chunk);
    let mut files = Vec::new();
    for d in std::fs::read_dir(dir.path().join("data")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            files.push(f.unwrap().path());
        }
    }
    files.sort();
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(&files[0], &bytes).unwrap();
    let mut wire = Vec::new();
    let err = send(&store, "t/s", VersionSel::Latest, &opts(MIB), &mut wire)
        .unwrap_err()
        .to_string();
    assert!(err.contains("corrupt container"), "{err}");
}
