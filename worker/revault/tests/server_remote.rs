//! `revault serve` with a remote: backups acknowledged on local disk and uploaded in the
//! background (`durableVersion`, `/v1/stats`, `/metrics`), a store rebuilt from the bucket
//! while the old worker runs (the old one takes no more writes: 409 `remote_fenced`), the
//! last upload on shutdown, `--init --recover` for a node that came back with an empty
//! disk, and `--adopt` for a lost node's store served from another node.

mod common;

use std::time::Duration;

use common::server::{client_ok, wait_child, Server};
use common::*;
use revault_remote::testing::fresh_url;

fn remote_args<'a>(url: &'a str, key: &'a str) -> Vec<&'a str> {
    vec![
        "--remote",
        url,
        "--key-file",
        key,
        "--sync-interval",
        "200ms",
    ]
}

fn durable(s: &Server, series: &str) -> Option<u64> {
    s.get(&format!("/v1/series/{series}"), None).json()["durableVersion"].as_u64()
}

#[test]
fn the_uploader_makes_backups_durable_and_a_rebuild_fences_the_old_worker() {
    let url = fresh_url("serve");
    let u = url.to_string();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let k = key.to_str().unwrap();
    let server = Server::start(&dir.path().join("store"), &remote_args(&u, k));
    assert!(key.exists(), "serve --remote created the key file");
    let mut inputs = Vec::new();
    for i in 0..2u64 {
        let input = dir.path().join(format!("in{i}.bin"));
        std::fs::write(&input, random(1 << 20, 20 + i)).unwrap();
        client_ok(
            &[
                "push",
                "--server",
                &server.url(),
                "--series",
                "default/db",
                input.to_str().unwrap(),
            ],
            None,
        );
        inputs.push(input);
        server.wait_for(
            "the bucket to hold the backup",
            Duration::from_secs(30),
            |s| durable(s, "default/db") == Some(i + 1),
        );
    }
    let stats = server.get("/v1/stats", None).json();
    assert_eq!(stats["remote"]["url"], u, "{stats}");
    assert_eq!(stats["remote"]["generation"], 1, "{stats}");
    assert_eq!(stats["remote"]["fenced"], false, "{stats}");
    server.wait_for(
        "no lag once the bucket holds everything",
        Duration::from_secs(10),
        |s| s.metric("revault_remote_lag_seconds") == Some(0.0),
    );
    assert!(
        server
            .metric("revault_remote_uploaded_bytes_total")
            .unwrap()
            > 1e6
    );
    let listed = server.get("/v1/series", None).json();
    assert_eq!(listed[0]["durableVersion"], 2, "{listed}");

    // Another node rebuilds the store from the bucket while this worker still runs.
    let rebuilt = dir.path().join("rebuilt");
    ok_json(&[
        "recover",
        "--remote",
        &u,
        "--key-file",
        k,
        "--store",
        rebuilt.to_str().unwrap(),
    ]);
    let input = dir.path().join("late.bin");
    std::fs::write(&input, random(1 << 20, 99)).unwrap();
    // The old worker notices at its next upload and refuses writes from then on.
    client_ok(
        &[
            "push",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ],
        None,
    );
    server.wait_for(
        "the old worker to see it was fenced",
        Duration::from_secs(30),
        |s| s.metric("revault_remote_fenced") == Some(1.0),
    );
    let r = server.request(
        "PUT",
        "/v1/series/default/db/versions",
        &[("Content-Type", "application/octet-stream")],
        &random(4096, 1),
    );
    r.assert_error(409, "remote_fenced");
    assert!(r.text().contains("generation 2"), "{}", r.text());
    // Reads still work.
    let out = dir.path().join("out.bin");
    client_ok(
        &[
            "pull",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            "--version",
            "1",
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(sha256_file(&out), sha256_file(&inputs[0]));
    let log = server.stop();
    assert!(log.contains("taken over"), "{log}");

    // The rebuilt store serves what was durable, and takes backups.
    let server2 = Server::start(&rebuilt, &remote_args(&u, k));
    for (v, input) in [(1, &inputs[0]), (2, &inputs[1])] {
        let out = dir.path().join(format!("r{v}.bin"));
        client_ok(
            &[
                "pull",
                "--server",
                &server2.url(),
                "--series",
                "default/db",
                "--version",
                &v.to_string(),
                "-o",
                out.to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(sha256_file(&out), sha256_file(input), "version {v}");
    }
    client_ok(
        &[
            "push",
            "--server",
            &server2.url(),
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ],
        None,
    );
    server2.wait_for("the new owner's upload", Duration::from_secs(30), |s| {
        durable(s, "default/db") == Some(3)
    });
    server2.stop();
}

#[test]
fn a_worker_hands_its_last_backups_to_the_bucket_on_shutdown_and_an_empty_disk_recovers() {
    let url = fresh_url("serve-down");
    let u = url.to_string();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let k = key.to_str().unwrap();
    let store = dir.path().join("store");
    // A long interval: only the shutdown's sync can upload the backup in time.
    let server = Server::start(
        &store,
        &["--remote", &u, "--key-file", k, "--sync-interval", "1h"],
    );
    let input = dir.path().join("in.bin");
    std::fs::write(&input, random(1 << 20, 7)).unwrap();
    client_ok(
        &[
            "push",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ],
        None,
    );
    let log = server.stop();
    assert!(
        log.contains("the remote holds everything this worker acknowledged"),
        "{log}"
    );
    // The node comes back with an empty disk: --init --recover rebuilds its store.
    std::fs::remove_dir_all(&store).unwrap();
    let mut args = remote_args(&u, k);
    args.push("--recover");
    let server = Server::start(&store, &args);
    assert!(
        server
            .log_text()
            .contains("rebuilt the store from its remote"),
        "{}",
        server.log_text()
    );
    let out = dir.path().join("out.bin");
    client_ok(
        &[
            "pull",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(sha256_file(&out), sha256_file(&input));
    server.stop();
}

fn push(server: &Server, input: &std::path::Path) {
    client_ok(
        &[
            "push",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            input.to_str().unwrap(),
        ],
        None,
    );
}

fn pull_sha(server: &Server, version: u64, out: &std::path::Path) -> String {
    client_ok(
        &[
            "pull",
            "--server",
            &server.url(),
            "--series",
            "default/db",
            "--version",
            &version.to_string(),
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    sha256_file(out)
}

/// `revault serve` that is expected to refuse to start: its exit status and stderr.
fn serve_refuses(store: &std::path::Path, extra: &[&str], node: &str) -> String {
    let c = std::process::Command::new(bin())
        .args(["serve", "--store", store.to_str().unwrap(), "--init"])
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("NODE_NAME", node)
        .env("REVAULT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_child(c, Duration::from_secs(60));
    assert!(
        !out.status.success(),
        "serve started, but it should have refused"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A lost node's store adopted on another node (`--recover --adopt`, what the operator's
/// adopted-store Deployment runs): the original node coming back with an empty disk does not
/// take it back, coming back with its old disk serves reads only, and the adopted pod moved
/// back to a host holding a superseded copy puts that copy aside (kept) and rebuilds; a
/// `revault recover` on the original node gives it back.
#[test]
fn an_adopted_store_is_not_taken_back_and_a_superseded_copy_is_moved_aside() {
    let url = fresh_url("serve-adopt");
    let u = url.to_string();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let k = key.to_str().unwrap();
    let node_dir = |n: &str| {
        let d = dir.path().join(n);
        std::fs::create_dir_all(&d).unwrap();
        d.join("store")
    };
    let (store_a, store_b, store_c) = (node_dir("a"), node_dir("b"), node_dir("c"));
    let inputs: Vec<_> = (0..3u64)
        .map(|i| {
            let p = dir.path().join(format!("in{i}.bin"));
            std::fs::write(&p, random(1 << 20, 40 + i)).unwrap();
            p
        })
        .collect();
    let args = remote_args(&u, k);
    let mut adopt = args.clone();
    adopt.extend(["--recover", "--adopt"]);

    // Node a backs up v1; the bucket holds it; node a is lost (its worker stops).
    let a = Server::start_env(&store_a, &args, &[("NODE_NAME", "node-a")]);
    push(&a, &inputs[0]);
    a.wait_for("v1 durable", Duration::from_secs(30), |s| {
        durable(s, "default/db") == Some(1)
    });
    a.stop();

    // Node b adopts it and takes v2.
    let b = Server::start_env(&store_b, &adopt, &[("NODE_NAME", "node-b")]);
    assert!(b.log_text().contains("rebuilt the store from its remote"));
    push(&b, &inputs[1]);
    b.wait_for("v2 durable", Duration::from_secs(30), |s| {
        durable(s, "default/db") == Some(2)
    });

    // Node a comes back with an empty disk: its worker does not take the store from b.
    let empty_a = node_dir("a-empty");
    let mut recover = args.clone();
    recover.push("--recover");
    let err = serve_refuses(&empty_a, &recover, "node-a");
    assert!(
        err.contains("served from node-b") && err.contains("not from this node (node-a)"),
        "{err}"
    );
    assert!(
        !empty_a.join("revault.store").exists(),
        "the refused worker made no store"
    );
    // Node a comes back with its old disk: reads work, writes are refused, nothing is lost.
    let a = Server::start_env(&store_a, &args, &[("NODE_NAME", "node-a")]);
    let out = dir.path().join("out.bin");
    assert_eq!(pull_sha(&a, 1, &out), sha256_file(&inputs[0]));
    let r = a.request(
        "PUT",
        "/v1/series/default/db/versions",
        &[("Content-Type", "application/octet-stream")],
        &random(4096, 2),
    );
    r.assert_error(409, "remote_fenced");
    a.stop();

    // b is lost too; c adopts and takes v3.
    b.stop();
    let c = Server::start_env(&store_c, &adopt, &[("NODE_NAME", "node-c")]);
    push(&c, &inputs[2]);
    c.wait_for("v3 durable", Duration::from_secs(30), |s| {
        durable(s, "default/db") == Some(3)
    });
    c.stop();

    // The adopted pod is scheduled back on b, whose disk holds the copy c superseded.
    let b = Server::start_env(&store_b, &adopt, &[("NODE_NAME", "node-b")]);
    assert!(b.log_text().contains("moving it aside"), "{}", b.log_text());
    for (v, input) in inputs.iter().enumerate() {
        assert_eq!(
            pull_sha(&b, v as u64 + 1, &out),
            sha256_file(input),
            "v{} after the rebuild on b",
            v + 1
        );
    }
    b.stop();
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("b"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("store.superseded-"))
        .collect();
    assert_eq!(aside.len(), 1, "the superseded copy is kept: {aside:?}");
    let listed = ok_json(&[
        "list",
        "--store",
        dir.path().join("b").join(&aside[0]).to_str().unwrap(),
        "--series",
        "default/db",
    ]);
    assert_eq!(
        listed["versions"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    // Giving the store back to node a by hand (docs/operator.md, "Losing a node"): `revault
    // recover` on a, then a's worker serves it and takes backups.
    let back = node_dir("a-back");
    ok_json(&[
        "recover",
        "--remote",
        &u,
        "--key-file",
        k,
        "--store",
        back.to_str().unwrap(),
    ]);
    let a = Server::start_env(&back, &args, &[("NODE_NAME", "node-a")]);
    assert_eq!(pull_sha(&a, 3, &out), sha256_file(&inputs[2]));
    push(&a, &inputs[0]);
    a.wait_for("v4 durable", Duration::from_secs(30), |s| {
        durable(s, "default/db") == Some(4)
    });
    a.stop();
}

/// Adopting a lost node's store whose remote holds nothing (the remote was enabled, the node
/// lost before its first upload): the adopting worker refuses to start rather than serve an
/// empty store under that node's series; no store is created in its directory.
#[test]
fn adopting_a_store_the_remote_does_not_hold_refuses_to_serve_an_empty_one() {
    let url = fresh_url("serve-adopt-empty");
    let u = url.to_string();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, format!("{}\n", "07".repeat(32))).unwrap();
    let store = dir.path().join("b").join("store");
    std::fs::create_dir_all(store.parent().unwrap()).unwrap();
    let mut adopt = remote_args(&u, key.to_str().unwrap());
    adopt.extend(["--recover", "--adopt"]);
    let err = serve_refuses(&store, &adopt, "node-b");
    assert!(
        err.contains("adopting a lost node's store: the remote holds nothing to rebuild it from"),
        "{err}"
    );
    assert!(
        !store.join("revault.store").exists(),
        "no store was created in its place"
    );
}
