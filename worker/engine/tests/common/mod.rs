//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use revault_engine::{
    backup, restore, BackupOptions, BackupReport, DedupUnit, InitOptions, OpenMode, RestoreOptions,
    RestoreReport, RestoreTarget, Retention, SizeRange, Store, StoreConfig, StreamSource,
    VersionSel, KIB, MIB,
};

/// Small chunks, segments and containers so small inputs exercise many units,
/// blocks and containers.
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

pub fn new_store(config: StoreConfig) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    Store::init(
        dir.path(),
        &InitOptions {
            config,
            data_dir: None,
        },
    )
    .unwrap();
    let s = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
    (dir, s)
}

/// A store whose backups look up in a sampled index of `budget` bytes (see
/// `Store::use_sampled_index`).
pub fn new_sampled_store(config: StoreConfig, budget: usize) -> (tempfile::TempDir, Store) {
    let (d, mut s) = new_store(config);
    s.use_sampled_index(budget).unwrap();
    (d, s)
}

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

pub fn backup_bytes(store: &Store, series: &str, data: &[u8], unit: DedupUnit) -> BackupReport {
    backup_with(
        store,
        series,
        data,
        &BackupOptions {
            unit: Some(unit),
            ..Default::default()
        },
    )
}

/// Backs `data` up as the next version of `series`. A series these helpers create has manual
/// retention (no automatic slides): the engine's tests slide, expire and pause when they say
/// so. A series created any other way gets `Retention::default()` (automatic slides).
pub fn backup_with(store: &Store, series: &str, data: &[u8], opts: &BackupOptions) -> BackupReport {
    let opts = BackupOptions {
        new_series_retention: opts.new_series_retention.clone().or(Some(manual())),
        ..opts.clone()
    };
    let src = StreamSource::new("test input", Cursor::new(data.to_vec()));
    backup(store, series, Box::new(src), &opts).unwrap()
}

/// Every version kept, live window 1, no automatic slides.
pub fn manual() -> Retention {
    Retention {
        auto: false,
        ..Default::default()
    }
}

/// What the tests restore with: a 1 MiB budget, so that small versions
/// take several windows and container reads.
pub fn small_restore() -> RestoreOptions {
    RestoreOptions {
        cache_bytes: MIB,
        ..Default::default()
    }
}

pub fn restore_bytes(store: &Store, series: &str, v: u32) -> (Vec<u8>, RestoreReport) {
    restore_with(store, series, VersionSel::Number(v), &small_restore())
}

pub fn restore_with(
    store: &Store,
    series: &str,
    sel: VersionSel,
    opts: &RestoreOptions,
) -> (Vec<u8>, RestoreReport) {
    let mut out: Vec<u8> = Vec::new();
    let rep = restore(store, series, sel, opts, RestoreTarget::Writer(&mut out)).unwrap();
    (out, rep)
}

/// A writer whose bytes a test can read back after handing it over (to a
/// block-transfer receiver, which owns its destination).
#[derive(Clone, Default)]
pub struct Shared(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A version sent as a block-transfer stream and assembled by a receiver
/// fed in 50 KiB pieces, as `revault pull` does.
pub fn transfer_bytes(store: &Store, series: &str, v: u32) -> Vec<u8> {
    use revault_engine::transfer::{send, Destination, Receiver};
    let mut wire = Vec::new();
    send(
        store,
        series,
        VersionSel::Number(v),
        &small_restore(),
        &mut wire,
    )
    .unwrap();
    let out = Shared::default();
    let mut rx = Receiver::new(Destination::Writer(Box::new(out.clone())));
    for piece in wire.chunks(50 << 10) {
        rx.feed(piece).unwrap();
    }
    rx.finish().unwrap();
    let mut bytes = out.0.lock().unwrap();
    std::mem::take(&mut *bytes)
}

/// Backs up two versions of `series`: 8 MiB of random bytes (from `seed`),
/// then the same with every other 64 KiB block (from the second) replaced.
/// Once the first expires, the containers the two share are half dead,
/// which is what gc compacts. Returns both.
pub fn half_shared_versions(
    store: &Store,
    series: &str,
    unit: DedupUnit,
    seed: u64,
) -> (Vec<u8>, Vec<u8>) {
    let v1 = random(8 << 20, seed);
    let mut v2 = v1.clone();
    for (i, r) in v2.chunks_mut(64 << 10).enumerate().skip(1).step_by(2) {
        r.copy_from_slice(&random(r.len(), seed * 1000 + i as u64));
    }
    backup_bytes(store, series, &v1, unit);
    backup_bytes(store, series, &v2, unit);
    (v1, v2)
}

/// A piece of data at `at` and again `gap` bytes later in `base`: in
/// segment mode, the later copy's segment links its chunks to the earlier
/// copy's segment (when `gap` is under a container's worth of new data).
pub fn with_near_repeat(base: &mut [u8], at: usize, gap: usize, seed: u64) {
    let x = random(3000, seed);
    base[at..at + x.len()].copy_from_slice(&x);
    base[at + gap..at + gap + x.len()].copy_from_slice(&x);
}

/// Runs `hook` when the engine reaches pause point `name`; returns a flag
/// that says whether it ran (a test whose pause point is never reached
/// proves nothing: see [`reached`]).
pub fn at(st: &Store, name: &str, hook: impl FnOnce(&Store) + Send + 'static) -> Arc<AtomicBool> {
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    st.on_pause_point(
        name,
        Box::new(move |st: &Store| {
            hook(st);
            r.store(true, Ordering::SeqCst);
        }),
    );
    ran
}

pub fn reached(flag: &AtomicBool, name: &str) {
    assert!(
        flag.load(Ordering::SeqCst),
        "pause point {name} not reached"
    );
}

/// Files under `dir`, at any depth.
pub fn files_in(dir: &Path) -> u64 {
    let mut n = 0;
    for d in std::fs::read_dir(dir).unwrap().flatten() {
        if d.path().is_dir() {
            n += files_in(&d.path());
        } else {
            n += 1;
        }
    }
    n
}

/// Copies a directory tree (a store's `meta/`, to put an older copy back).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}
