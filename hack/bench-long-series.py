#!/usr/bin/env python3
"""A long series through the CLI: metadata tables and open cost per version.

Backs up a synthetic series of many small versions (`revault-bench gen-series`),
one `revault backup` per version into one store, and every tenth version
reports the backup's wall time, the time of `revault list` (an open and a
read: what every CLI command pays to open the store) and the number of
RocksDB table files in the store's metadata. Nothing is asserted; see
docs/architecture.md (Commit protocol) for what the figures show.

    python3 hack/bench-long-series.py [--versions 150] [--mib 8]
"""

import argparse
import glob
import os
import subprocess
import tempfile
import time

CACHE = os.environ.get("REVAULT_CACHE", os.path.expanduser("~/.cache/revault"))
BIN = os.environ.get(
    "REVAULT_BIN", os.path.join(CACHE, "target/x86_64-unknown-linux-gnu/release/revault")
)
BENCH_BIN = os.environ.get(
    "REVAULT_BENCH_BIN", os.path.join(CACHE, "target/x86_64-unknown-linux-gnu/release/revault-bench")
)


def timed(args):
    t = time.perf_counter()
    subprocess.run([BIN] + args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=150)
    ap.add_argument("--mib", type=int, default=8, help="size of the first version")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="revault-long-") as work:
        gen, store = os.path.join(work, "gen"), os.path.join(work, "store")
        subprocess.run([BENCH_BIN, "gen-series", "--out", gen, "--versions", str(a.versions),
                        "--initial-mib", str(a.mib), "--gamma-mib", "0"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([BIN, "init", "--store", store], check=True, stdout=subprocess.DEVNULL)
        files = sorted(glob.glob(os.path.join(gen, "*.tar")))
        print("version  backup ms  list ms  metadata tables")
        for i, f in enumerate(files, 1):
            tb = timed(["backup", "--store", store, "--series", "long/s", f, "-q"])
            tl = timed(["list", "--store", store])
            if i == 1 or i % 10 == 0 or i == len(files):
                tables = len(glob.glob(os.path.join(store, "meta", "*.sst")))
                print(f"{i:7d}  {tb * 1e3:9.0f}  {tl * 1e3:7.1f}  {tables:15d}", flush=True)


if __name__ == "__main__":
    main()
