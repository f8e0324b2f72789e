//! Store helpers for the remote's tests; the S3 server is `revault_remote::testing`.
#![allow(dead_code)]

use std::io::Cursor;
use std::path::Path;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use revault_engine::{
    backup, restore, BackupOptions, BackupReport, DedupUnit, InitOptions, OpenMode, RestoreOptions,
    RestoreTarget, SizeRange, Store, StoreConfig, StreamSource, VersionSel, KIB, MIB,
};
pub use revault_remote::testing::{fresh_url, s3};
use revault_remote::{InitRemote, Remote, RemoteUrl};

pub fn small_config() -> StoreConfig {
    StoreConfig {
        chunk: SizeRange {
            min: 256,
            avg: 1024,
            max: 8 * 1024,
        },
        segment: SizeRange {
            min: 4 * 1024,
            avg: 16 * 1024,
            max: 64 * 1024,
        },
        container_bytes: MIB,
        block_bytes: 64 * KIB as u32,
        ..Default::default()
    }
}

/// A new store at `dir/store` with a remote at `url`; the key file is `dir/key`, created.
pub fn new_store_with_remote(dir: &Path, url: &RemoteUrl) -> (Store, Remote) {
    assert!(!dir.join("key").exists());
    store_with_remote_and_key(dir, url)
}

/// A new store at `dir/store` with a remote at `url`, opened by key file `dir/key` (created
/// if missing).
pub fn store_with_remote_and_key(dir: &Path, url: &RemoteUrl) -> (Store, Remote) {
    let existed = dir.join("key").exists();
    let root = dir.join("store");
    Store::init(
        &root,
        &InitOptions {
            config: small_config(),
            data_dir: None,
        },
    )
    .unwrap();
    let store = Store::open(&root, OpenMode::ReadWrite, "test").unwrap();
    let (remote, rep) = Remote::init(
        &store,
        &InitRemote {
            url: url.clone(),
            key_file: dir.join("key"),
            object_lock: None,
        },
    )
    .unwrap();
    assert_eq!(rep.created_key_file, !existed);
    (store, remote)
}

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Version `i` of a series: mostly the same bytes as version `i - 1`, with a few edits.
pub fn version_data(seed: u64, i: u64, len: usize) -> Vec<u8> {
    let mut d = random(len, seed);
    for k in 1..=i {
        let at = (k as usize * 7919 * 13) % len.saturating_sub(4096).max(1);
        d[at..at + 2048].copy_from_slice(&random(2048, seed ^ (k << 8)));
    }
    d
}

/// Backs `data` up as the next version of `series`; a series this creates slides only when a
/// test says so (manual retention), as the engine's test helpers do.
pub fn backup_bytes(store: &Store, series: &str, data: &[u8], unit: DedupUnit) -> BackupReport {
    let src = StreamSource::new("test input", Cursor::new(data.to_vec()));
    backup(
        store,
        series,
        Box::new(src),
        &BackupOptions {
            unit: Some(unit),
            new_series_retention: Some(manual_live_1()),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Every version kept, live window 1, slides only when a test says so.
pub fn manual_live_1() -> revault_engine::Retention {
    revault_engine::Retention {
        live: 1,
        auto: false,
        ..Default::default()
    }
}

pub fn restore_bytes(store: &Store, series: &str, v: u32) -> revault_engine::Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    restore(
        store,
        series,
        VersionSel::Number(v),
        &RestoreOptions {
            cache_bytes: MIB,
            ..Default::default()
        },
        RestoreTarget::Writer(&mut out),
    )?;
    Ok(out)
}

/// Every version of every series in `expected` restores byte-exact from `store`, and the
/// store lists exactly those versions.
/// What a test expects a store to hold: per series, its versions and their bytes.
pub type Expected<'a> = [(&'a str, Vec<(u32, Vec<u8>)>)];

pub fn assert_holds(store: &Store, expected: &Expected<'_>) {
    for (series, versions) in expected {
        let s = store.series(series).unwrap();
        let listed: Vec<u32> = store
            .versions(&s)
            .unwrap()
            .iter()
            .map(|v| v.number)
            .collect();
        let want: Vec<u32> = versions.iter().map(|(n, _)| *n).collect();
        assert_eq!(listed, want, "{series}: versions listed");
        for (n, data) in versions {
            let got = restore_bytes(store, series, *n).unwrap();
            assert!(
                got == *data,
                "{series} version {n} does not restore byte-exact"
            );
        }
    }
}
