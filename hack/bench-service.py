#!/usr/bin/env python3
"""Service figures: push/pull over loopback vs the offline CLI, and a load run.

1. Throughput: the same version files are backed up and restored with the
   offline CLI (`revault backup` / `revault restore`, local store) and with
   the service (`revault push` / `revault pull` against `revault serve` on
   127.0.0.1), each restore written to /dev/null through stdout. Reported:
   MiB/s of each and the service's share of the offline figure, and the CPU
   seconds of the offline runs against those of the server and of the
   `revault push`/`revault pull` processes (where the service's extra work
   goes).
2. Load: 8 concurrent pushes and 8 concurrent pulls of different series for
   several rounds, while one thread polls GET /v1/series/{ns}/{name}/versions;
   reported: the p50/p99 listing latency and the server's peak RSS (VmHWM).
3. Backup slots (--slots, run alone): 8 pushes of different series started
   together, against a server that runs them all at once (--max-backups 8)
   and ones that run 4 (the default) and 2 at a time, alternating repetition
   by repetition;
   reported: when the first, the median and the last push finished, and the
   server's peak RSS.
4. Dedup domains (--domains, run alone): every version pushed in turn into
   one series in each of N namespaces, against a server with
   --dedup-domain store and one with namespace, alternating repetition by
   repetition; reported: push MiB/s of the later versions (all but each
   series' first), and what each store holds on disk. With 1 namespace the
   two modes store the same: the difference is the cost of the domain
   lookups; with 4 namespaces holding the same data, namespace mode stores
   and compresses each namespace's changes itself.

Data: the kube tars in $REVAULT_CACHE/datasets/kube if present (make demo
DATA=kube fetches them), else a synthetic series from `revault-bench gen-series`
($REVAULT_BENCH_BIN; make build-bench).
Nothing is asserted; the numbers go to docs/service.md. Loopback only.

    python3 hack/bench-service.py [--versions 5] [--rounds 3] [--reps 3] [--json]
    python3 hack/bench-service.py --slots [--reps 3]
    python3 hack/bench-service.py --domains [--reps 3] [--versions 5]
"""

import argparse
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CACHE = os.environ.get("REVAULT_CACHE", os.path.expanduser("~/.cache/revault"))
BIN = os.environ.get(
    "REVAULT_BIN", os.path.join(CACHE, "target/x86_64-unknown-linux-gnu/release/revault")
)
BENCH_BIN = os.environ.get(
    "REVAULT_BENCH_BIN", os.path.join(CACHE, "target/x86_64-unknown-linux-gnu/release/revault-bench")
)
MIB = 1 << 20


def run(args, **kw):
    return subprocess.run([BIN] + args, check=True, **kw)


def timed(args, **kw):
    t = time.perf_counter()
    run(args, **kw)
    return time.perf_counter() - t


def children_cpu():
    """CPU seconds (user + system) of every finished child so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def process_cpu(pid):
    """CPU seconds (user + system) of a running process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_cpu(cpu, key, args, server=None, **kw):
    """`timed(args)`, adding the run's CPU seconds to cpu[key] (offline), or
    to cpu[key + "_client"] and cpu[key + "_server"] against `server`."""
    c = children_cpu()
    s = process_cpu(server.p.pid) if server else 0.0
    t = timed(args, **kw)
    if server is None:
        cpu[key] += children_cpu() - c
        return t
    cpu[key + "_client"] += children_cpu() - c
    # The server's clock ticks are 10 ms: a short wait lets the last of the
    # response's work be counted.
    time.sleep(0.05)
    cpu[key + "_server"] += process_cpu(server.p.pid) - s
    return t


def dataset(work, versions):
    kube = sorted(glob.glob(os.path.join(CACHE, "datasets/kube/*.tar")))
    if len(kube) >= versions:
        return "kube", kube[:versions]
    out = os.path.join(work, "gen")
    subprocess.run([BENCH_BIN, "gen-series", "--out", out, "--versions", str(versions), "--initial-mib", "100"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return "synthetic", sorted(glob.glob(os.path.join(out, "*.tar")))


class Server:
    def __init__(self, work, store, extra=()):
        addr_file = os.path.join(work, "addr")
        self.log = open(os.path.join(work, "serve.log"), "w")
        self.p = subprocess.Popen(
            [BIN, "serve", "--store", store, "--init", "--listen", "127.0.0.1:0",
             "--addr-file", addr_file, "--maintenance-interval", "0", *extra],
            stdout=subprocess.DEVNULL, stderr=self.log, env={**os.environ, "REVAULT_LOG": "warn"})
        for _ in range(300):
            if os.path.exists(addr_file):
                self.addr = open(addr_file).read().strip()
                try:
                    if urllib.request.urlopen(f"http://{self.addr}/readyz", timeout=2).status == 200:
                        break
                except Exception:
                    pass
            time.sleep(0.05)
        else:
            raise SystemExit("revault serve did not start")
        self.url = f"http://{self.addr}"

    def hwm_mib(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(timeout=60)


def throughput(work, files, reps, transfer="blocks"):
    """Offline and service runs alternate version by version, and each figure
    is the best of `reps` repetitions (fresh stores for backups), so a busy
    machine (other builds, other tests) biases neither side."""
    total = sum(os.path.getsize(f) for f in files)
    b_off, b_srv, r_off, r_srv = [], [], [], []
    cpu = {k: 0.0 for k in ("backup", "push_server", "push_client", "restore", "pull_server", "pull_client")}
    for rep in range(reps):
        off = os.path.join(work, f"offline-{rep}")
        run(["init", "--store", off], stdout=subprocess.DEVNULL)
        srv = Server(work, os.path.join(work, f"served-{rep}"))
        try:
            tb_off = tb_srv = 0.0
            for f in files:
                tb_off += timed_cpu(cpu, "backup", ["backup", "--store", off, "--series", "bench/s", f, "-q"],
                                    stdout=subprocess.DEVNULL)
                tb_srv += timed_cpu(cpu, "push", ["push", "--server", srv.url, "--series", "bench/s", f, "-q"],
                                    server=srv, stdout=subprocess.DEVNULL)
            b_off.append(tb_off)
            b_srv.append(tb_srv)
            tr_off = tr_srv = 0.0
            for i in range(len(files)):
                tr_off += timed_cpu(cpu, "restore", ["restore", "--store", off, "--series", "bench/s", "--version",
                                                     str(i + 1), "-o", "-", "-q"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                tr_srv += timed_cpu(cpu, "pull", ["pull", "--server", srv.url, "--series", "bench/s", "--version",
                                                  str(i + 1), "-q", "--transfer", transfer],
                                    server=srv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            r_off.append(tr_off)
            r_srv.append(tr_srv)
        finally:
            srv.stop()
        shutil.rmtree(off, ignore_errors=True)
        shutil.rmtree(os.path.join(work, f"served-{rep}"), ignore_errors=True)
    mb = total / MIB
    b_off, b_srv, r_off, r_srv = min(b_off), min(b_srv), min(r_off), min(r_srv)
    return {
        "logical_mib": round(mb, 1),
        "repetitions": reps,
        "backup_offline_mibs": round(mb / b_off, 1),
        "push_mibs": round(mb / b_srv, 1),
        "push_vs_offline": round(b_off / b_srv, 3),
        "pull_transfer": transfer,
        "restore_offline_mibs": round(mb / r_off, 1),
        "pull_mibs": round(mb / r_srv, 1),
        "pull_vs_offline": round(r_off / r_srv, 3),
        # CPU seconds over all repetitions: where the service's extra work goes.
        "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
    }


def load(work, files, rounds, width=8):
    # All pushes at once (no backup slots), as before slots existed: the load, not the queue.
    srv = Server(work, os.path.join(work, "load"), ["--max-backups", "0"])
    stop = threading.Event()
    lat = []
    errors = []

    def lister():
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            try:
                urllib.request.urlopen(f"{srv.url}/v1/series/load/s{i % width}/versions", timeout=30).read()
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    errors.append(f"listing: {e}")
            lat.append(time.perf_counter() - t)
            i += 1
            time.sleep(0.01)

    def job(args):
        try:
            run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError as e:
            errors.append(str(e))

    th = threading.Thread(target=lister)
    th.start()
    started = time.perf_counter()
    moved = 0
    try:
        for r in range(rounds):
            jobs = []
            for s in range(width):
                f = files[(r + s) % len(files)]
                moved += os.path.getsize(f)
                jobs.append(threading.Thread(target=job, args=(
                    ["push", "--server", srv.url, "--series", f"load/s{s}", f, "-q"],)))
                if r > 0:
                    jobs.append(threading.Thread(target=job, args=(
                        ["pull", "--server", srv.url, "--series", f"load/s{(s + 3) % width}",
                         "--version", str(r), "-q"],)))
                    moved += os.path.getsize(files[(r - 1 + (s + 3) % width) % len(files)])
            for j in jobs:
                j.start()
            for j in jobs:
                j.join()
    finally:
        stop.set()
        th.join()
        secs = time.perf_counter() - started
        hwm = srv.hwm_mib()
        srv.stop()
    lat.sort()
    pick = lambda q: lat[min(len(lat) - 1, int(len(lat) * q))] * 1e3
    return {
        "rounds": rounds,
        "concurrent_pushes": width,
        "concurrent_pulls": width,
        "moved_mib": round(moved / MIB, 1),
        "seconds": round(secs, 1),
        "aggregate_mibs": round(moved / MIB / secs, 1),
        "server_peak_rss_mib": round(hwm, 1),
        "listing_requests": len(lat),
        "listing_p50_ms": round(pick(0.50), 2),
        "listing_p99_ms": round(pick(0.99), 2),
        "errors": errors,
    }


def slots(work, files, reps, width=8, limits=(8, 4, 2)):
    """Finish times of `width` pushes started together under each backup-slot limit."""
    runs = {n: {"first": [], "median": [], "last": [], "rss": []} for n in limits}
    errors = []
    for rep in range(reps):
        for n in limits:
            store = os.path.join(work, f"slots-{n}-{rep}")
            srv = Server(work, store, ["--max-backups", str(n)])
            done = []
            started = time.perf_counter()

            def push(i):
                try:
                    run(["push", "--server", srv.url, "--series", f"slots/s{i}", files[i % len(files)], "-q"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    done.append(time.perf_counter() - started)
                except subprocess.CalledProcessError as e:
                    errors.append(str(e))

            ths = [threading.Thread(target=push, args=(i,)) for i in range(width)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            runs[n]["rss"].append(srv.hwm_mib())
            srv.stop()
            shutil.rmtree(store, ignore_errors=True)
            done.sort()
            if done:
                runs[n]["first"].append(done[0])
                runs[n]["median"].append(done[len(done) // 2])
                runs[n]["last"].append(done[-1])
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    mib = sum(os.path.getsize(files[i % len(files)]) for i in range(width)) / MIB
    return {
        "pushes": width, "mib": round(mib, 1), "repetitions": reps, "errors": errors,
        "limits": {n: {k: round(med(v), 2) for k, v in r.items()} for n, r in runs.items()},
    }


def domains(work, files, reps, namespaces=4):
    """Later-version push speed and stored bytes, store vs namespace dedup domains."""
    runs = {m: {"later_s": [], "stored": []} for m in ("store", "namespace")}
    for rep in range(reps):
        for mode in runs:
            store = os.path.join(work, f"domains-{mode}-{rep}")
            srv = Server(work, store, ["--dedup-domain", mode])
            later = 0.0
            for f in files:
                for n in range(namespaces):
                    t = time.perf_counter()
                    run(["push", "--server", srv.url, "--series", f"ns{n}/db", f, "-q"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    if f is not files[0]:
                        later += time.perf_counter() - t
            with urllib.request.urlopen(f"{srv.url}/v1/stats", timeout=30) as r:
                runs[mode]["stored"].append(json.load(r)["containerBytes"])
            srv.stop()
            shutil.rmtree(store, ignore_errors=True)
            runs[mode]["later_s"].append(later)
    later_mib = namespaces * sum(os.path.getsize(f) for f in files[1:]) / MIB
    out = {"namespaces": namespaces, "versions": len(files), "repetitions": reps}
    for mode, r in runs.items():
        out[mode] = {"later_push_mibs": round(later_mib / min(r["later_s"]), 1),
                     "stored_mib": round(min(r["stored"]) / MIB, 1)}
    out["namespace_vs_store_speed"] = round(out["namespace"]["later_push_mibs"] / out["store"]["later_push_mibs"], 3)
    out["namespace_vs_store_stored"] = round(out["namespace"]["stored_mib"] / out["store"]["stored_mib"], 3)
    return out


def print_domains(d):
    print(f"dedup domains: {d['versions']} versions into a series in each of {d['namespaces']} namespaces, "
          f"best of {d['repetitions']} alternating repetitions")
    for mode in ("store", "namespace"):
        print(f"  --dedup-domain {mode:9s}: later versions pushed at {d[mode]['later_push_mibs']:7.1f} MiB/s, "
              f"{d[mode]['stored_mib']:7.1f} MiB on disk")
    print(f"  namespace / store: speed {d['namespace_vs_store_speed']:.3f}, stored {d['namespace_vs_store_stored']:.3f}")


def print_slots(s):
    print(f"backup slots: {s['pushes']} pushes started together, {s['mib']} MiB in all, "
          f"medians of {s['repetitions']} alternating repetitions")
    for n, r in s["limits"].items():
        print(f"  --max-backups {n}: first done {r['first']:6.2f} s, median {r['median']:6.2f} s, "
              f"last {r['last']:6.2f} s; server peak RSS {r['rss']:.0f} MiB")
    ns = sorted(s["limits"], reverse=True)
    a = s["limits"][ns[0]]
    for n in ns[1:]:
        b = s["limits"][n]
        print(f"  --max-backups {n} / {ns[0]}: first {b['first'] / a['first']:.2f}, median "
              f"{b['median'] / a['median']:.2f}, last {b['last'] / a['last']:.2f}, peak RSS {b['rss'] / a['rss']:.2f}")
    if s["errors"]:
        print("errors:", *s["errors"], sep="\n  ", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the throughput runs (best is kept)")
    ap.add_argument("--transfer", choices=("blocks", "bytes"), default="blocks",
                    help="how pulls receive the version (revault pull --transfer)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--slots", action="store_true", help="only the backup-slots comparison")
    ap.add_argument("--domains", action="store_true", help="only the dedup-domains comparison")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        raise SystemExit(f"{BIN} not found: run `make build` first")
    work = tempfile.mkdtemp(prefix="revault-bench-service-")
    try:
        name, files = dataset(work, a.versions)
        if a.domains:
            ds = [domains(work, files, a.reps, n) for n in (1, 4)]
            if a.json:
                print(json.dumps({"dataset": name, "domains": ds}, indent=2))
            else:
                print(f"dataset {name}")
                for d in ds:
                    print_domains(d)
            return
        if a.slots:
            s = slots(work, files, a.reps)
            if a.json:
                print(json.dumps({"dataset": name, "slots": s}, indent=2))
            else:
                print(f"dataset {name}")
                print_slots(s)
            return
        t = throughput(work, files, a.reps, a.transfer)
        l = load(work, files, a.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"dataset": name, "versions": len(files), "throughput": t, "load": l}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"dataset {name}: {len(files)} versions, {t['logical_mib']} MiB")
    print(f"backup   offline {t['backup_offline_mibs']:8.1f} MiB/s   push {t['push_mibs']:8.1f} MiB/s   "
          f"({100 * t['push_vs_offline']:.0f}% of offline)")
    print(f"restore  offline {t['restore_offline_mibs']:8.1f} MiB/s   pull {t['pull_mibs']:8.1f} MiB/s   "
          f"({100 * t['pull_vs_offline']:.0f}% of offline)")
    c = t["cpu_s"]
    for off, srv in (("backup", "push"), ("restore", "pull")):
        print(f"CPU seconds: {off} {c[off]:.2f}; {srv}: server {c[srv + '_server']:.2f} "
              f"({100 * c[srv + '_server'] / c[off]:.0f}%) + client {c[srv + '_client']:.2f} "
              f"({100 * c[srv + '_client'] / c[off]:.0f}%)")
    print(f"load: {l['rounds']} rounds of {l['concurrent_pushes']} pushes + {l['concurrent_pulls']} pulls, "
          f"{l['moved_mib']} MiB in {l['seconds']}s ({l['aggregate_mibs']} MiB/s); server peak RSS "
          f"{l['server_peak_rss_mib']} MiB; GET versions p50 {l['listing_p50_ms']} ms, "
          f"p99 {l['listing_p99_ms']} ms over {l['listing_requests']} requests")
    if l["errors"]:
        print("errors:", *l["errors"], sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
