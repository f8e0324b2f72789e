//! Crash safety of slide, expire and gc with real SIGKILLs: each operation is
//! killed at random points, 20+ times each. After every kill `check` passes,
//! every version that is listed restores byte-exact, and nothing committed is
//! lost; after a final gc no orphan is left.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const KILLS_EACH: usize = 20;

struct Fixture {
    store: String,
    dir: PathBuf,
    /// Inputs of the versions that must exist (number → file).
    inputs: Vec<(u64, PathBuf)>,
    rng: ChaCha8Rng,
    data: Vec<u8>,
    next_input: usize,
}

impl Fixture {
    fn versions(&self) -> Vec<u64> {
        let l = ok_json(&["list", "--store", &self.store, "--series", "default/db"]);
        l["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["number"].as_u64().unwrap())
            .collect()
    }

    /// A new version: the last one with scattered edits (segments change,
    /// chunks mostly do not, so slides have real work to do).
    fn backup(&mut self) {
        for _ in 0..8 {
            let at = self.rng.random_range(0..self.data.len() - 100);
            let edit = random(64, self.rng.random());
            self.data.splice(at..at + 64, edit);
        }
        let at = self.rng.random_range(0..self.data.len());
        self.data
            .splice(at..at, random(256 << 10, self.rng.random()));
        let input = self.dir.join(format!("input-{}", self.next_input));
        self.next_input += 1;
        std::fs::write(&input, &self.data).unwrap();
        let b = ok_json(&[
            "backup",
            "--store",
            &self.store,
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ]);
        self.inputs.push((b["version"].as_u64().unwrap(), input));
    }

    /// Runs `args` and kills it after a random fraction of `typical`:
    /// whether it was killed, whether it finished successfully, how long.
    fn run_and_kill(&mut self, args: &[&str], typical: Duration) -> (bool, bool, Duration) {
        let mut child = Command::new(bin())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let delay = typical.mul_f64(self.rng.random_range(0.0..1.2));
        while started.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        let killed = child.try_wait().unwrap().is_none();
        if killed {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        }
        let status = child.wait().unwrap();
        (
            killed && !status.success(),
            status.success(),
            started.elapsed(),
        )
    }

    /// The store checks clean, and exactly the versions it should hold are
    /// listed and restore byte-exact: every version backed up is there except
    /// `expired` — the target of an expiry that was run, which may be gone
    /// (or must be, when the expiry finished). A slide or gc that loses a
    /// version fails here.
    fn verify(&mut self, what: &str, expired: Option<(u64, bool)>) {
        let c = ok_json(&["check", "--store", &self.store]);
        assert!(
            c["ok"].as_bool().unwrap(),
            "after {what}: {:?}",
            c["errors"]
        );
        let listed = self.versions();
        for (v, _) in &self.inputs {
            let may_go = expired.is_some_and(|(e, _)| e == *v);
            assert!(
                listed.contains(v) || may_go,
                "after {what}: version {v} was lost (listed: {listed:?})"
            );
        }
        if let Some((e, true)) = expired {
            assert!(
                !listed.contains(&e),
                "after {what}: the expired version {e} is still listed"
            );
        }
        self.inputs.retain(|(v, _)| listed.contains(v));
        assert_eq!(
            listed.len(),
            self.inputs.len(),
            "after {what}: a version appeared from nowhere"
        );
        // The newest and one random other version.
        let picks = [
            self.inputs.len() - 1,
            self.rng.random_range(0..self.inputs.len()),
        ];
        for i in picks {
            let (v, input) = &self.inputs[i];
            let out = self.dir.join("restored");
            ok_json(&[
                "restore",
                "--store",
                &self.store,
                "--series",
                "default/db",
                "--version",
                &v.to_string(),
                "-o",
                out.to_str().unwrap(),
            ]);
            assert_eq!(
                sha256_file(&out),
                sha256_file(input),
                "after {what}: version {v}"
            );
        }
    }
}

#[test]
fn sigkill_during_slide_expire_and_gc_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let s = store.to_str().unwrap().to_string();
    ok_json(&[
        "init",
        "--store",
        &s,
        "--container-mib",
        "1",
        "--segment-kib",
        "256",
    ]);
    let mut f = Fixture {
        store: s.clone(),
        dir: tmp.path().to_path_buf(),
        inputs: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(7),
        data: random(6 << 20, 1),
        next_input: 0,
    };
    f.backup();
    let mut typical = [Duration::from_millis(150); 3];
    let mut killed = [0usize; 3];
    let names = ["slide", "expire", "gc"];
    let mut round = 0;
    while killed.iter().any(|k| *k < KILLS_EACH) {
        round += 1;
        assert!(
            round < 400,
            "could not kill each operation {KILLS_EACH} times: {killed:?}"
        );
        // Keep a few versions around so every operation has work to do.
        while f.inputs.len() < 4 {
            f.backup();
        }
        let op = round % 3;
        let oldest = f.inputs[0].0.to_string();
        let args: Vec<&str> = match op {
            0 => vec!["slide", "--store", &s, "--series", "default/db"],
            1 => vec![
                "expire",
                "--store",
                &s,
                "--series",
                "default/db",
                "--version",
                &oldest,
            ],
            _ => vec!["gc", "--store", &s, "--full", "--compact-below", "0.99"],
        };
        let (was_killed, finished, took) = f.run_and_kill(&args, typical[op]);
        if was_killed {
            killed[op] += 1;
        } else {
            typical[op] = (typical[op] + took) / 2;
        }
        let expired = (op == 1).then(|| (oldest.parse().unwrap(), finished));
        f.verify(
            &format!("{} (round {round}, killed: {was_killed})", names[op]),
            expired,
        );
        if op == 0 {
            f.backup(); // something new to slide next time
        }
    }
    // A gc after the last kill leaves no orphan and the records match the files.
    ok_json(&["gc", "--store", &s]);
    let c = ok_json(&["check", "--store", &s]);
    assert!(c["ok"].as_bool().unwrap());
    let orphans = orphan_warnings(&c);
    assert!(orphans.is_empty(), "{orphans:?}");
    let st = ok_json(&["stats", "--store", &s]);
    assert_eq!(
        files_under(&store.join("data")).len() as u64,
        st["containers"].as_u64().unwrap()
    );
    for i in 0..f.inputs.len() {
        let (v, input) = f.inputs[i].clone();
        let out = f.dir.join("final");
        ok_json(&[
            "restore",
            "--store",
            &s,
            "--series",
            "default/db",
            "--version",
            &v.to_string(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(sha256_file(&out), sha256_file(&input), "version {v}");
    }
}
