//! Power loss: after a cut only what was fsynced survives, and still nothing
//! acknowledged is lost.
//!
//! SIGKILL (`crash.rs`, `crash_maintenance.rs`) keeps the page cache, so it
//! never tests what the store fsyncs or in which order. Here the real binary
//! runs a workload once on faultfs (a FUSE filesystem that logs every change,
//! `worker/faultfs`), recording where in the log each command was
//! acknowledged. Then, for hundreds of cuts across every command, the files a
//! power cut there would leave (a file's bytes as of its last fsync, a
//! directory's entries as of its last fsync, nothing else) are written into a
//! plain directory and checked with the real binary: `check` is clean before
//! and after the first read-write open (which recovers unfinished sessions),
//! every version acknowledged before the cut is listed and restores
//! byte-exact, a version whose expiry was acknowledged is gone, a slide that
//! was acknowledged stays done, no version appears that was never backed up,
//! and after `gc` no file is left that no record names.
//!
//! The surviving state changes only at a sync, so the cuts are the points
//! right after syncs and the acknowledgements (a cut between two syncs leaves
//! what a cut right after the first one leaves). By default the test takes
//! every acknowledgement, every sync of the engine's own files (containers,
//! their directories, the marker) and of RocksDB's log (each synced write: the
//! session records and the commits), and a fixed sample of RocksDB's other
//! syncs (tables, manifest, its directory) up to `CUT_BUDGET` cuts in all.
//! `REVAULT_POWER_LOSS_CUTS=all` takes every sync; a number sets the budget.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use common::*;
use faultfs::{Mount, Op, Recording};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Cuts checked by default: about 0.35 s each with two at a time.
const CUT_BUDGET: usize = 300;
const SEG: &str = "default/seg";
const CHK: &str = "default/chk";

/// What a command changed, once it was acknowledged.
enum Effect {
    Init,
    Backup {
        series: &'static str,
        version: u64,
        sha: String,
    },
    Slide {
        series: &'static str,
        slid: Vec<u64>,
    },
    Expire {
        series: &'static str,
        expired: Vec<u64>,
    },
    Gc,
}

/// A command of the workload and where it ran in the log: it made operations
/// `start..end`, and was acknowledged (exited 0) at `end`.
struct Cmd {
    label: String,
    start: usize,
    end: usize,
    effect: Effect,
}

struct Workload {
    mount: Mount,
    store: String,
    inputs: PathBuf,
    cmds: Vec<Cmd>,
    data: Vec<u8>,
    rng: ChaCha8Rng,
}

impl Workload {
    /// Runs one command on the mount and records its span.
    fn run(&mut self, label: String, args: &[&str], effect: impl FnOnce(&Value) -> Effect) {
        let start = self.mount.position();
        let out = ok_json(args);
        let end = self.mount.position();
        let effect = effect(&out);
        self.cmds.push(Cmd {
            label,
            start,
            end,
            effect,
        });
    }

    /// The next version of the data both series share: scattered edits and
    /// an insertion, so units are partly new and partly deduplicated.
    fn next_input(&mut self) -> (PathBuf, String) {
        for _ in 0..8 {
            let at = self.rng.random_range(0..self.data.len() - 100);
            let edit = random(64, self.rng.random());
            self.data.splice(at..at + 64, edit);
        }
        let at = self.rng.random_range(0..self.data.len());
        let insert = random(128 << 10, self.rng.random());
        self.data.splice(at..at, insert);
        let path = self.inputs.join(format!("input-{}", self.cmds.len()));
        std::fs::write(&path, &self.data).unwrap();
        let sha = sha256_file(&path);
        (path, sha)
    }

    fn backup(&mut self, series: &'static str, unit: &str) {
        let (input, sha) = self.next_input();
        let store = self.store.clone();
        let args = [
            "backup",
            "--store",
            &store,
            "--series",
            series,
            "--unit",
            unit,
            input.to_str().unwrap(),
        ];
        self.run(format!("backup {series}"), &args, |out| Effect::Backup {
            series,
            version: out["version"].as_u64().unwrap(),
            sha,
        });
    }

    fn slide(&mut self, series: &'static str) {
        let store = self.store.clone();
        let args = ["slide", "--store", &store, "--series", series];
        self.run(format!("slide {series}"), &args, |out| Effect::Slide {
            series,
            slid: numbers(&out["slid"]),
        });
    }

    fn expire(&mut self, series: &'static str, version: u64) {
        let store = self.store.clone();
        let v = version.to_string();
        let args = [
            "expire",
            "--store",
            &store,
            "--series",
            series,
            "--version",
            &v,
        ];
        self.run(format!("expire {series} {v}"), &args, |out| {
            Effect::Expire {
                series,
                expired: numbers(&out["expired"]),
            }
        });
    }
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

/// Runs the workload on a fresh mount; returns its commands and the log.
fn record_workload(dir: &Path) -> (Vec<Cmd>, Recording) {
    let mnt = dir.join("mnt");
    let inputs = dir.join("inputs");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&inputs).unwrap();
    let mount = Mount::new(&mnt).expect("mount faultfs (as root, or with fusermount3)");
    let store = mnt.join("store").to_str().unwrap().to_string();
    let mut w = Workload {
        mount,
        store: store.clone(),
        inputs,
        cmds: Vec::new(),
        data: random(3 << 19, 1),
        rng: ChaCha8Rng::seed_from_u64(18),
    };
    let init = [
        "init",
        "--store",
        &store,
        "--container-mib",
        "1",
        "--segment-kib",
        "256",
    ];
    w.run("init".into(), &init, |_| Effect::Init);
    w.backup(SEG, "segment");
    w.backup(CHK, "chunk");
    w.backup(SEG, "segment");
    w.backup(CHK, "chunk");
    w.backup(SEG, "segment");
    w.slide(SEG);
    w.slide(CHK);
    w.expire(SEG, 2);
    w.expire(SEG, 1);
    let gc = ["gc", "--store", &store, "--full", "--compact-below", "0.99"];
    w.run("gc --full".into(), &gc, |_| Effect::Gc);
    w.backup(SEG, "segment");
    let Workload { mount, cmds, .. } = w;
    let rec = mount.unmount().expect("unmount faultfs");
    (cmds, rec)
}

/// Whether a sync is one the default cut set always takes: any sync outside
/// RocksDB's directory, and RocksDB's log (each synced write: the session
/// records and the commits).
fn key_sync(op: &Op) -> bool {
    let p = op.path.to_string_lossy();
    !p.starts_with("store/meta") || p.ends_with(".log")
}

/// The cut positions to check (a position `p` keeps the synced part of the
/// first `p` operations).
fn choose_cuts(ops: &[Op], cmds: &[Cmd]) -> Vec<usize> {
    let setting = std::env::var("REVAULT_POWER_LOSS_CUTS").unwrap_or_default();
    let all = setting == "all";
    let budget = setting.parse().unwrap_or(CUT_BUDGET);
    let mut key: Vec<usize> = cmds.iter().map(|c| c.end).collect();
    let mut rest = Vec::new();
    for (i, op) in ops.iter().enumerate().filter(|(_, o)| o.is_sync()) {
        if all || key_sync(op) {
            key.push(i + 1);
        } else {
            rest.push(i + 1);
        }
    }
    rest.shuffle(&mut ChaCha8Rng::seed_from_u64(4));
    rest.truncate(budget.saturating_sub(key.len()));
    key.extend(rest);
    key.sort_unstable();
    key.dedup();
    key
}

/// Which command a cut falls in, and whether right at its acknowledgement.
fn place(cmds: &[Cmd], p: usize) -> (usize, bool) {
    let i = cmds
        .iter()
        .position(|c| p <= c.end)
        .unwrap_or(cmds.len() - 1);
    (i, p == cmds[i].end)
}

fn restore_sha(store: &str, series: &str, version: u64) -> Result<String, String> {
    let v = version.to_string();
    let out = Command::new(bin())
        .args(["restore", "--store", store, "--series", series])
        .args(["--version", &v, "-o", "-", "-q"])
        .stdin(Stdio::null())
        .env("REVAULT_LOG", "warn")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "restore {series} {v} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(hex::encode(Sha256::digest(&out.stdout)))
}

/// `check` passes; with `after_gc`, no orphan is left either.
fn check_clean(store: &str, after_gc: bool) -> Result<(), String> {
    let c = json_of(&["check", "--store", store])?;
    if !c["ok"].as_bool().unwrap_or(false) {
        return Err(format!("check: {}", c["errors"]));
    }
    let orphans = orphan_warnings(&c);
    if after_gc && !orphans.is_empty() {
        return Err(format!("files no record names after gc: {orphans:?}"));
    }
    Ok(())
}

/// The versions each series lists, with their form (live or archival).
fn listed(store: &str) -> Result<BTreeMap<String, BTreeMap<u64, String>>, String> {
    let mut out = BTreeMap::new();
    for s in json_of(&["list", "--store", store])?
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = s["series"].as_str().unwrap_or_default().to_string();
        let l = json_of(&["list", "--store", store, "--series", &name])?;
        let versions = l["versions"].as_array().into_iter().flatten();
        let forms = versions
            .map(|v| {
                let n = v["number"].as_u64().unwrap_or(0);
                (n, v["form"].as_str().unwrap_or_default().to_string())
            })
            .collect();
        out.insert(name, forms);
    }
    Ok(out)
}

/// What one cut showed.
#[derive(Default)]
struct CutResult {
    /// No store yet: the cut fell before `init` was acknowledged.
    no_store: bool,
    /// Acknowledged versions found and restored byte-exact.
    acked_restored: usize,
    /// Acknowledged versions missing or restoring to other bytes.
    acked_lost: usize,
    /// Versions whose backup was not yet acknowledged, found and exact.
    unacked_restored: usize,
    /// Everything wrong, in words.
    problems: Vec<String>,
}

type Listed = BTreeMap<String, BTreeMap<u64, String>>;

/// Checks the store a cut after `p` operations leaves (materialised in
/// `dir`), going on past a problem so that every lost version is counted.
fn verify(dir: &Path, p: usize, cmds: &[Cmd]) -> CutResult {
    let root = dir.join("store");
    let store = root.to_str().unwrap();
    let mut res = CutResult::default();
    if !root.join("revault.store").exists() {
        if cmds
            .iter()
            .any(|c| c.end <= p && matches!(c.effect, Effect::Init))
        {
            res.problems
                .push("init was acknowledged but the store is gone".into());
            res.acked_lost = owed(p, cmds).len();
        } else {
            res.no_store = true;
        }
        return res;
    }
    if let Err(e) = check_clean(store, false) {
        res.problems.push(format!("before recovery: {e}"));
    }
    // The read-write open recovers unfinished sessions; gc then removes
    // whatever the cut left that no record names.
    let gc = json_of(&["gc", "--store", store]);
    if let Err(e) = gc.and_then(|_| check_clean(store, true)) {
        res.problems.push(format!("after gc: {e}"));
    }
    match listed(store) {
        Ok(found) => {
            check_records(&found, p, cmds, &mut res);
            check_restores(store, &found, p, cmds, &mut res);
        }
        Err(e) => {
            res.problems.push(e);
            res.acked_lost = owed(p, cmds).len();
        }
    }
    res
}

/// The versions a cut after `p` operations must keep: acknowledged, and no
/// expiry of them started.
fn owed(p: usize, cmds: &[Cmd]) -> Vec<(&'static str, u64)> {
    cmds.iter()
        .filter(|c| c.end <= p)
        .filter_map(|c| match &c.effect {
            Effect::Backup {
                series, version, ..
            } if !expiring(p, cmds, series, *version) => Some((*series, *version)),
            _ => None,
        })
        .collect()
}

/// Whether an expiry of the version started before the cut (and so may
/// have committed).
fn expiring(p: usize, cmds: &[Cmd], series: &str, v: u64) -> bool {
    cmds.iter().any(|c| {
        c.start < p
            && matches!(&c.effect, Effect::Expire { series: s, expired }
                if *s == series && expired.contains(&v))
    })
}

/// What the acknowledged commands promise about the versions listed.
fn check_records(found: &Listed, p: usize, cmds: &[Cmd], res: &mut CutResult) {
    let is_listed = |series: &str, v: u64| found.get(series).is_some_and(|m| m.contains_key(&v));
    for (series, v) in owed(p, cmds) {
        if !is_listed(series, v) {
            res.acked_lost += 1;
            res.problems
                .push(format!("acknowledged version {series} {v} was lost"));
        }
    }
    for c in cmds.iter().filter(|c| c.end <= p) {
        match &c.effect {
            Effect::Expire { series, expired } => {
                for v in expired.iter().filter(|v| is_listed(series, **v)) {
                    let e = format!("{series} {v} is listed after its expiry was acknowledged");
                    res.problems.push(e);
                }
            }
            Effect::Slide { series, slid } => {
                for v in slid {
                    let form = found.get(*series).and_then(|m| m.get(v));
                    if form.is_some_and(|f| f != "archival") {
                        let e =
                            format!("{series} {v} is {form:?} after its slide was acknowledged");
                        res.problems.push(e);
                    }
                }
            }
            _ => {}
        }
    }
}

/// Every version listed was backed up (before the cut) and restores to the
/// bytes it was backed up from.
fn check_restores(store: &str, found: &Listed, p: usize, cmds: &[Cmd], res: &mut CutResult) {
    for (series, versions) in found {
        for v in versions.keys() {
            let backup = cmds.iter().find_map(|c| match &c.effect {
                Effect::Backup {
                    series: s,
                    version,
                    sha,
                } if c.start < p && s == series && version == v => Some((c, sha)),
                _ => None,
            });
            let Some((c, sha)) = backup else {
                res.problems
                    .push(format!("{series} {v} is listed but was never backed up"));
                continue;
            };
            let acked = c.end <= p;
            match restore_sha(store, series, *v) {
                Ok(got) if &got == sha && acked => res.acked_restored += 1,
                Ok(got) if &got == sha => res.unacked_restored += 1,
                r => {
                    res.acked_lost += acked as usize;
                    let why = r.err().unwrap_or_else(|| "different bytes".into());
                    res.problems
                        .push(format!("{series} {v} does not restore: {why}"));
                }
            }
        }
    }
}

/// Checks every cut on two threads; returns each cut's result.
fn verify_all(
    rec: &Recording,
    cmds: &[Cmd],
    cuts: &[usize],
    scratch: &Path,
) -> Vec<(usize, CutResult)> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&p) = cuts.get(i) else { break };
                let dir = tempfile::tempdir_in(scratch).unwrap();
                let mut r = match rec.materialise(p, dir.path()) {
                    Ok(()) => verify(dir.path(), p, cmds),
                    Err(e) => panic!("materialising the cut after op {p}: {e}"),
                };
                // Name the store as <cut>, not by its temporary path.
                let path = dir.path().to_string_lossy().into_owned();
                for e in &mut r.problems {
                    *e = e.replace(&path, "<cut>");
                }
                results.lock().unwrap().push((p, r));
            });
        }
    });
    let mut r = results.into_inner().unwrap();
    r.sort_by_key(|(p, _)| *p);
    r
}

/// Names a cut for a failure: the command, the last operation and the last
/// sync before it.
fn describe(ops: &[Op], cmds: &[Cmd], p: usize) -> String {
    let (i, at_exit) = place(cmds, p);
    let last = p
        .checked_sub(1)
        .map_or("none".into(), |k| ops[k].to_string());
    let sync = ops[..p]
        .iter()
        .rposition(Op::is_sync)
        .map_or("none".into(), |k| format!("#{k} {}", ops[k]));
    let when = if at_exit {
        "at the acknowledgement of"
    } else {
        "inside"
    };
    format!(
        "cut after op {p} ({when} `{}`; last op: {last}; last sync: {sync})",
        cmds[i].label
    )
}

/// The report printed at the end: operations, cuts per command, versions
/// restored and lost; and the failed cuts, described.
fn summarise(ops: &[Op], cmds: &[Cmd], results: &[(usize, CutResult)]) -> (String, Vec<String>) {
    // Per command: syncs, cuts inside, cuts at its acknowledgement.
    let mut per_cmd = vec![[0usize; 3]; cmds.len()];
    for (i, _) in ops.iter().enumerate().filter(|(_, o)| o.is_sync()) {
        per_cmd[place(cmds, i + 1).0][0] += 1;
    }
    let mut failures = Vec::new();
    let (mut acked, mut lost, mut unacked, mut no_store) = (0, 0, 0, 0);
    for (p, r) in results {
        let (i, at_exit) = place(cmds, *p);
        per_cmd[i][if at_exit { 2 } else { 1 }] += 1;
        acked += r.acked_restored;
        lost += r.acked_lost;
        unacked += r.unacked_restored;
        no_store += r.no_store as usize;
        if !r.problems.is_empty() {
            let e = r.problems.join("; ");
            failures.push(format!("{}: {e}", describe(ops, cmds, *p)));
        }
    }
    let mut report = format!(
        "{:<22} {:>6} {:>6} {:>7} {:>7}\n",
        "command", "ops", "syncs", "inside", "at ack"
    );
    for (c, [syncs, inside, at_ack]) in cmds.iter().zip(&per_cmd) {
        if *inside == 0 {
            failures.push(format!("no cut fell inside `{}`", c.label));
        }
        let ops = c.end - c.start;
        report += &format!(
            "{:<22} {ops:>6} {syncs:>6} {inside:>7} {at_ack:>7}\n",
            c.label
        );
    }
    report += &format!(
        "acknowledged versions restored byte-exact: {acked} (summed over cuts), lost: {lost}; \
         not yet acknowledged but committed and exact: {unacked}; \
         cuts before the store existed: {no_store}; failed cuts: {}\n",
        failures.len()
    );
    (report, failures)
}

#[test]
fn only_what_was_fsynced_survives_and_nothing_acknowledged_is_lost() {
    if let Some(why) = faultfs::unavailable() {
        eprintln!("\n*** SKIPPED power-loss test: {why} ***\n");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Cuts go to memory where there is a tmpfs: the checks fsync too.
    let shm = Path::new("/dev/shm");
    let scratch = tempfile::tempdir_in(if shm.is_dir() { shm } else { tmp.path() }).unwrap();
    let started = Instant::now();
    let (cmds, rec) = record_workload(tmp.path());
    let recorded = started.elapsed();
    let ops = rec.ops();
    let cuts = choose_cuts(ops, &cmds);
    let results = verify_all(&rec, &cmds, &cuts, scratch.path());
    let (table, failures) = summarise(ops, &cmds, &results);
    let report = format!(
        "power loss: {} operations ({} syncs) recorded in {:.1}s; {} cuts checked in {:.1}s\n{table}",
        ops.len(),
        ops.iter().filter(|o| o.is_sync()).count(),
        recorded.as_secs_f64(),
        cuts.len(),
        (started.elapsed() - recorded).as_secs_f64()
    );
    println!("{report}");
    assert!(
        failures.is_empty(),
        "{report}{} of {} cuts failed:\n{}",
        failures.len(),
        cuts.len(),
        failures.join("\n")
    );
}
