//! `revault move` between two real workers: every version arrives with its number, time and
//! kind and restores byte-exact from the destination; the source's copy is deleted only when
//! asked; a move stopped half-way is continued; a destination holding something else is
//! refused and the source keeps everything.

mod common;

use common::server::{client, client_ok, slow_push, wait_child, Server};
use common::tree::{make_tree, tree_listing};
use common::*;

fn push(url: &str, series: &str, input: &str, time: &str) {
    client_ok(
        &[
            "push", "--server", url, "--series", series, "--time", time, input,
        ],
        None,
    );
}

fn pulled(url: &str, series: &str, version: u32, out: &std::path::Path) {
    let v = version.to_string();
    let o = out.to_str().unwrap();
    client_ok(
        &[
            "pull",
            "--server",
            url,
            "--series",
            series,
            "--version",
            &v,
            "-o",
            o,
        ],
        None,
    );
}

/// `(number, time, kind, logicalBytes)` of each version the worker lists.
fn listed(srv: &Server, series: &str) -> Vec<(u64, String, String, u64)> {
    let r = srv.get(&format!("/v1/series/{series}"), None);
    if r.status == 404 {
        return Vec::new();
    }
    let j = r.json();
    j["versionList"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["number"].as_u64().unwrap(),
                v["time"].as_str().unwrap().to_string(),
                v["kind"].as_str().unwrap().to_string(),
                v["logicalBytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn move_json(from: &Server, to: &Server, series: &str, extra: &[&str]) -> serde_json::Value {
    let (f, t) = (from.url(), to.url());
    let mut args = vec!["--json", "move", series, "--from", &f, "--to", &t];
    args.extend_from_slice(extra);
    let out = client_ok(&args, None);
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_moved_series_keeps_its_numbers_times_kinds_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let b = Server::start(&dir.path().join("b"), &[]);
    let s = "team/db";
    // Versions 1 and 2 are streams, 3 a tree; 2 is deleted, so the numbers have a gap.
    let v1 = random(3 << 20, 1);
    let mut v2 = v1.clone();
    v2[1 << 20..(1 << 20) + 4096].copy_from_slice(&random(4096, 2));
    let (f1, f2) = (dir.path().join("v1"), dir.path().join("v2"));
    std::fs::write(&f1, &v1).unwrap();
    std::fs::write(&f2, &v2).unwrap();
    let tree = dir.path().join("tree");
    make_tree(&tree);
    push(&a.url(), s, f1.to_str().unwrap(), "2026-11-01T02:00:00Z");
    push(&a.url(), s, f2.to_str().unwrap(), "2026-11-02T02:00:00Z");
    push(&a.url(), s, tree.to_str().unwrap(), "2026-11-03T02:00:00Z");
    assert_eq!(
        a.request("DELETE", &format!("/v1/series/{s}/versions/2"), &[], b"")
            .status,
        200
    );
    let rules = br#"{"keep":7,"live":1,"auto":true}"#;
    let r = a.request(
        "PUT",
        &format!("/v1/series/{s}/retention"),
        &[("Content-Type", "application/json")],
        rules,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let before = listed(&a, s);
    assert_eq!(before.iter().map(|v| v.0).collect::<Vec<_>>(), [1, 3]);

    let rep = move_json(&a, &b, s, &[]);
    assert_eq!(
        (rep["versions"].as_u64(), rep["copied"].as_u64()),
        (Some(2), Some(2)),
        "{rep}"
    );

    assert_eq!(listed(&b, s), before, "numbers, times, kinds and sizes");
    let got = dir.path().join("got1");
    pulled(&b.url(), s, 1, &got);
    assert!(
        std::fs::read(&got).unwrap() == v1,
        "version 1 restores byte-exact"
    );
    let back = dir.path().join("back");
    pulled(&b.url(), s, 3, &back);
    assert_eq!(
        tree_listing(&back),
        tree_listing(&tree),
        "version 3 restores the tree"
    );
    let r = b.get(&format!("/v1/series/{s}"), None).json();
    assert_eq!(r["retention"]["keep"], 7, "retention came along: {r}");
    // The source's copy is gone, and a later push to the destination takes the next number.
    assert!(
        listed(&a, s).is_empty(),
        "the source still lists {:?}",
        listed(&a, s)
    );
    // It refuses the series' backups, naming the destination.
    let au = a.url();
    let out = client(
        &["push", "--server", &au, "--series", s, f1.to_str().unwrap()],
        None,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("moved to {}", b.url())),
        "{err}"
    );
    let ct = [("Content-Type", "application/octet-stream")];
    a.request("PUT", &format!("/v1/series/{s}/versions"), &ct, b"late")
        .assert_error(409, "series_moved");
    assert_eq!(
        a.get(&format!("/v1/series/{s}"), None).json()["movedTo"],
        b.url()
    );
    push(&b.url(), s, f2.to_str().unwrap(), "2026-11-04T02:00:00Z");
    assert_eq!(listed(&b, s).last().unwrap().0, 4);
}

#[test]
fn a_move_kept_at_the_source_is_continued_and_checked_again() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let b = Server::start(&dir.path().join("b"), &[]);
    let s = "team/db";
    let f = dir.path().join("f");
    std::fs::write(&f, random(2 << 20, 5)).unwrap();
    let au = a.url();
    client_ok(
        &[
            "push",
            "--server",
            &au,
            "--series",
            s,
            "--unit",
            "chunk",
            f.to_str().unwrap(),
        ],
        None,
    );
    let rep = move_json(&a, &b, s, &["--keep-source"]);
    assert_eq!(rep["copied"], 1, "{rep}");
    let unit = b.get(&format!("/v1/series/{s}"), None).json()["unit"].clone();
    assert_eq!(unit, "chunk", "the series keeps its dedup unit");
    assert_eq!(
        listed(&a, s).len(),
        1,
        "--keep-source keeps the source's copy"
    );
    // The source took another backup (the move was stopped before the switch): the next run
    // copies only what is missing, and checks every version again.
    let g = dir.path().join("g");
    std::fs::write(&g, random(2 << 20, 6)).unwrap();
    push(&a.url(), s, g.to_str().unwrap(), "2026-11-02T02:00:00Z");
    let rep = move_json(&a, &b, s, &["--keep-source"]);
    assert_eq!(
        (rep["copied"].as_u64(), rep["alreadyThere"].as_u64()),
        (Some(1), Some(1)),
        "{rep}"
    );
    assert_eq!(listed(&b, s), listed(&a, s));
    let got = dir.path().join("got");
    pulled(&b.url(), s, 2, &got);
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&g).unwrap());
}

#[test]
fn a_destination_holding_another_history_is_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let b = Server::start(&dir.path().join("b"), &[]);
    let s = "team/db";
    let (f, g) = (dir.path().join("f"), dir.path().join("g"));
    std::fs::write(&f, random(1 << 20, 8)).unwrap();
    std::fs::write(&g, random(1 << 19, 9)).unwrap();
    push(&a.url(), s, f.to_str().unwrap(), "2026-11-01T02:00:00Z");
    push(&b.url(), s, g.to_str().unwrap(), "2026-11-01T02:00:00Z");
    let (au, bu) = (a.url(), b.url());
    let out = client(&["move", s, "--from", &au, "--to", &bu], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already holds version 1 of team/db, which is not the source's"),
        "{err}"
    );
    let got = dir.path().join("got");
    pulled(&a.url(), s, 1, &got);
    assert!(
        std::fs::read(&got).unwrap() == std::fs::read(&f).unwrap(),
        "the source keeps its copy"
    );
    // Moving to the same worker, or a series the source lacks, says so.
    let out = client(&["move", s, "--from", &au, "--to", &au], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the same worker"));
    let out = client(&["move", "team/none", "--from", &au, "--to", &bu], None);
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not hold series team/none"));
}

#[test]
fn an_explicit_version_number_below_the_next_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let s = "team/db";
    let path = format!("/v1/series/{s}/versions?version=5");
    let ct = [("Content-Type", "application/octet-stream")];
    let r = a.request("PUT", &path, &ct, &random(1000, 1));
    assert_eq!(
        (r.status, r.json()["version"].as_u64()),
        (201, Some(5)),
        "{}",
        r.text()
    );
    let r = a.request(
        "PUT",
        &format!("/v1/series/{s}/versions?version=5"),
        &ct,
        b"again",
    );
    r.assert_error(400, "invalid_argument");
    assert!(
        r.text().contains("numbered from 6 to 2147483647"),
        "{}",
        r.text()
    );
    let r = a.request("PUT", &format!("/v1/series/{s}/versions"), &ct, b"next");
    assert_eq!(r.json()["version"], 6, "{}", r.text());
    // A number near the top would make later numbers wrap onto existing versions: refused.
    for big in ["4294967294", "2147483648"] {
        let r = a.request(
            "PUT",
            &format!("/v1/series/{s}/versions?version={big}"),
            &ct,
            b"x",
        );
        r.assert_error(400, "invalid_argument");
    }
    let r = a.request(
        "PUT",
        &format!("/v1/series/{s}/versions?version=2147483647"),
        &ct,
        b"top",
    );
    assert_eq!(r.json()["version"], 2147483647u32, "{}", r.text());
    let r = a.request(
        "PUT",
        &format!("/v1/series/{s}/versions"),
        &ct,
        b"after the top",
    );
    assert_eq!(
        r.json()["version"],
        2147483648u32,
        "plain numbering goes on: {}",
        r.text()
    );
    let r = a.get(&format!("/v1/series/{s}/versions/6"), None);
    assert_eq!(r.body, b"next", "version 6 is untouched");
}

#[test]
fn a_version_expired_on_the_source_since_an_earlier_copy_is_pruned_from_the_destination_only_when_asked(
) {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let b = Server::start(&dir.path().join("b"), &[]);
    let s = "team/db";
    for (i, day) in ["01", "02"].iter().enumerate() {
        let f = dir.path().join(format!("f{i}"));
        std::fs::write(&f, random(1 << 20, 20 + i as u64)).unwrap();
        push(
            &a.url(),
            s,
            f.to_str().unwrap(),
            &format!("2026-11-{day}T02:00:00Z"),
        );
    }
    move_json(&a, &b, s, &["--keep-source"]);
    // Retention on the source expires version 1 before the copy is finished.
    assert_eq!(
        a.request("DELETE", &format!("/v1/series/{s}/versions/1"), &[], b"")
            .status,
        200
    );
    let (au, bu) = (a.url(), b.url());
    let out = client(
        &["move", s, "--from", &au, "--to", &bu, "--keep-source"],
        None,
    );
    assert!(
        !out.status.success(),
        "a destination holding another version is refused"
    );
    let rep = move_json(&a, &b, s, &["--keep-source", "--prune-destination"]);
    assert_eq!(
        (rep["copied"].as_u64(), rep["alreadyThere"].as_u64()),
        (Some(0), Some(1)),
        "{rep}"
    );
    assert_eq!(listed(&b, s), listed(&a, s));
}

/// A destination busy with other backups queues the move's copies for a slot like any backup
/// (reading nothing meanwhile); the move waits its turn and every version arrives byte-exact.
#[test]
fn a_move_into_a_busy_destination_waits_for_a_slot() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(&dir.path().join("a"), &[]);
    let b = Server::start(&dir.path().join("b"), &["--max-backups", "1"]);
    let s = "team/db";
    let v1 = random(3 << 20, 41);
    let f1 = dir.path().join("v1");
    std::fs::write(&f1, &v1).unwrap();
    push(&a.url(), s, f1.to_str().unwrap(), "2026-01-01T00:00:00Z");

    let before = listed(&a, s);
    // Another series' backup holds b's only slot.
    let mut holder = slow_push(&b.url(), "team/other", None);
    let mut input = holder.stdin.take().unwrap();
    input.write_all(&random(1 << 20, 42)).unwrap();
    b.wait_for(
        "the holder to run",
        std::time::Duration::from_secs(30),
        |b| b.get("/v1/series/team/other/backup", None).json()["running"] == true,
    );
    let (from, to) = (a, b);
    let mover = {
        let (f, t) = (from.url(), to.url());
        std::thread::spawn(move || client(&["--json", "move", s, "--from", &f, "--to", &t], None))
    };
    to.wait_for(
        "the copy to queue",
        std::time::Duration::from_secs(30),
        |b| b.get(&format!("/v1/series/{s}/backup"), None).json()["queued"] == true,
    );
    assert!(!mover.is_finished(), "the move did not wait for its slot");
    drop(input);
    let held = wait_child(holder, std::time::Duration::from_secs(60));
    assert!(
        held.status.success(),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );

    let out = mover.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(listed(&to, s), before);
    assert!(listed(&from, s).is_empty(), "the source's copy was deleted");
    let got = dir.path().join("got");
    pulled(&to.url(), s, 1, &got);
    assert!(
        std::fs::read(&got).unwrap() == v1,
        "version 1 restores byte-exact"
    );
}
