//! The durable tier through the real binary, as a user on a fresh machine meets it: `init
//! --remote`, commands that return once the bucket holds their change, `recover` on another
//! directory, `remote status|sync|evict`, and the bucket going away for a while. The bucket is
//! a real S3 server (versitygw, revault_remote::testing).

mod common;

use std::sync::Mutex;

use common::*;
use revault_remote::testing::{fresh_url, s3};

/// One test at a time: the outage test stops the shared S3 server.
static SERIAL: Mutex<()> = Mutex::new(());

fn store_args(store: &std::path::Path) -> Vec<String> {
    vec!["--store".into(), store.to_str().unwrap().into()]
}

fn run(args: &[String]) -> serde_json::Value {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    ok_json(&a)
}

/// A new store `DIR/store` whose remote is a fresh prefix, its key file `DIR/key`.
fn store_with_remote(what: &str) -> (revault_remote::RemoteUrl, tempfile::TempDir) {
    let url = fresh_url(what);
    let dir = tempfile::tempdir().unwrap();
    let (store, key) = (dir.path().join("store"), dir.path().join("key"));
    ok_json(&[
        "init",
        "--store",
        store.to_str().unwrap(),
        "--remote",
        &url.to_string(),
        "--key-file",
        key.to_str().unwrap(),
    ]);
    (url, dir)
}

#[test]
fn init_backup_recover_restore_through_the_cli() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let url = fresh_url("cli");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let key = dir.path().join("key");
    let mut a = vec!["init".to_string()];
    a.extend(store_args(&store));
    a.extend([
        "--remote".into(),
        url.to_string(),
        "--key-file".into(),
        key.to_str().unwrap().into(),
    ]);
    let init = run(&a);
    assert!(
        init["remote"]["createdKeyFile"].as_bool().unwrap(),
        "{init}"
    );
    assert!(init["remote"]["createdBucket"].as_bool().unwrap(), "{init}");
    // A second init on the same prefix is refused: it holds a store.
    let e = fails(&[
        "init",
        "--store",
        dir.path().join("other").to_str().unwrap(),
        "--remote",
        &url.to_string(),
        "--key-file",
        key.to_str().unwrap(),
    ]);
    assert!(
        e.contains("already holds a Revault store") && e.contains("revault recover"),
        "{e}"
    );

    let mut inputs = Vec::new();
    for i in 0..3u64 {
        let input = dir.path().join(format!("v{i}.bin"));
        let mut d = random(2 << 20, 5);
        d[(i as usize) * 100_000..(i as usize) * 100_000 + 50_000]
            .copy_from_slice(&random(50_000, 50 + i));
        std::fs::write(&input, &d).unwrap();
        let mut b = vec!["backup".to_string()];
        b.extend(store_args(&store));
        b.extend([
            "--series".into(),
            "default/db".into(),
            input.to_str().unwrap().into(),
        ]);
        run(&b);
        inputs.push(input);
        // `backup` returned: the bucket holds this version already.
        let mut st = vec!["remote".to_string(), "status".into()];
        st.extend(store_args(&store));
        let s = run(&st);
        assert_eq!(s["series"][0]["durableVersion"], i + 1, "{s}");
    }
    let mut ex = vec!["expire".to_string()];
    ex.extend(store_args(&store));
    ex.extend([
        "--series".into(),
        "default/db".into(),
        "--version".into(),
        "1".into(),
    ]);
    run(&ex);
    // The node is lost; a new directory is rebuilt from the bucket and the key file alone.
    std::fs::remove_dir_all(&store).unwrap();
    let rebuilt = dir.path().join("rebuilt");
    let r = ok_json(&[
        "recover",
        "--remote",
        &url.to_string(),
        "--key-file",
        key.to_str().unwrap(),
        "--store",
        rebuilt.to_str().unwrap(),
    ]);
    assert_eq!(r["generation"], 2, "{r}");
    assert_eq!(r["series"][0]["versions"], 2, "{r}");
    let rs = rebuilt.to_str().unwrap();
    for (v, input) in [(2, &inputs[1]), (3, &inputs[2])] {
        let out = dir.path().join(format!("out{v}.bin"));
        ok_json(&[
            "restore",
            "--store",
            rs,
            "--series",
            "default/db",
            "--version",
            &v.to_string(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(sha256_file(&out), sha256_file(input), "version {v}");
    }
    let e = fails(&[
        "restore",
        "--store",
        rs,
        "--series",
        "default/db",
        "--version",
        "1",
        "-o",
        "/dev/null",
    ]);
    assert!(
        e.contains("has no version 1"),
        "an expired version stays expired: {e}"
    );
    assert!(ok_json(&["check", "--store", rs])["ok"].as_bool().unwrap());
    // Evicted containers are read back from the bucket by a later command.
    let ev = ok_json(&["remote", "evict", "--store", rs, "--older-than", "0"]);
    assert!(ev["live"].as_u64().unwrap() > 0, "{ev}");
    let out = dir.path().join("again.bin");
    ok_json(&[
        "restore",
        "--store",
        rs,
        "--series",
        "default/db",
        "--version",
        "2",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(sha256_file(&out), sha256_file(&inputs[1]));
    // A wrong key file is refused by name.
    let other = dir.path().join("other-key");
    std::fs::write(&other, "0123456789abcdef0123456789abcdef0123456789abcdef").unwrap();
    let e = fails(&[
        "recover",
        "--remote",
        &url.to_string(),
        "--key-file",
        other.to_str().unwrap(),
        "--store",
        dir.path().join("x").to_str().unwrap(),
    ]);
    assert!(e.contains("does not open the remote"), "{e}");
}

#[test]
fn a_backup_while_the_bucket_is_away_is_kept_and_said_to_be_not_durable() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_url, dir) = store_with_remote("cli-outage");
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(1 << 20, 9)).unwrap();
    s3().stop();
    let out = revault(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        input.to_str().unwrap(),
        "--json",
    ]);
    s3().resume();
    assert!(
        !out.status.success(),
        "a backup the bucket does not hold is not reported as done"
    );
    let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "not_durable", "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("version 1 of default/db is committed in the local store"),
        "{msg}"
    );
    // It is kept locally, and the next sync makes it durable.
    let l = ok_json(&["list", "--store", s, "--series", "default/db"]);
    assert_eq!(l["versions"].as_array().unwrap().len(), 1);
    let st = ok_json(&["remote", "status", "--store", s]);
    assert!(st["series"][0]["durableVersion"].is_null(), "{st}");
    let sy = ok_json(&["remote", "sync", "--store", s]);
    assert!(sy["published"].as_bool().unwrap(), "{sy}");
    let st = ok_json(&["remote", "status", "--store", s]);
    assert_eq!(st["series"][0]["durableVersion"], 1, "{st}");
}

/// Data objects under `url`.
fn data_objects(url: &revault_remote::RemoteUrl) -> std::collections::BTreeSet<String> {
    s3().objects(url)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("data/"))
        .collect()
}

#[test]
fn containers_go_up_while_the_backup_runs_and_a_killed_backup_leaves_nothing_behind() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (url, dir) = store_with_remote("cli-early");
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let key = dir.path().join("key");
    let k = key.to_str().unwrap();
    let first = dir.path().join("v1.bin");
    std::fs::write(&first, random(6 << 20, 21)).unwrap();
    ok_json(&[
        "backup",
        "--store",
        s,
        "--series",
        "default/db",
        first.to_str().unwrap(),
    ]);
    let committed = data_objects(&url);
    assert!(!committed.is_empty());

    // A second backup from a pipe that is fed 16 MiB and then held open: its sealed
    // containers reach the bucket while it still waits for input, before any commit.
    let mut child = Command::new(bin())
        .args([
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            "-",
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&random(16 << 20, 22)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let early = loop {
        let now = data_objects(&url);
        let new: Vec<String> = now.difference(&committed).cloned().collect();
        if !new.is_empty() {
            break new;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no container of the running backup reached the bucket within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        child.try_wait().unwrap().is_none(),
        "the backup is still running"
    );
    // The node dies: the backup is never committed, its uploads are left in the bucket.
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    // A PUT whose body was sent before the kill may still land: let it.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(early.iter().all(|n| data_objects(&url).contains(n)));

    // The next command that changes the store lists the bucket (the killed process never
    // marked it clean) and removes what no head names.
    ok_json(&["remote", "sync", "--store", s]);
    assert_eq!(
        data_objects(&url),
        committed,
        "the killed backup's early uploads are gone; the committed containers stay"
    );
    // And the bucket alone still rebuilds the store: version 1 byte-exact, check clean.
    std::fs::remove_dir_all(&store).unwrap();
    let rebuilt = dir.path().join("rebuilt");
    let rs = rebuilt.to_str().unwrap();
    ok_json(&[
        "recover",
        "--remote",
        &url.to_string(),
        "--key-file",
        k,
        "--store",
        rs,
    ]);
    let out = dir.path().join("out.bin");
    ok_json(&[
        "restore",
        "--store",
        rs,
        "--series",
        "default/db",
        "--version",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(sha256_file(&out), sha256_file(&first));
    assert_check_ok(&rebuilt);
    let l = ok_json(&["list", "--store", rs, "--series", "default/db"]);
    assert_eq!(l["versions"].as_array().unwrap().len(), 1, "{l}");
}

/// A key file rotated in two steps, as a cluster does it: the new key file added beside the
/// old through the remote alone while the store keeps working on the old one, then the old
/// one dropped (`--drop-old`) through the store, which records the new one and goes on with
/// it (the drop run again finds nothing to rotate). Afterwards only the new key file rebuilds the store, every
/// version byte-exact.
#[test]
fn a_key_file_is_rotated_in_two_runs_while_backups_go_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (url, dir) = store_with_remote("cli-rotate");
    let (store, old, new) = (
        dir.path().join("store"),
        dir.path().join("key"),
        dir.path().join("new-key"),
    );
    let s = store.to_str().unwrap();
    let backup = |i: u64| {
        let input = dir.path().join(format!("v{i}.bin"));
        std::fs::write(&input, random(1 << 20, 70 + i)).unwrap();
        ok_json(&[
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ]);
        input
    };
    let mut inputs = vec![backup(1)];
    let first = ok_json(&[
        "remote",
        "rotate-key",
        "--remote",
        &url.to_string(),
        "--key-file",
        old.to_str().unwrap(),
        "--new-key-file",
        new.to_str().unwrap(),
    ]);
    assert_eq!(first["keyFiles"].as_array().unwrap().len(), 2, "{first}");
    assert!(first["createdKeyFile"].as_bool().unwrap(), "{first}");
    assert!(!first["finished"].as_bool().unwrap(), "{first}");
    inputs.push(backup(2));
    let rotate_store = || {
        let n = new.to_str().unwrap();
        ok_json(&[
            "remote",
            "rotate-key",
            "--store",
            s,
            "--new-key-file",
            n,
            "--drop-old",
        ])
    };
    let second = rotate_store();
    assert!(second["finished"].as_bool().unwrap(), "{second}");
    assert!(second["removed"].is_string(), "{second}");
    assert_eq!(
        second["keyFiles"],
        serde_json::json!([second["newKeyFile"]]),
        "{second}"
    );
    let third = rotate_store();
    assert!(third["sameKey"].as_bool().unwrap(), "{third}");
    inputs.push(backup(3));

    let recover = |key: &std::path::Path, to: &str| {
        vec![
            "recover".to_string(),
            "--remote".into(),
            url.to_string(),
            "--key-file".into(),
            key.to_str().unwrap().into(),
            "--store".into(),
            dir.path().join(to).to_str().unwrap().into(),
        ]
    };
    let a = recover(&old, "with-old");
    let e = fails(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(e.contains("does not open the remote"), "{e}");
    let r = run(&recover(&new, "with-new"));
    assert_eq!(r["series"][0]["versions"], 3, "{r}");
    let rebuilt = dir.path().join("with-new");
    for (i, input) in inputs.iter().enumerate() {
        let out = dir.path().join(format!("out{i}.bin"));
        ok_json(&[
            "restore",
            "--store",
            rebuilt.to_str().unwrap(),
            "--series",
            "default/db",
            "--version",
            &(i + 1).to_string(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(sha256_file(&out), sha256_file(input), "version {}", i + 1);
    }
}

/// In a cluster every worker's store has its own prefix under one remote.url, all opened by
/// one key Secret: `--every-store` rotates each of them — the first run adds the new key file
/// it creates, the second (`--drop-old`) drops the old one — and a store under the prefix
/// that the key file does not open (another cluster's, sorted first here) is reported
/// without stopping the others. Afterwards each opens with the new key file only.
#[test]
fn every_store_under_a_remote_is_rotated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let url = fresh_url("cli-every");
    let dir = tempfile::tempdir().unwrap();
    let key = |n: &str| dir.path().join(n);
    let (old, new) = (key("key"), key("new-key"));
    let node = |n: &str| format!("{url}/ssd/{n}");
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(1 << 20, 90)).unwrap();
    for (n, k) in [
        ("node-a", &old),
        ("node-b", &old),
        ("node-0", &key("strangers-key")),
    ] {
        let s = dir.path().join(n);
        let s = s.to_str().unwrap();
        ok_json(&[
            "init",
            "--store",
            s,
            "--remote",
            &node(n),
            "--key-file",
            k.to_str().unwrap(),
        ]);
        ok_json(&[
            "backup",
            "--store",
            s,
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ]);
    }
    let rotate = |drop_old: bool| {
        let u = url.to_string();
        let mut args = vec![
            "remote",
            "rotate-key",
            "--remote",
            &u,
            "--every-store",
            "--json",
        ];
        args.extend(["--key-file", old.to_str().unwrap()]);
        args.extend(["--new-key-file", new.to_str().unwrap()]);
        if drop_old {
            args.push("--drop-old");
        }
        let out = revault(&args);
        assert!(
            !out.status.success(),
            "node-0 cannot be rotated with this key file"
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["error"]["code"], "partly_rotated", "{doc}");
        let reps = &doc["stores"];
        let by_remote: std::collections::BTreeMap<String, serde_json::Value> = reps
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["remote"].as_str().unwrap().to_string(), r.clone()))
            .collect();
        assert_eq!(by_remote.len(), 3, "{reps}");
        assert_eq!(
            by_remote[&node("node-0")]["error"]["code"],
            "wrong_key",
            "{reps}"
        );
        by_remote
    };
    let first = rotate(false);
    assert!(new.exists());
    for n in ["node-a", "node-b"] {
        assert_eq!(first[&node(n)]["finished"], false, "{:?}", first[&node(n)]);
    }
    let second = rotate(true);
    for n in ["node-a", "node-b"] {
        let rep = &second[&node(n)];
        assert_eq!(rep["finished"], true, "{rep}");
        let to = |k: &str| dir.path().join(format!("{n}-{k}"));
        let e = fails(&[
            "recover",
            "--remote",
            &node(n),
            "--key-file",
            old.to_str().unwrap(),
            "--store",
            to("old").to_str().unwrap(),
        ]);
        assert!(e.contains("does not open the remote"), "{e}");
        let rebuilt = to("new");
        let r = rebuilt.to_str().unwrap();
        ok_json(&[
            "recover",
            "--remote",
            &node(n),
            "--key-file",
            new.to_str().unwrap(),
            "--store",
            r,
        ]);
        let out = to("out");
        let o = out.to_str().unwrap();
        ok_json(&[
            "restore",
            "--store",
            r,
            "--series",
            "default/db",
            "--version",
            "1",
            "-o",
            o,
        ]);
        assert_eq!(sha256_file(&out), sha256_file(&input), "{n}");
    }
}
