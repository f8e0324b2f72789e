//! `revault-bench` through the real binary: the synthetic series it writes,
//! its errors, and the files and figures each benchmark produces.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use sha2::{Digest, Sha256};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_revault-bench"))
        .args(args)
        .stdin(Stdio::null())
        .env("REVAULT_LOG", "warn")
        .output()
        .expect("run revault-bench")
}

/// Runs revault-bench with `--json`, asserts success, returns stdout parsed.
fn ok_json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = bench(&a);
    assert!(
        out.status.success(),
        "revault-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn sha256_file(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

/// A small synthetic series of tars in `dir` (3 versions from 1 MiB); the generator's report.
fn small_series(dir: &Path) -> serde_json::Value {
    ok_json(&[
        "gen-series",
        "--out",
        dir.to_str().unwrap(),
        "--versions",
        "3",
        "--initial-mib",
        "1",
        "--gamma-mib",
        "0.1",
    ])
}

#[test]
fn gen_series_writes_the_same_bytes_as_before_it_moved() {
    // docs/benchmarks.md and docs/performance.md (and `make demo`) measure series from this
    // generator, so the same options must keep giving the same bytes. These hashes are of the
    // series `revault gen-series` wrote with these options before the generator moved into
    // this tool.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("series");
    let vs = small_series(&out);
    let vs = vs.as_array().unwrap();
    let files: Vec<u64> = vs.iter().map(|v| v["files"].as_u64().unwrap()).collect();
    let bytes: Vec<u64> = vs.iter().map(|v| v["bytes"].as_u64().unwrap()).collect();
    assert_eq!(files, [53, 66, 82]);
    assert_eq!(bytes, [1048576, 1153433, 1258266]);
    let hashes: Vec<String> = ["v001.tar", "v002.tar", "v003.tar"]
        .iter()
        .map(|f| sha256_file(&out.join(f)))
        .collect();
    assert_eq!(
        hashes,
        [
            "2c8be18c6c3f7e906b4244a3dc6020b18b996060558917802c3dd26c9527867a",
            "cf1f84a2a3d3ea5be75094f113e5cec71f0f1fbaf2cec6a79f42f73992c4b0a8",
            "b02926176bc12b87e0f60552a17c04947cb10cd7e8b89aed280c2fb3608f7d2a",
        ]
    );
}

#[test]
fn gen_series_writes_directories_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("series");
    let vs = ok_json(&[
        "gen-series",
        "--out",
        out.to_str().unwrap(),
        "--versions",
        "2",
        "--initial-mib",
        "0.5",
        "--format",
        "dir",
    ]);
    for (v, name) in vs.as_array().unwrap().iter().zip(["v001", "v002"]) {
        let (mut files, mut bytes) = (0u64, 0u64);
        let mut stack = vec![out.join(name)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files += 1;
                    bytes += p.metadata().unwrap().len();
                }
            }
        }
        assert_eq!(files, v["files"].as_u64().unwrap(), "{name}");
        assert_eq!(bytes, v["bytes"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn gen_series_refuses_bad_options_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("series");
    let o = out.to_str().unwrap();
    let e = bench(&["gen-series", "--out", o, "--format", "zip"]);
    assert!(!e.status.success());
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(
        stderr.contains("--format \"zip\": expected `tar` or `dir`"),
        "{stderr}"
    );
    let e = bench(&["gen-series", "--out", o, "--alpha", "150", "--json"]);
    assert!(!e.status.success());
    let err: serde_json::Value = serde_json::from_slice(&e.stdout).unwrap();
    assert_eq!(err["error"]["code"], "invalid_argument");
    assert_eq!(
        err["error"]["message"],
        "invalid argument: alpha is a percentage (0..100), got 150"
    );
    assert!(!out.exists(), "nothing written for bad options");
}

#[test]
fn schemes_measures_every_scheme_and_writes_its_report_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let series = dir.path().join("series");
    small_series(&series);
    let out = dir.path().join("out");
    let r = ok_json(&[
        "schemes",
        "--series-dir",
        series.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--units",
        "segment,chunk",
        "--policies",
        "none,lbw",
        "--memory",
        "8,16",
    ]);
    let schemes: Vec<&str> = r["stores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(
        schemes,
        ["segment/none", "segment/lbw", "chunk/none", "chunk/lbw"]
    );
    for s in r["stores"].as_array().unwrap() {
        assert!(s["stored_mib"].as_f64().unwrap() > 0.0, "{s}");
        // Three versions that share most of their bytes dedup well by chunk
        // (1 MiB versions are too small for segment dedup to find much).
        if s["scheme"] == "chunk/none" {
            assert!(s["dedup_ratio"].as_f64().unwrap() > 1.5, "{s}");
        }
    }
    // The lbw sweep runs on chunk (the only sweep unit asked for), one row
    // per knob value.
    let knobs = r["knobs"].as_array().unwrap();
    assert_eq!(knobs.len(), 7, "{knobs:?}");
    assert!(knobs
        .iter()
        .all(|k| k["unit"] == "chunk" && k["policy"] == "lbw"));
    // The memory comparison is on chunk/none (caches smaller than a container are skipped).
    let memory = r["memory"].as_array().unwrap();
    assert!(!memory.is_empty());
    assert!(memory.iter().all(|m| m["scheme"] == "chunk/none"));
    for f in [
        "schemes.csv",
        "stores.csv",
        "knobs.csv",
        "memory.csv",
        "report.md",
        "speed_factor_per_version.png",
        "restore_per_version.png",
        "tradeoff.png",
        "memory.png",
    ] {
        let len = std::fs::metadata(out.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{f} written");
    }
    let csv = std::fs::read_to_string(out.join("schemes.csv")).unwrap();
    // A header, then 4 schemes x 3 versions x every cache.
    assert!(
        csv.starts_with("backup_mib_s,cache,container_reads,"),
        "{csv}"
    );
    assert_eq!(
        csv.lines().count() - 1,
        4 * 3 * revault_engine::CachePolicy::ALL.len(),
        "{csv}"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| chunk/lbw |"), "{report}");
    assert!(
        !out.join("stores").exists(),
        "the scratch stores are removed"
    );
}

#[test]
fn schemes_refuses_a_series_of_one_version() {
    let dir = tempfile::tempdir().unwrap();
    let series = dir.path().join("series");
    std::fs::create_dir(&series).unwrap();
    std::fs::write(series.join("v1"), b"only one").unwrap();
    let out = dir.path().join("out");
    let e = bench(&[
        "schemes",
        "--series-dir",
        series.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!e.status.success());
    let stderr = String::from_utf8_lossy(&e.stderr);
    assert!(
        stderr.contains("holds 1 versions; a series needs at least two"),
        "{stderr}"
    );
}

#[test]
fn expire_measures_each_store_size() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let rows = ok_json(&[
        "expire",
        "--out",
        out.to_str().unwrap(),
        "--counts",
        "2,4",
        "--initial-mib",
        "1",
        "--repeat",
        "1",
    ]);
    let rows = rows.as_array().unwrap();
    let versions: Vec<u64> = rows
        .iter()
        .map(|r| r["versions"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [2, 4]);
    for r in rows {
        assert!(r["store_mib"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["full_mark_sweep_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    let csv = std::fs::read_to_string(out.join("expire.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "a header and a row per size: {csv}");
    assert!(out.join("expire.png").metadata().unwrap().len() > 0);
    assert!(
        !out.join("series").exists() && !out.join("store").exists(),
        "the scratch series and store are removed"
    );
}
