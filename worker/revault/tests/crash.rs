//! Crash safety with real SIGKILLs: a `revault backup` child is killed at
//! random points. Afterwards `check` passes, no partial version is listed,
//! every earlier version restores byte-exact, and after `gc` no orphan
//! container is left.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ITERATIONS: usize = 24;

fn versions(store: &str) -> Vec<u64> {
    let l = ok_json(&["list", "--store", store, "--series", "default/db"]);
    l["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["number"].as_u64().unwrap())
        .collect()
}

#[test]
fn sigkill_during_backup_never_loses_or_half_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap().to_string();
    ok_json(&["init", "--store", &s, "--container-mib", "1"]);
    let mut rng = ChaCha8Rng::seed_from_u64(42);

    // Each attempt backs up a new version: the previous one edited, plus new data.
    let mut base = random(6 << 20, 1);
    let mut committed: Vec<(u64, std::path::PathBuf)> = Vec::new();
    let mut attempt_dur = Duration::from_millis(300);
    let mut kills = 0;
    for i in 0..ITERATIONS {
        let at = rng.random_range(0..base.len());
        let fresh = random(rng.random_range(256 << 10..3 << 20), 1000 + i as u64);
        base.splice(at..at, fresh);
        let input = dir.path().join(format!("input-{i}"));
        std::fs::write(&input, &base).unwrap();

        let mut child = Command::new(bin())
            .args([
                "backup",
                "--store",
                &s,
                "--series",
                "default/db",
                input.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        // Kill anywhere from the start to a little after a typical backup ends.
        let delay = attempt_dur.mul_f64(rng.random_range(0.0..1.3));
        let mut finished = false;
        while started.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                finished = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if !finished {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            kills += 1;
        }
        let status = child.wait().unwrap();
        if status.success() {
            attempt_dur = (attempt_dur + started.elapsed()) / 2;
        }

        // No partial version: the listing has exactly the committed ones, plus
        // this attempt if and only if it committed.
        let vs = versions(&s);
        let expected_prev: Vec<u64> = committed.iter().map(|c| c.0).collect();
        assert!(
            vs.starts_with(&expected_prev),
            "iteration {i}: {vs:?} vs {expected_prev:?}"
        );
        assert!(vs.len() <= expected_prev.len() + 1, "iteration {i}: {vs:?}");
        if vs.len() == expected_prev.len() + 1 {
            committed.push((*vs.last().unwrap(), input.clone()));
        } else {
            assert!(!status.success(), "a successful backup must be listed");
        }
        let c = ok_json(&["check", "--store", &s]);
        assert!(
            c["ok"].as_bool().unwrap(),
            "iteration {i}: {:?}",
            c["errors"]
        );

        // The newest committed version and a random older one restore exactly.
        if let Some((v, path)) = committed.last() {
            let picks = [*v, committed[rng.random_range(0..committed.len())].0];
            for pick in picks {
                let want = &committed.iter().find(|c| c.0 == pick).unwrap().1;
                let out = dir.path().join("restored");
                ok_json(&[
                    "restore",
                    "--store",
                    &s,
                    "--series",
                    "default/db",
                    "--version",
                    &pick.to_string(),
                    "-o",
                    out.to_str().unwrap(),
                ]);
                assert_eq!(
                    sha256_file(&out),
                    sha256_file(want),
                    "iteration {i}: version {pick}"
                );
            }
            let _ = path;
        }
    }
    assert!(
        kills >= ITERATIONS / 3,
        "only {kills} of {ITERATIONS} attempts were killed mid-way"
    );
    assert!(!committed.is_empty(), "some attempts completed");

    // gc leaves no orphan container, and everything still restores.
    ok_json(&["gc", "--store", &s]);
    let c = ok_json(&["check", "--store", &s]);
    assert!(c["ok"].as_bool().unwrap());
    let orphans = orphan_warnings(&c);
    assert!(orphans.is_empty(), "{orphans:?}");
    let files = files_under(&store.join("data")).len();
    let st = ok_json(&["stats", "--store", &s]);
    assert_eq!(
        files as u64,
        st["containers"].as_u64().unwrap(),
        "container files on disk match the store's records"
    );
    for (v, path) in &committed {
        let out = dir.path().join("restored");
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
        assert_eq!(sha256_file(&out), sha256_file(path), "version {v}");
    }
}
