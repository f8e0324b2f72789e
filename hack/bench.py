#!/usr/bin/env python3
"""`make bench`: every figure in docs/performance.md and docs/benchmarks.md.

1. criterion: chunking + BLAKE3 per core beside memory-read and BLAKE3
   baselines measured in the same run;
2. wall-clock throughput of the real CLI on the kube series (or the synthetic
   one when kube is absent): `revault backup` of the tenth version into copies
   of a store holding the first nine (a ~99%-duplicate version), and warm
   `revault restore` of the latest version, medians of several runs;
3. the issue's Destor anchor at 2 KiB chunks (chunk mode, chunk mode with
   lbw, segment-rev; latest version at 32 MiB, with and without reuse);
4. `revault-bench schemes` (units x rewrite policies x restore caches, knob
   sweeps, cache memory) on the kube series and on a 20-version synthetic one
   (`revault-bench gen-series`);
5. `revault-bench expire` (expiry cost at 10, 20, 40 versions beside a full
   mark-and-sweep);
6. the durable tier against a real S3 server on loopback (hack/bench_remote.py): backup with
   the remote on vs off, restore from the bucket alone, recover, bucket vs local bytes;
7. the sampled index at scale (`revault-bench index`): segment mode to 100 TiB and chunk
   mode to 10 TiB of logical data (--quick: 10 and 1), with its plots;
8. side by side with restic and borg (hack/bench_peers.py, Debian's packages): backups of
   every version, restore of the latest (checked with cmp), expiring half, repository size,
   CPU seconds and peak memory, interleaved; writes docs/bench/peers.md.

Writes docs/bench/results.json, docs/bench/*.md, *.csv and *.png.
Options: --quick (fewer runs, no sweeps) for a smoke test; --only STEP,... runs some
steps (criterion, throughput, chunk-sizes, anchor, schemes, expire, remote, index, peers) and keeps the others'
results.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("REVAULT_CACHE", Path.home() / ".cache" / "revault"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", CACHE / "target"))
BIN = os.environ.get("REVAULT_BIN", str(TARGET / "x86_64-unknown-linux-gnu" / "release" / "revault"))
# Benchmarks and synthetic series: their own tool (make build-bench).
BENCH_BIN = os.environ.get("REVAULT_BENCH_BIN", str(TARGET / "x86_64-unknown-linux-gnu" / "release" / "revault-bench"))
OUT = ROOT / "docs" / "bench"
WORK = CACHE / "bench-work"
MIB = 1024 * 1024


def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)


def rv(*args, capture=True, exe=BIN):
    try:
        p = subprocess.run([exe, *map(str, args)], capture_output=capture, text=True)
    except FileNotFoundError:
        sys.exit(f"bench: no {Path(exe).name} at {exe}: run make build build-bench")
    if p.returncode != 0:
        sys.exit(f"bench: {Path(exe).name} {' '.join(map(str, args))} failed:\n{p.stderr}")
    return json.loads(p.stdout) if capture and "--json" in args else None


def rvb(*args, capture=True):
    """Runs revault-bench (a benchmark, or gen-series)."""
    return rv(*args, capture=capture, exe=BENCH_BIN)


def timed_cpu(*args):
    """Wall seconds, CPU seconds (user + system) and the JSON report of one revault run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    report = rv(*args)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), report


def criterion():
    log("criterion: chunking and fingerprinting")
    # --workspace, not -p: the same feature set as `make build`, so nothing
    # (RocksDB above all) is rebuilt for the benchmark.
    subprocess.run(["cargo", "bench", "--locked", "--workspace", "--bench", "pipeline", "--", "--noplot"],
                   cwd=ROOT / "worker", check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "CARGO_TARGET_DIR": str(TARGET)})
    out = {}
    base = TARGET / "criterion" / "hot-loop"
    for d in sorted(base.glob("*/*")):
        est = d / "new" / "estimates.json"
        bm = d / "new" / "benchmark.json"
        if not est.exists():
            continue
        mean_ns = json.loads(est.read_text())["mean"]["point_estimate"]
        tp = json.loads(bm.read_text()).get("throughput", {}).get("Bytes", 64 * MIB)
        out[f"{d.parent.name}/{d.name}"] = tp / (mean_ns / 1e9) / 1e9  # GB/s
    return out


def dataset():
    kube = CACHE / "datasets" / "kube"
    tars = sorted(kube.glob("v1.30.*.tar"))
    if len(tars) == 10:
        return "kube", tars
    log("kube series not present (make demo DATA=kube fetches it); using the synthetic series")
    syn = CACHE / "datasets" / "synthetic-demo-v2"
    if not (syn / ".complete").exists():
        rvb("gen-series", "--out", syn, "--versions", 10, capture=False)
        (syn / ".complete").touch()
    return "synthetic", sorted(syn.glob("v*.tar"))


def throughput(name, tars, runs):
    """Backup of the last version into copies of a store holding the others,
    and warm restores of the latest version, per mode."""
    res = {}
    logical = tars[-1].stat().st_size
    for mode in ("segment", "chunk", "segment-rev"):
        unit = "chunk" if mode == "chunk" else "segment"
        base = WORK / f"tp-{mode}"
        shutil.rmtree(base, ignore_errors=True)
        rv("init", "--store", base, "--json")
        series = "bench/tp"
        # Inline dedup alone unless reverse dedup is the mode (a new series slides by default).
        rv("retention", "set", "--store", base, "--series", series, "--live", 1,
           f"--auto={str(mode == 'segment-rev').lower()}", "--json")
        for t in tars[:-1]:
            rv("backup", "--store", base, "--series", series, "--unit", unit, t, "--json")
        backup_s = []
        backup_cpu_s = []
        for i in range(runs):
            trial = WORK / f"tp-{mode}-trial"
            shutil.rmtree(trial, ignore_errors=True)
            shutil.copytree(base, trial)
            subprocess.run(["sync"])
            wall, cpu, backup_report = timed_cpu("backup", "--store", trial, "--series", series, tars[-1], "--json")
            backup_s.append(wall)
            backup_cpu_s.append(cpu)
        last = WORK / f"tp-{mode}-trial"
        restore_s = []
        reports = []
        for i in range(runs + 1):  # the first run warms the page cache
            t0 = time.perf_counter()
            r = rv("restore", "--store", last, "--series", series, "--version", "latest", "-o", "/dev/null", "--json")
            if i > 0:
                restore_s.append(time.perf_counter() - t0)
                reports.append(r)
        stats = rv("stats", "--store", last, "--json")
        res[mode] = {
            "backup_mb_s": logical / 1e6 / statistics.median(backup_s),
            "backup_runs_s": backup_s,
            # CPU seconds per wall second of the backup: how well its stages overlap.
            "backup_cores_used": statistics.median(c / w for c, w in zip(backup_cpu_s, backup_s)),
            "backup_cpu_s": statistics.median(backup_cpu_s),
            # Share of the version whose chunk boundaries came from the previous one.
            "backup_predicted_pct": round(100 * backup_report["predicted_bytes"] / backup_report["logical_bytes"], 1),
            "restore_mb_s": logical / 1e6 / statistics.median(restore_s),
            "restore_runs_s": restore_s,
            "restore_engine_mb_s": statistics.median(r["logical_bytes"] / 1e6 / r["seconds"] for r in reports),
            "speed_factor": reports[-1]["speed_factor"],
            "dedup_ratio": stats["dedup_ratio"],
            "total_ratio": stats["total_ratio"],
        }
        log(f"{name} {mode}: backup {res[mode]['backup_mb_s']:.0f} MB/s, restore {res[mode]['restore_mb_s']:.0f} MB/s")
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(last, ignore_errors=True)
    return res


def chunk_sizes(tars, kibs=(2, 8)):
    """Stored bytes of exact chunk dedup and of segment-rev (after every
    slide) at several average chunk sizes (`revault init --chunk-kib`)."""
    res = {}
    for kib in kibs:
        for mode in ("chunk", "segment-rev"):
            store = WORK / f"cs-{kib}-{mode}"
            shutil.rmtree(store, ignore_errors=True)
            rv("init", "--store", store, "--chunk-kib", kib, "--json")
            series = "bench/cs"
            rv("retention", "set", "--store", store, "--series", series, "--live", 1,
               f"--auto={str(mode == 'segment-rev').lower()}", "--json")
            unit = "chunk" if mode == "chunk" else "segment"
            for t in tars:
                rv("backup", "--store", store, "--series", series, "--unit", unit, t, "--json")
            st = rv("stats", "--store", store, "--json", "--repeats")
            rep = st["repeats"]
            exact = rep["stored_bytes"] - rep["repeat_bytes"]
            res[f"{kib}KiB/{mode}"] = {"dedup_ratio": st["dedup_ratio"], "total_ratio": st["total_ratio"],
                                      "beyond_exact_pct": round(100 * rep["repeat_bytes"] / exact, 2) if exact else 0.0}
            log(f"chunk {kib} KiB {mode}: dedup {st['dedup_ratio']:.2f}x, with compression {st['total_ratio']:.2f}x, "
                f"{res[f'{kib}KiB/{mode}']['beyond_exact_pct']}% stored beyond exact chunk dedup")
            shutil.rmtree(store, ignore_errors=True)
    return res


def anchor(tars):
    """The issue's anchor, measured by Destor on the kube series (exact dedup
    10.77x at speed factor 1.26, CBR 8.19x / 3.85, capping 10.30x / 2.53):
    at 2 KiB chunks, where exact dedup here stores as much as Destor's,
    the dedup ratio and the latest version's speed factor at 32 MiB, with
    the default cache and with an LRU container cache, with and without
    reuse of repeated chunks."""
    res = {}
    configs = (("chunk", "chunk", []), ("chunk-lbw", "chunk", ["--rewrite", "lbw", "--loss", 3]),
               ("segment-rev", "segment", []))
    for name, unit, extra in configs:
        store = WORK / f"anchor-{name}"
        shutil.rmtree(store, ignore_errors=True)
        rv("init", "--store", store, "--chunk-kib", 2, "--json")
        series = "bench/anchor"
        rv("retention", "set", "--store", store, "--series", series, "--live", 1,
           f"--auto={str(name == 'segment-rev').lower()}", "--json")
        for t in tars:
            rv("backup", "--store", store, "--series", series, "--unit", unit, *extra, t, "--json")
        entry = {"dedup_ratio": rv("stats", "--store", store, "--json")["dedup_ratio"]}
        for cache in ("auto", "lru-container"):
            for reuse in (True, False):
                r = rv("restore", "--store", store, "--series", series, "--version", "latest", "--cache", cache,
                       "--cache-mib", 32, "-o", "/dev/null", "--json", *([] if reuse else ["--no-reuse"]))
                key = cache if reuse else f"{cache}/no-reuse"
                entry[key] = {"speed_factor": r["speed_factor"], "container_reads": r["container_reads"],
                              "cache": r["cache"], "reused_mib": round(r["reused_bytes"] / MIB, 1)}
        res[name] = entry
        log(f"anchor {name}: dedup {entry['dedup_ratio']:.2f}x, speed factor {entry['auto']['speed_factor']:.2f} "
            f"(no reuse {entry['auto/no-reuse']['speed_factor']:.2f}), lru-container "
            f"{entry['lru-container']['speed_factor']:.2f}")
        shutil.rmtree(store, ignore_errors=True)
    return res


def schemes(name, series_dir, quick):
    out = OUT / f"schemes-{name}"
    shutil.rmtree(out, ignore_errors=True)
    args = ["schemes", "--series-dir", series_dir, "--out", out]
    if quick:
        args += ["--no-sweep", "--memory", "32"]
    log(f"schemes on {name} (this takes a while)")
    rvb(*args, capture=False)
    return str(out.relative_to(ROOT))


def index_scale(quick):
    """The sampled index as the store grows (docs/benchmarks.md, "The index at scale")."""
    out = OUT / "index"
    shutil.rmtree(out, ignore_errors=True)
    res = {}
    for unit, tib in (("segment", 10 if quick else 100), ("chunk", 1 if quick else 10)):
        log(f"index: {unit} mode to {tib} TiB logical")
        t0 = time.time()
        # Its progress (a line per point) goes to our stderr: the chunk run takes a while.
        p = subprocess.run([BENCH_BIN, "--json", "index", "--unit", unit, "--logical-tib", str(tib), "--out", out, "--work", WORK],
                           stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.exit(f"bench: revault-bench index --unit {unit} failed")
        r = json.loads(p.stdout)
        first, last = r["points"][0], r["points"][-1]
        res[unit] = {"logical_tib": last["logical_tib"], "seconds": round(time.time() - t0),
                     "lookups_last_vs_first": round(last["fingerprints_per_sec"] / first["fingerprints_per_sec"], 2),
                     "index_ram_mib": round(last["index_ram_bytes"] / MIB, 1),
                     "dedup_vs_exact": round(last["dedup_vs_exact"], 4)}
        log(f"index {unit}: {res[unit]}")
    res["dir"] = str(out.relative_to(ROOT))
    return res


STEPS = ("criterion", "throughput", "chunk-sizes", "anchor", "schemes", "expire", "remote", "index", "peers")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(STEPS),
                    help=f"comma-separated steps to run ({', '.join(STEPS)}); "
                         "their results replace those in docs/bench/results.json")
    args = ap.parse_args()
    steps = args.only.split(",")
    unknown = [x for x in steps if x not in STEPS]
    if unknown:
        sys.exit(f"bench: unknown step(s) {', '.join(unknown)}; expected some of {', '.join(STEPS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    results_file = OUT / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results.update({"machine": os.uname().nodename, "cores": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M"),
                    "load_average": os.getloadavg()})
    if "criterion" in steps:
        results["criterion_gb_s"] = criterion()
    name, tars = dataset()
    results["dataset"] = name
    if "throughput" in steps:
        results["throughput"] = throughput(name, tars, 2 if args.quick else 5)
    if "chunk-sizes" in steps:
        results["chunk_sizes"] = chunk_sizes(tars)
    if "anchor" in steps:
        results["anchor"] = anchor(tars)
    if "schemes" in steps:
        results["schemes"] = {name: schemes(name, tars[0].parent, args.quick)}
        # A 20-version synthetic series in the style of RevDedup's SG1.
        syn20 = CACHE / "datasets" / "synthetic-20"
        if not (syn20 / ".complete").exists():
            shutil.rmtree(syn20, ignore_errors=True)
            rvb("gen-series", "--out", syn20, "--versions", 20, "--initial-mib", 64, capture=False)
            (syn20 / ".complete").touch()
        if not args.quick:
            results["schemes"]["synthetic-20"] = schemes("synthetic-20", syn20, False)
    if "expire" in steps:
        log("expiry cost as the store grows")
        exp = OUT / "expire"
        shutil.rmtree(exp, ignore_errors=True)
        rvb("expire", "--out", exp, "--counts", "10,20" if args.quick else "10,20,40", capture=False)
        results["expire"] = str(exp.relative_to(ROOT))
    if "remote" in steps:
        log("the durable tier against a real S3 server")
        import bench_remote
        results["remote"] = bench_remote.run(rv, timed_cpu, log, tars, WORK, ROOT / "hack", 2 if args.quick else 5, BIN)
    if "index" in steps:
        results["index"] = index_scale(args.quick)
    if "peers" in steps:
        log("side by side with restic and borg")
        import bench_peers
        results["peers"] = bench_peers.run(log, tars, WORK, ROOT / "hack", 2 if args.quick else 3, BIN)
        (OUT / "peers.md").write_text(
            f"Made by `python3 hack/bench.py --only peers` on {results['when']} ({name} series, "
            f"{len(tars)} versions, load average {results['load_average'][0]:.1f} at the start):\n\n"
            + bench_peers.table(results["peers"]) + "\n")
    results_file.write_text(json.dumps(results, indent=2))
    shutil.rmtree(WORK, ignore_errors=True)
    log(f"wrote {results_file}")
    print(json.dumps({k: results[k] for k in ("criterion_gb_s", "throughput", "chunk_sizes", "anchor") if k in results},
                     indent=2))


if __name__ == "__main__":
    main()
