"""The durable tier's figures (`make bench`, step `remote`; docs/remote.md, docs/performance.md).

Against a real S3 server on loopback (versitygw, hack/s3-server.sh), on the same dataset as the
throughput step:

1. backup of the last version with the remote on (the CLI returns once the bucket holds it)
   and off, into fresh copies of stores holding the other versions — interleaved off/on, so both
   see the same machine; the remote-on copies get a copy of the bucket too; the first version
   into empty stores, on and off interleaved (every container new); and the same through
   `revault serve` + `revault push`, where the worker acknowledges from local disk and uploads in
   the background (what Kubernetes users run); a 1.5 GB daily version (the kube versions but
   one, shifted by one), on and off interleaved; where the remote-on backup's time goes: the
   sync's steps (its `revault_remote=debug` log) and opening the remote (`revault list` with
   and without one, interleaved);
2. restore of the latest version from a store rebuilt with `recover --lazy`: every container is
   read from the bucket (the container caches read whole containers ahead, one GET each),
   with the GETs it cost (versitygw's request log) and its system time beside a restore with
   transparent huge pages allowed (`MIMALLOC_ALLOW_THP=1`), interleaved;
3. `revault recover` of the whole store (metadata and every container);
4. bytes in the bucket against bytes on local disk.
"""
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

ACCESS, SECRET = "revault-bench", "revault-bench-secret"


def start_s3(hack, work):
    """Starts versitygw on a free loopback port over work/s3; returns (process, endpoint, root)."""
    import socket
    vgw = subprocess.run([str(hack / "s3-server.sh"), "install"], capture_output=True, text=True, check=True).stdout.split()[-1]
    root = work / "s3" / "root"
    shutil.rmtree(work / "s3", ignore_errors=True)
    root.mkdir(parents=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # Its standard output is a line per request: the restores count their GETs there.
    p = subprocess.Popen([vgw, "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "posix", str(root)],
                         stdout=open(work / "s3.requests.log", "w"), stderr=open(work / "s3.log", "w"))
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return p, f"http://127.0.0.1:{port}", root


def data_gets(work):
    """GETs of container objects versitygw has logged so far."""
    with open(work / "s3.requests.log", errors="replace") as f:
        return sum(1 for line in f if "| GET |" in line and "/data/" in line)


def restore_measured(bin_path, args, env):
    """Wall seconds, system CPU seconds and the JSON report of one `revault restore`."""
    t0 = time.perf_counter()
    p = subprocess.Popen([bin_path, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench: revault {' '.join(map(str, args))} failed:\n{err.decode(errors='replace')}")
    return wall, ru.ru_stime, json.loads(out)


def served_push(bin_path, store, series, tar, key):
    """Wall seconds of `revault push` of tar into a `revault serve` over store (its remote, if
    it has one, attached with key); the server is started before and stopped after the clock."""
    import signal
    addr_file = store.parent / f"{store.name}.addr"
    addr_file.unlink(missing_ok=True)
    srv = subprocess.Popen([bin_path, "serve", "--store", str(store), "--listen", "127.0.0.1:0",
                            "--addr-file", str(addr_file), "--key-file", str(key)],
                           stdout=subprocess.DEVNULL, stderr=open(store.parent / f"{store.name}.serve.log", "w"))
    try:
        url = None
        for _ in range(600):
            if addr_file.exists() and addr_file.read_text().strip():
                url = "http://" + addr_file.read_text().strip()
                break
            time.sleep(0.05)
        assert url, f"revault serve over {store} did not start"
        t0 = time.perf_counter()
        subprocess.run([bin_path, "push", "--server", url, "--series", series, str(tar), "--json", "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=120)


def tree_bytes(p):
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


def set_remote_prefix(store, bucket, prefix):
    """Points a copied store at a copied prefix (objects are sealed under their names relative
    to the prefix, so a copied prefix opens as the original)."""
    conf = store / "remote" / "remote.json"
    c = json.loads(conf.read_text())
    c["url"] = {"bucket": bucket, "prefix": prefix}
    conf.write_text(json.dumps(c))


def run(rv, timed_cpu, log, tars, work, hack, runs, bin_path):
    env_before = dict(os.environ)
    s3, endpoint, s3root = start_s3(hack, work)
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"})
    try:
        return measure(rv, timed_cpu, log, tars, work, runs, s3root, bin_path, s3.pid)
    finally:
        s3.terminate()
        s3.wait()
        os.environ.clear()
        os.environ.update(env_before)


def sync_step_ms(log_text):
    """The sync's step times (ms) from a command's `revault_remote=debug` log: the checkpoint,
    the upload and publication of the head (its times count from the step's start, so the last
    one is the step's), and the deletions."""
    import re
    text = re.sub(r"\x1b\[[0-9;]*m", "", log_text)
    out = {}
    for key, msg in (("checkpoint", "sync: checkpoint taken"), ("publish", "sync: head published"),
                     ("deletions", "sync: deletions done")):
        found = re.findall(re.escape(msg) + r"\s+ms=(\d+)", text)
        if found:
            out[key] = int(found[-1])
    return out


def cpu_seconds(pid):
    """User + system CPU seconds process `pid` has used so far (the S3 server's share of a run)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def base_store(rv, work, name, mode, bucket, key, series, inputs):
    """A store `remote-NAME-MODE` holding `inputs` as versions of `series` (live window 1,
    automatic slides); with mode "on", its remote is `s3://BUCKET/NAME-base`. Returns the
    store and the seconds its backups took."""
    base = work / f"remote-{name}-{mode}"
    shutil.rmtree(base, ignore_errors=True)
    extra = ["--remote", f"s3://{bucket}/{name}-base", "--key-file", key] if mode == "on" else []
    rv("init", "--store", base, *extra, "--json")
    rv("retention", "set", "--store", base, "--series", series, "--live", 1, "--auto", "--json")
    t0 = time.perf_counter()
    for t in inputs:
        rv("backup", "--store", base, "--series", series, t, "--json")
    return base, time.perf_counter() - t0


def large_version(rv, timed_cpu, tars, work, runs, key, bucket, series, fresh_copy, s3root, s3_pid):
    """A daily backup of a larger volume: every kube version but the last, one after another
    in one stream, then every version but the first (the same bytes shifted by one version, a
    new one at the end). Whether the remote's cost is the command's fixed cost (opening it,
    the checkpoint, the head), which 1.5 GB would hide, or grows with the backup."""
    a, b = work / "remote-large-a.bin", work / "remote-large-b.bin"
    for out, parts in ((a, tars[:-1]), (b, tars[1:])):
        with open(out, "wb") as f:
            for t in parts:
                with open(t, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 22)
    bases = {m: base_store(rv, work, "large", m, bucket, key, series, [a])[0] for m in ("off", "on")}
    out = {"off": [], "on": [], "bytes": b.stat().st_size, "cpu": {"off": [], "on": []}, "s3_cpu": []}
    for i in range(runs):
        for mode in ("off", "on"):
            trial = fresh_copy(mode, "large", i, src=bases[mode], src_prefix="large-base")
            s3_before = cpu_seconds(s3_pid)
            wall, cpu, rep = timed_cpu("backup", "--store", trial, "--series", series, b, "--json")
            out[mode].append(wall)
            out["cpu"][mode].append(cpu)
            if mode == "on":
                out["s3_cpu"].append(cpu_seconds(s3_pid) - s3_before)
            # What the backup and its slide wrote (the same on and off).
            out["written"] = {"backup_container_bytes": rep["new_container_bytes"],
                              "slide_bytes": (rep.get("slide") or {}).get("bytes_written", 0)}
            shutil.rmtree(trial, ignore_errors=True)
            shutil.rmtree(s3root / bucket / f"large{i}", ignore_errors=True)
    for p in (a, b, *bases.values()):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return out


def measure(rv, timed_cpu, log, tars, work, runs, s3root, bin_path, s3_pid):
    series = "bench/remote"
    key = work / "remote-key"
    key.unlink(missing_ok=True)
    bucket = "revault-bench"
    stores = {m: base_store(rv, work, "kube", m, bucket, key, series, tars[:-1]) for m in ("off", "on")}
    logical = tars[-1].stat().st_size
    backup = {"off": [], "on": []}
    cpu = {"off": [], "on": []}
    def fresh_copy(mode, kind, i, src=None, src_prefix="kube-base"):
        """A copy of the mode's store holding the first versions (or of `src`); with the remote
        on, over a copy of its bucket prefix (so every run uploads the same change)."""
        trial = work / f"remote-{mode}-{kind}"
        shutil.rmtree(trial, ignore_errors=True)
        shutil.copytree(src or stores[mode][0], trial)
        if mode == "on":
            dst = s3root / bucket / f"{kind}{i}"
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run(["cp", "-a", str(s3root / bucket / src_prefix), str(dst)], check=True)
            set_remote_prefix(trial, bucket, f"{kind}{i}")
        subprocess.run(["sync"])
        return trial

    for i in range(runs):
        for mode in ("off", "on"):
            trial = fresh_copy(mode, "trial", i)
            wall, c, _ = timed_cpu("backup", "--store", trial, "--series", series, tars[-1], "--json")
            backup[mode].append(wall)
            cpu[mode].append(c)
    # Where the remote-on backup's extra time goes: the sync's steps, from its debug log, and
    # opening the remote (`revault list` on the same store with and without one, interleaved).
    sync_steps = {"checkpoint": [], "publish": [], "deletions": []}
    for i in range(runs):
        trial = fresh_copy("on", "steps", i)
        env = {**os.environ, "REVAULT_LOG": "revault_remote=debug", "NO_COLOR": "1"}
        p = subprocess.run([bin_path, "backup", "--store", str(trial), "--series", series, str(tars[-1])],
                           capture_output=True, text=True, env=env, check=True)
        for step, ms in sync_step_ms(p.stderr).items():
            sync_steps[step].append(ms)
    open_ms = {"off": [], "on": []}
    for _ in range(2 * runs):
        for mode in ("off", "on"):
            t0 = time.perf_counter()
            rv("list", "--store", stores[mode][0])
            open_ms[mode].append((time.perf_counter() - t0) * 1000)
    # The first version into an empty store: every container is new, so this is where
    # uploading containers while the backup runs (rather than after it) counts most.
    first = {"off": [], "on": []}
    first_cpu = {"off": [], "on": []}
    first_s3_cpu = []
    for i in range(runs):
        for mode in ("off", "on"):
            empty = work / f"remote-{mode}-first"
            shutil.rmtree(empty, ignore_errors=True)
            shutil.rmtree(s3root / bucket / f"first{i}", ignore_errors=True)
            extra = ["--remote", f"s3://{bucket}/first{i}", "--key-file", key] if mode == "on" else []
            rv("init", "--store", empty, *extra, "--json")
            subprocess.run(["sync"])
            s3_before = cpu_seconds(s3_pid)
            wall, c, _ = timed_cpu("backup", "--store", empty, "--series", series, tars[0], "--json")
            first[mode].append(wall)
            first_cpu[mode].append(c)
            if mode == "on":
                first_s3_cpu.append(cpu_seconds(s3_pid) - s3_before)
            shutil.rmtree(empty, ignore_errors=True)
    large = large_version(rv, timed_cpu, tars, work, runs, key, bucket, series, fresh_copy, s3root, s3_pid)
    served = {"off": [], "on": []}
    for i in range(runs):
        for mode in ("off", "on"):
            trial = fresh_copy(mode, "served", i)
            served[mode].append(served_push(bin_path, trial, series, tars[-1], key))
            shutil.rmtree(trial, ignore_errors=True)
    on_store = work / "remote-on-trial"
    prefix = f"trial{runs - 1}"
    url = f"s3://{bucket}/{prefix}"
    bucket_bytes = tree_bytes(s3root / bucket / prefix)
    local_data = tree_bytes(on_store / "data")
    local_meta = tree_bytes(on_store / "meta")
    # A store rebuilt with --lazy has no container on local disk: its restores read the bucket.
    restores, sys_s, gets = [], {"off": [], "on": []}, []
    env_thp = {**os.environ, "MIMALLOC_ALLOW_THP": "1"}
    env_default = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ALLOW_THP"}
    for i in range(runs + 1):
        for thp in ("off", "on"):
            lazy = work / f"remote-lazy{i}"
            shutil.rmtree(lazy, ignore_errors=True)
            rv("recover", "--remote", url, "--key-file", key, "--store", lazy, "--lazy", "--json")
            assert tree_bytes(lazy / "data") == 0, "a lazy recovery downloaded containers"
            before = data_gets(work)
            wall, sys, r = restore_measured(bin_path, ["restore", "--store", lazy, "--series", series, "--version",
                                                       "latest", "-o", "/dev/null", "--json"],
                                            env_thp if thp == "on" else env_default)
            if i > 0:  # the first ones warm the S3 server's page cache
                sys_s[thp].append(sys)
                if thp == "off":
                    restores.append((wall, r))
                    gets.append((data_gets(work) - before) / r["container_reads"])
            shutil.rmtree(lazy, ignore_errors=True)
    full = work / "remote-full"
    shutil.rmtree(full, ignore_errors=True)
    t0 = time.perf_counter()
    rep = rv("recover", "--remote", url, "--key-file", key, "--store", full, "--json")
    recover_s = time.perf_counter() - t0
    check = rv("check", "--store", full, "--json")
    med = statistics.median
    res = {
        "dataset_versions": len(tars),
        "logical_bytes_last": logical,
        "backup_off_mb_s": logical / 1e6 / med(backup["off"]),
        "backup_on_mb_s": logical / 1e6 / med(backup["on"]),
        "backup_on_vs_off": med(backup["off"]) / med(backup["on"]),
        "backup_runs_s": backup,
        "logical_bytes_first": tars[0].stat().st_size,
        "first_backup_off_mb_s": tars[0].stat().st_size / 1e6 / med(first["off"]),
        "first_backup_on_mb_s": tars[0].stat().st_size / 1e6 / med(first["on"]),
        "first_backup_on_vs_off": med(first["off"]) / med(first["on"]),
        "first_backup_runs_s": first,
        "first_backup_cpu_s": {m: med(v) for m, v in first_cpu.items()},
        "logical_bytes_large": large["bytes"],
        "large_backup_off_mb_s": large["bytes"] / 1e6 / med(large["off"]),
        "large_backup_on_mb_s": large["bytes"] / 1e6 / med(large["on"]),
        "large_backup_on_vs_off": med(large["off"]) / med(large["on"]),
        "large_backup_runs_s": {m: large[m] for m in ("off", "on")},
        "large_backup_cpu_s": {m: med(v) for m, v in large["cpu"].items()},
        "large_backup_s3_server_cpu_s": med(large["s3_cpu"]),
        "large_backup_written": large["written"],
        "sync_step_ms": {k: med(v) for k, v in sync_steps.items() if v},
        "open_list_ms": {m: med(v) for m, v in open_ms.items()},
        "first_backup_s3_server_cpu_s": med(first_s3_cpu),
        "served_push_off_mb_s": logical / 1e6 / med(served["off"]),
        "served_push_on_mb_s": logical / 1e6 / med(served["on"]),
        "served_push_on_vs_off": med(served["off"]) / med(served["on"]),
        "served_push_runs_s": served,
        "backup_cpu_s": {m: med(v) for m, v in cpu.items()},
        "first_versions_s": {m: s for m, (_, s) in stores.items()},
        "restore_from_bucket_mb_s": logical / 1e6 / med(t for t, _ in restores),
        "restore_from_bucket_engine_mb_s": med(r["logical_bytes"] / 1e6 / r["seconds"] for _, r in restores),
        "restore_from_bucket_runs_s": [t for t, _ in restores],
        "restore_container_reads": restores[-1][1]["container_reads"],
        "restore_gets_per_container_read": med(gets),
        "restore_system_s": {thp: med(v) for thp, v in sys_s.items()},
        "restore_system_runs_s": sys_s,
        "recover_s": recover_s,
        "recover_containers": rep["containers"],
        "recover_container_bytes": rep["containerBytesDownloaded"],
        "recover_check_ok": check["ok"],
        "bucket_bytes": bucket_bytes,
        "local_data_bytes": local_data,
        "local_meta_bytes": local_meta,
        "bucket_vs_local": bucket_bytes / (local_data + local_meta),
    }
    log(f"remote: backup off {res['backup_off_mb_s']:.0f} MB/s, on {res['backup_on_mb_s']:.0f} MB/s "
        f"(on/off time {1 / res['backup_on_vs_off']:.2f}); first backup off {res['first_backup_off_mb_s']:.0f}, "
        f"on {res['first_backup_on_mb_s']:.0f} MB/s (CPU s off {res['first_backup_cpu_s']['off']:.2f}, on "
        f"{res['first_backup_cpu_s']['on']:.2f}, the S3 server {res['first_backup_s3_server_cpu_s']:.2f}); "
        f"large version ({res['logical_bytes_large'] / 1e9:.1f} GB) off {res['large_backup_off_mb_s']:.0f}, "
        f"on {res['large_backup_on_mb_s']:.0f} MB/s (on/off time {1 / res['large_backup_on_vs_off']:.2f}; CPU s off "
        f"{res['large_backup_cpu_s']['off']:.2f}, on {res['large_backup_cpu_s']['on']:.2f}, the S3 server "
        f"{res['large_backup_s3_server_cpu_s']:.2f}; wrote {res['large_backup_written']}); "
        f"sync steps ms {res['sync_step_ms']}; `revault list` ms {res['open_list_ms']}; served push off {res['served_push_off_mb_s']:.0f}, "
        f"on {res['served_push_on_mb_s']:.0f} MB/s; restore from the bucket {res['restore_from_bucket_mb_s']:.0f} MB/s "
        f"({res['restore_gets_per_container_read']:.1f} GETs per container read; system s {res['restore_system_s']['off']:.2f}, "
        f"with huge pages {res['restore_system_s']['on']:.2f}); "
        f"recover {recover_s:.1f} s; bucket {bucket_bytes / 2**20:.0f} MiB vs local {(local_data + local_meta) / 2**20:.0f} MiB")
    for p in work.glob("remote-*"):
        shutil.rmtree(p, ignore_errors=True)
    return res
