//! Helpers for tests that run the real `revault` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// The `revault` binary under test: this build's, or `REVAULT_TEST_BIN`
/// (to run a test against another build, e.g. one from before a fix).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("REVAULT_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_revault").into())
    })
}

pub fn revault(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .env("REVAULT_LOG", "warn")
        .output()
        .expect("run revault")
}

/// Runs revault with `--json`: its output parsed, or an error saying what
/// it printed (for tests that report failures as values, not panics).
pub fn json_of(args: &[&str]) -> Result<serde_json::Value, String> {
    let mut a = args.to_vec();
    a.push("--json");
    let out = revault(&a);
    if !out.status.success() {
        return Err(format!(
            "revault {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("revault {args:?}: bad JSON: {e}"))
}

/// Runs revault, asserts success, returns stdout parsed as JSON.
pub fn ok_json(args: &[&str]) -> serde_json::Value {
    json_of(args).unwrap_or_else(|e| panic!("{e}"))
}

/// The warnings of a `revault check` report that name orphan files.
pub fn orphan_warnings(check: &serde_json::Value) -> Vec<serde_json::Value> {
    check["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w.as_str().unwrap().contains("orphan"))
        .cloned()
        .collect()
}

/// Runs revault, asserts failure, returns stderr.
pub fn fails(args: &[&str]) -> String {
    let out = revault(args);
    assert!(!out.status.success(), "revault {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

pub fn sha256_file(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

/// Every file below `dir` (containers under a store's `data/`, say).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            out.extend(files_under(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

pub fn init(store: &Path) {
    ok_json(&["init", "--store", store.to_str().unwrap()]);
}

/// Asserts that `revault check` finds nothing wrong with the store.
pub fn assert_check_ok(store: &Path) {
    let c = ok_json(&["check", "--store", store.to_str().unwrap()]);
    assert!(c["ok"].as_bool().unwrap(), "{c}");
}

/// Makes a FIFO at `path` (as a device like /dev/null, it must be written in
/// place) and starts a thread that reads it to the end.
pub fn fifo_reader(path: &Path) -> std::thread::JoinHandle<Vec<u8>> {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let path = path.to_path_buf();
    std::thread::spawn(move || std::fs::read(path).unwrap())
}

pub mod server;
pub mod tree;
