//! The fuzz targets (worker/fuzz, docs/fuzzing.md) without the fuzzer: every
//! input that once crashed a decoder is replayed here, so it stays fixed in
//! an ordinary `cargo test`, and the seeds the fuzzer starts from must still
//! be inputs the decoders accept.

use std::path::{Path, PathBuf};

use revault_engine::fuzzing::{run, seeds, TARGETS};

fn regressions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions")
}

/// Each file under `worker/fuzz/regressions/<target>/` is an input that made
/// that target panic, hang or run out of memory. Run here, it must come back
/// (decoded or refused) without a panic.
#[test]
fn crash_inputs_found_by_fuzzing_stay_fixed() {
    let mut replayed = 0;
    for target in TARGETS {
        let dir = regressions_dir().join(target);
        let Ok(files) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = files.map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| run(target, &data));
            assert!(r.is_ok(), "{target}: {} panics again", f.display());
            replayed += 1;
        }
    }
    println!("replayed {replayed} fuzz regression inputs");
}

/// The seeds are real structures made by the engine: each decodes whole
/// through its target, so the fuzzer starts inside the formats.
#[test]
fn every_seed_decodes() {
    let seeds = seeds().unwrap();
    for target in TARGETS {
        let n = seeds.iter().filter(|(t, _)| t == target).count();
        assert!(n > 0, "no seed for {target}");
    }
    for (i, (target, data)) in seeds.iter().enumerate() {
        assert!(run(target, data), "seed {i} of {target} does not decode");
    }
}

/// Writes the seeds to `$FUZZ_SEEDS_DIR/<target>/` (hack/fuzz.sh runs this).
#[test]
#[ignore = "run by hack/fuzz.sh to write the fuzzer's seeds"]
fn write_fuzz_seeds() {
    let dir = PathBuf::from(std::env::var("FUZZ_SEEDS_DIR").expect("FUZZ_SEEDS_DIR is set"));
    for (i, (target, data)) in seeds().unwrap().iter().enumerate() {
        let d = dir.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("seed-{i:03}")), data).unwrap();
    }
}
