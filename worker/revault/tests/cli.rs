//! The CLI's behaviour on good and bad input, through the real binary.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

#[test]
fn backup_list_restore_round_trip_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(3 << 20, 1)).unwrap();
    let b = ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        input.to_str().unwrap(),
        "--time",
        "2026-01-02T03:04:05Z",
    ]);
    assert_eq!(b["version"], 1);
    assert_eq!(b["logical_bytes"], 3 << 20);
    assert_eq!(b["time_unix"], 1767323045);
    let l = ok_json(&["list", "--store", s, "--series", "default/db"]);
    assert_eq!(l["versions"].as_array().unwrap().len(), 1);
    let out = dir.path().join("out.bin");
    let r = ok_json(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/db",
        "--version",
        "latest",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(r["container_reads"].as_u64().unwrap() >= 1);
    assert_eq!(sha256_file(&out), sha256_file(&input));
    let st = ok_json(&["stats", "--store", s]);
    assert_eq!(st["versions"], 1);
    assert!(ok_json(&["check", "--store", s])["ok"].as_bool().unwrap());
}

#[test]
fn unknown_series_and_versions_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let e = fails(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/nope",
        "-o",
        "/dev/null",
    ]);
    assert!(
        e.contains("error: no series default/nope in this store"),
        "{e}"
    );
    let input = dir.path().join("in");
    std::fs::write(&input, b"some data").unwrap();
    for _ in 0..5 {
        ok_json(&[
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ]);
    }
    let e = fails(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/db",
        "--version",
        "7",
        "-o",
        "/dev/null",
    ]);
    assert!(
        e.contains("series default/db has no version 7 (latest is 5)"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    let e = fails(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/db",
        "--version",
        "seven",
    ]);
    assert!(e.contains("expected a version number"), "{e}");
    let e = fails(&[
        "backup",
        "--store",
        s,
        "--series",
        "Bad_Name",
        input.to_str().unwrap(),
    ]);
    assert!(e.contains("NAMESPACE/NAME"), "{e}");
    let out = revault(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/db",
        "--version",
        "9",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "unknown_version");
}

#[test]
fn a_store_that_was_never_initialised_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let e = fails(&["list", "--store", dir.path().to_str().unwrap()]);
    assert!(
        e.contains("not a Revault store") && e.contains("revault init --store"),
        "{e}"
    );
    let e = fails(&[
        "backup",
        "--store",
        dir.path().join("none").to_str().unwrap(),
        "--series",
        "a/b",
        "-",
    ]);
    assert!(e.contains("not a Revault store"), "{e}");
}

#[test]
fn a_second_writer_is_refused_and_the_first_is_unharmed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap().to_string();
    init(&store);
    let data = random(2 << 20, 4);
    // The first writer reads stdin, which we hold open, so it holds the lock.
    let mut first = Command::new(bin())
        .args([
            "backup",
            "--store",
            &s,
            "--series",
            "default/db",
            "-",
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = first.stdin.take().unwrap();
    stdin.write_all(&data[..1 << 20]).unwrap();
    // Wait until it holds the lock (its pid is written into the lock file).
    let lock = store.join("lock");
    for _ in 0..200 {
        if std::fs::read_to_string(&lock)
            .unwrap_or_default()
            .contains("revault backup")
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let input = dir.path().join("other");
    std::fs::write(&input, b"x").unwrap();
    let e = fails(&[
        "backup",
        "--store",
        &s,
        "--series",
        "default/other",
        input.to_str().unwrap(),
    ]);
    assert!(e.contains("is locked by another revault process"), "{e}");
    assert!(e.contains(&format!("pid {}", first.id())), "{e}");
    stdin.write_all(&data[1 << 20..]).unwrap();
    drop(stdin);
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restored = dir.path().join("restored");
    ok_json(&[
        "restore",
        "--store",
        &s,
        "--series",
        "default/db",
        "-o",
        restored.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(restored).unwrap(), data);
}

#[test]
fn empty_stdin_is_a_valid_zero_length_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let b = ok_json(&["backup", "--store", s, "--series", "default/empty", "-"]);
    assert_eq!(b["logical_bytes"], 0);
    let out = revault(&["restore", "--store", s, "--series", "default/empty"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
}

#[test]
fn an_unreadable_input_fails_clearly_and_creates_no_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let e = fails(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        dir.path().join("missing.tar").to_str().unwrap(),
    ]);
    assert!(
        e.contains("cannot read") && e.contains("missing.tar"),
        "{e}"
    );

    // Permission errors: run as an unprivileged user (root reads anything).
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipping the permission case: setpriv is not installed");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/ok.txt"), b"fine").unwrap();
    std::fs::write(tree.join("sub/secret.txt"), b"no").unwrap();
    std::fs::set_permissions(
        tree.join("sub/secret.txt"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    for p in [dir.path(), &store, &tree, &tree.join("sub")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let chown = |p: &Path| {
        Command::new("chown")
            .args(["-R", "65534:65534", p.to_str().unwrap()])
            .status()
            .unwrap();
    };
    chown(&store);
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin(),
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            tree.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        e.contains("cannot read") && e.contains("secret.txt") && e.contains("Permission denied"),
        "{e}"
    );
    let l = ok_json(&["list", "--store", s]);
    assert_eq!(
        l.as_array().unwrap().len(),
        0,
        "no series or version was created: {l}"
    );
}

#[test]
fn directory_versions_restore_as_trees_and_as_tar() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::create_dir_all(tree.join("empty")).unwrap();
    std::fs::write(tree.join("a/b/f.txt"), random(100_000, 7)).unwrap();
    std::os::unix::fs::symlink("a/b/f.txt", tree.join("l")).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/tree",
        tree.to_str().unwrap(),
    ]);
    let out = dir.path().join("out/");
    ok_json(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/tree",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(out.join("a/b/f.txt")).unwrap(),
        std::fs::read(tree.join("a/b/f.txt")).unwrap()
    );
    assert!(out.join("empty").is_dir());
    assert_eq!(
        std::fs::read_link(out.join("l")).unwrap().to_str().unwrap(),
        "a/b/f.txt"
    );
    let tarball = dir.path().join("t.tar");
    ok_json(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/tree",
        "-o",
        tarball.to_str().unwrap(),
    ]);
    let listing = Command::new("tar")
        .args(["-tf", tarball.to_str().unwrap()])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&listing.stdout);
    assert!(
        names.contains("a/b/f.txt") && names.contains("empty/"),
        "{names}"
    );
}

#[test]
fn restoring_to_a_device_writes_it_in_place() {
    // `-o /dev/null` must not replace the device with a regular file.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let input = dir.path().join("in");
    std::fs::write(&input, random(100_000, 3)).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        input.to_str().unwrap(),
    ]);
    let fifo = dir.path().join("pipe");
    let reader = fifo_reader(&fifo);
    ok_json(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/db",
        "-o",
        fifo.to_str().unwrap(),
    ]);
    assert_eq!(reader.join().unwrap(), std::fs::read(&input).unwrap());
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO is still a FIFO"
    );
}

#[test]
fn a_closed_output_pipe_ends_a_restore_quietly() {
    // `revault restore -o - | head -c 100` is how people peek at a version:
    // the restore must stop when the reader goes away, without a panic.
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let input = dir.path().join("in");
    std::fs::write(&input, random(8 << 20, 4)).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        input.to_str().unwrap(),
    ]);
    let mut child = Command::new(bin())
        .args([
            "-q",
            "restore",
            "--store",
            s,
            "--series",
            "default/db",
            "-o",
            "-",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 100];
    use std::io::Read;
    child.stdout.take().unwrap().read_exact(&mut head).unwrap(); // then dropped: closed
    let out = child.wait_with_output().unwrap();
    assert_eq!(&head[..], &std::fs::read(&input).unwrap()[..100]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "no panic on a closed pipe: {stderr}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "ended by SIGPIPE like other tools: {:?}",
        out.status
    );
}

#[test]
fn benchmarks_and_dataset_generation_are_not_revault_commands() {
    // They live in the `revault-bench` tool: the production binary (the one the
    // worker image ships) has neither, and says so when asked for them.
    let help = revault(&["--help"]);
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("backup"),
        "the help lists the commands: {help}"
    );
    for gone in ["bench", "gen-series"] {
        assert!(
            !help.lines().any(|l| l.trim_start().starts_with(gone)),
            "`revault --help` lists `{gone}`:\n{help}"
        );
        let err = fails(&[gone, "--help"]);
        assert!(
            err.contains("unrecognized subcommand"),
            "`revault {gone}` is refused as unknown: {err}"
        );
    }
}

#[test]
fn a_series_made_by_a_plain_backup_slides_automatically() {
    // The documented default (live window 1, automatic slides) without `retention set`: a
    // series that never slid kept segment-only dedup (issue 21).
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let mut data = random(4 << 20, 11);
    let mut inputs = Vec::new();
    for v in 0..3u8 {
        data[(v as usize + 1) * 1_000_003] ^= 0x5a;
        let input = dir.path().join(format!("in{v}"));
        std::fs::write(&input, &data).unwrap();
        ok_json(&[
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ]);
        inputs.push(input);
    }
    let r = ok_json(&["retention", "show", "--store", s, "--series", "default/db"]);
    assert_eq!(
        (r["live"].as_u64(), r["auto"].as_bool()),
        (Some(1), Some(true)),
        "{r}"
    );
    let l = ok_json(&["list", "--store", s, "--series", "default/db"]);
    let forms: Vec<&str> = l["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["form"].as_str().unwrap())
        .collect();
    assert_eq!(forms, ["archival", "archival", "live"], "{l}");
    for (v, input) in inputs.iter().enumerate() {
        let out = dir.path().join(format!("out{v}"));
        let n = (v + 1).to_string();
        ok_json(&[
            "restore",
            "--store",
            s,
            "--series",
            "default/db",
            "--version",
            &n,
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(sha256_file(&out), sha256_file(input), "version {n}");
    }
    // Turned off explicitly, it stays off, also when other rules change later: a `--keep`
    // must not turn automatic expiry back on.
    let set = |series: &str, flags: &[&str]| {
        let mut args = vec!["retention", "set", "--store", s, "--series", series];
        args.extend_from_slice(flags);
        ok_json(&args)
    };
    let off = set("default/db", &["--auto=false"]);
    assert_eq!(off["auto"], false, "{off}");
    let kept = set("default/db", &["--keep", "5"]);
    assert_eq!(
        (kept["auto"].as_bool(), kept["keep"].as_u64()),
        (Some(false), Some(5)),
        "{kept}"
    );
    let on = set("default/db", &["--keep", "5", "--auto"]);
    assert_eq!(on["auto"], true, "{on}");
    // A new series set without --auto is automatic.
    let new = set("default/new", &["--keep", "3"]);
    assert_eq!(new["auto"], true, "{new}");
}

/// Calendar retention from the CLI: days end at midnight in the zone given, not in UTC; an
/// expiry by retention removes what the rules do not keep; a zone nobody has is refused by
/// name.
#[test]
fn calendar_retention_counts_days_in_the_time_zone_given() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    // In UTC these are two days (the 1st, and the 2nd twice); in Tokyo (UTC+9) the 1st at
    // 16:00 is the 2nd at 01:00, so all three fall on the 2nd.
    let times = [
        "2026-03-01T16:00:00Z",
        "2026-03-02T02:00:00Z",
        "2026-03-02T12:00:00Z",
    ];
    for series in ["default/tokyo", "default/utc"] {
        for (i, t) in times.iter().enumerate() {
            let input = dir.path().join(format!("in{i}"));
            std::fs::write(&input, random(10_000, i as u64)).unwrap();
            ok_json(&[
                "backup",
                "--store",
                s,
                "--series",
                series,
                "--time",
                t,
                input.to_str().unwrap(),
            ]);
        }
    }
    let bad = fails(&[
        "retention",
        "set",
        "--store",
        s,
        "--series",
        "default/tokyo",
        "--keep-daily",
        "2",
        "--timezone",
        "Mars/Olympus_Mons",
    ]);
    assert!(bad.contains("Mars/Olympus_Mons"), "{bad}");
    let expire_daily = |series: &str, zone: &[&str]| {
        let mut args = vec![
            "retention",
            "set",
            "--store",
            s,
            "--series",
            series,
            "--keep-daily",
            "2",
            "--auto=false",
        ];
        args.extend_from_slice(zone);
        let set = ok_json(&args);
        assert_eq!(set["calendar"]["daily"].as_u64(), Some(2), "{set}");
        ok_json(&[
            "expire",
            "--store",
            s,
            "--series",
            series,
            "--apply-retention",
        ])["expired"]
            .clone()
    };
    assert_eq!(
        expire_daily("default/tokyo", &["--timezone", "Asia/Tokyo"]),
        serde_json::json!([1, 2])
    );
    assert_eq!(expire_daily("default/utc", &[]), serde_json::json!([2]));
    for (series, left) in [("default/tokyo", vec![3]), ("default/utc", vec![1, 3])] {
        let l = ok_json(&["list", "--store", s, "--series", series]);
        let numbers: Vec<u64> = l["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["number"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers, left, "{series}: {l}");
    }
}

#[test]
fn a_directory_version_restored_to_a_new_path_is_extracted_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    init(&store);
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/f"), random(50_000, 5)).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/t",
        tree.to_str().unwrap(),
    ]);
    let restore = |out: &Path| {
        let o = revault(&[
            "restore",
            "--store",
            s,
            "--series",
            "default/t",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // No trailing slash, not there yet: the directory, not a tar file named like one.
    let out = dir.path().join("restored");
    let said = restore(&out);
    assert!(
        said.contains(&format!("extracted into directory {}", out.display())),
        "{said}"
    );
    assert_eq!(
        std::fs::read(out.join("sub/f")).unwrap(),
        std::fs::read(tree.join("sub/f")).unwrap()
    );
    // Named like a tar file: a tar file, and the summary says so.
    let tarball = dir.path().join("t.tar");
    let said = restore(&tarball);
    assert!(
        said.contains(&format!(
            "written as a tar archive to {}",
            tarball.display()
        )),
        "{said}"
    );
    let listing = Command::new("tar")
        .args(["-tf", tarball.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listing.stdout).contains("sub/f"));
    // A file version to a new path is a file.
    let input = dir.path().join("in");
    std::fs::write(&input, random(10_000, 6)).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/f",
        input.to_str().unwrap(),
    ]);
    let out = dir.path().join("f-restored");
    let o = revault(&[
        "restore",
        "--store",
        s,
        "--series",
        "default/f",
        "-o",
        out.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains(&format!("written to file {}", out.display())),
        "{said}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&input).unwrap());
}
