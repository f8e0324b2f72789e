"""Revault side by side with the tools users would pick instead (`make bench`, step `peers`;
docs/performance.md, "Beside restic and borg").

On the same series (the kube tars, or the synthetic one when kube is absent), each tool in its
default configuration, all of them interleaved version by version so that they see the same
machine:

1. every version backed up in order, as a stream on stdin (a volume image: restic
   `backup --stdin`, borg `create ... -`, `revault backup -`), timing each and keeping its CPU
   seconds and peak resident memory (wait4's rusage of that one process);
2. the latest version restored to a file, several times interleaved, then compared with `cmp`
   against the tar it came from (a mismatch stops the benchmark);
3. the older half of the versions expired and their space reclaimed (restic `forget --prune`,
   borg `prune` + `compact`, revault `expire` + `gc`), with the repository's size before and
   after.

restic and borg come from Debian's packages (hack/install-peers.sh). restic always encrypts
(AES-256 with Poly1305) and compresses with zstd (repository format 2); borg runs with
`--encryption none` and its default lz4; a local Revault store does not encrypt (its bucket
copies do) and compresses with zstd: the table says so next to the figures.
"""
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

MIB = 1024 * 1024


def run_measured(cmd, stdin=None, stdout=None, env=None):
    """Runs cmd to completion; returns (wall s, CPU s, peak RSS MiB) of that process alone."""
    t0 = time.perf_counter()
    p = subprocess.Popen([str(c) for c in cmd], stdin=stdin, stdout=stdout or subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"bench peers: {' '.join(map(str, cmd))} failed ({p.returncode}):\n{err.decode(errors='replace')}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def tree_bytes(p):
    return sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file())


class Tool:
    """One contender: how it backs up stdin, restores the latest version to stdout, and
    keeps only the newest `keep` versions."""

    def __init__(self, name, repo, env, note):
        self.name, self.repo, self.env, self.note = name, repo, env, note
        self.backups = []  # (wall, cpu, rss) per version
        self.restores = []
        self.expire = None
        self.size_full = self.size_after = 0

    def backup(self, tar, i):
        with open(tar, "rb") as f:
            self.backups.append(run_measured(self.backup_cmd(i), stdin=f, env=self.env))

    def restore(self, out):
        with open(out, "wb") as f:
            self.restores.append(run_measured(self.restore_cmd(), stdout=f, env=self.env))

    def prune(self, keep):
        total = [0.0, 0.0, 0.0]
        for cmd in self.prune_cmds(keep):
            w, c, r = run_measured(cmd, env=self.env)
            total = [total[0] + w, total[1] + c, max(total[2], r)]
        self.expire = tuple(total)


class Revault(Tool):
    def __init__(self, work, bin_path, unit):
        super().__init__(f"revault ({unit})", work / f"peers-revault-{unit}", dict(os.environ),
                         "zstd, not encrypted on local disk" + ("; default mode: segments + reverse dedup"
                                                              if unit == "segment" else "; chunk mode"))
        self.bin, self.unit = bin_path, unit
        run_measured([bin_path, "init", "--store", self.repo], env=self.env)
        # The defaults a new series gets (live window 1, automatic slides) with the unit given.
        run_measured([bin_path, "retention", "set", "--store", self.repo, "--series", "bench/peers",
                      "--live", 1, "--auto"], env=self.env)

    def backup_cmd(self, i):
        return [self.bin, "backup", "--store", self.repo, "--series", "bench/peers", "--unit", self.unit,
                "-q", "-"]

    def restore_cmd(self):
        return [self.bin, "restore", "--store", self.repo, "--series", "bench/peers", "--version", "latest",
                "-q", "-o", "-"]

    def prune_cmds(self, keep):
        return [[self.bin, "retention", "set", "--store", self.repo, "--series", "bench/peers", "--keep", keep],
                [self.bin, "expire", "--store", self.repo, "--series", "bench/peers", "--apply-retention"],
                [self.bin, "gc", "--store", self.repo]]


class Restic(Tool):
    def __init__(self, work):
        env = {**os.environ, "RESTIC_PASSWORD": "revault-bench", "RESTIC_CACHE_DIR": str(work / "peers-restic-cache")}
        super().__init__("restic", work / "peers-restic", env, "zstd (auto), AES-256 + Poly1305 always")
        env["RESTIC_REPOSITORY"] = str(self.repo)
        run_measured(["restic", "init", "-q"], env=env)

    def backup_cmd(self, i):
        return ["restic", "backup", "-q", "--stdin", "--stdin-filename", "volume.tar"]

    def restore_cmd(self):
        return ["restic", "dump", "-q", "latest", "/volume.tar"]

    def prune_cmds(self, keep):
        return [["restic", "forget", "-q", "--keep-last", keep, "--prune"]]


class Borg(Tool):
    def __init__(self, work):
        env = {**os.environ, "BORG_REPO": str(work / "peers-borg"), "BORG_BASE_DIR": str(work / "peers-borg-home"),
               "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes"}
        super().__init__("borg", work / "peers-borg", env, "lz4 (default), --encryption none")
        run_measured(["borg", "init", "--encryption", "none"], env=env)

    def backup_cmd(self, i):
        return ["borg", "create", f"::v{i:03d}", "-"]

    def restore_cmd(self):
        last = subprocess.run(["borg", "list", "--last", "1", "--short"], env=self.env, capture_output=True,
                              text=True, check=True).stdout.split()[-1]
        return ["borg", "extract", "--stdout", f"::{last}"]

    def prune_cmds(self, keep):
        return [["borg", "prune", "--keep-last", keep], ["borg", "compact"]]


def run(log, tars, work, hack, runs, bin_path):
    subprocess.run([hack / "install-peers.sh"], check=True)
    for p in work.glob("peers-*"):
        shutil.rmtree(p, ignore_errors=True)
    tools = [Revault(work, bin_path, "segment"), Revault(work, bin_path, "chunk"), Restic(work), Borg(work)]
    logical = sum(t.stat().st_size for t in tars)
    for i, tar in enumerate(tars):
        # Who goes first rotates, so no tool always meets a cold page cache.
        order = tools[i % len(tools):] + tools[:i % len(tools)]
        for t in order:
            t.backup(tar, i + 1)
        log(f"peers: version {i + 1} backed up by {', '.join(t.name for t in order)}")
    for t in tools:
        t.size_full = tree_bytes(t.repo)
    out = work / "peers-restored"
    for r in range(runs):
        for t in (tools[r % len(tools):] + tools[:r % len(tools)]):
            t.restore(out)
            if subprocess.run(["cmp", "-s", out, tars[-1]]).returncode != 0:
                raise SystemExit(f"bench peers: {t.name} restored the latest version wrong")
    out.unlink(missing_ok=True)
    keep = len(tars) - len(tars) // 2
    for t in tools:
        t.prune(keep)
        t.size_after = tree_bytes(t.repo)
    last = tars[-1].stat().st_size
    res = {"versions": len(tars), "logical_bytes": logical, "last_bytes": last, "runs": runs,
           "kept_after_expiry": keep, "tools": {}}
    for t in tools:
        first, later = t.backups[0], t.backups[1:]
        med = lambda xs: statistics.median(xs)
        res["tools"][t.name] = {
            "config": t.note,
            "first_backup_mb_s": tars[0].stat().st_size / 1e6 / first[0],
            "later_backups_mb_s": sum(x.stat().st_size for x in tars[1:]) / 1e6 / sum(b[0] for b in later),
            "backup_cpu_s": sum(b[1] for b in t.backups),
            "backup_peak_rss_mib": max(b[2] for b in t.backups),
            "restore_latest_mb_s": last / 1e6 / med([r[0] for r in t.restores]),
            "restore_runs_s": [r[0] for r in t.restores],
            "restore_cpu_s": med([r[1] for r in t.restores]),
            "restore_peak_rss_mib": max(r[2] for r in t.restores),
            "repo_mib": t.size_full / MIB,
            "dedup_ratio": logical / max(t.size_full, 1),
            "expire_s": t.expire[0],
            "expire_cpu_s": t.expire[1],
            "expire_peak_rss_mib": t.expire[2],
            "repo_after_expiry_mib": t.size_after / MIB,
        }
        log(f"peers: {t.name}: {res['tools'][t.name]}")
    for p in work.glob("peers-*"):
        shutil.rmtree(p, ignore_errors=True)
    return res


def table(res):
    """docs/performance.md's table of a `run` result."""
    rows = ["| tool (configuration) | later backups MB/s | first backup MB/s | backup CPU s (all versions) | "
            "backup peak RSS MiB | restore latest MB/s (cmp ok) | restore CPU s | repository MiB (logical ÷ repository) | "
            "expire half + reclaim s (CPU s) | repository after MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t in res["tools"].items():
        rows.append(f"| {name} ({t['config']}) | {t['later_backups_mb_s']:.0f} | {t['first_backup_mb_s']:.0f} | "
                    f"{t['backup_cpu_s']:.1f} | {t['backup_peak_rss_mib']:.0f} | {t['restore_latest_mb_s']:.0f} | "
                    f"{t['restore_cpu_s']:.2f} | {t['repo_mib']:.0f} ({t['dedup_ratio']:.1f}×) | "
                    f"{t['expire_s']:.2f} ({t['expire_cpu_s']:.2f}) | {t['repo_after_expiry_mib']:.0f} |")
    return "\n".join(rows)
