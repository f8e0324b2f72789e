//! Hostile trees through the real binary: a tar upload that cannot be one
//! directory tree is refused with a 400 naming the member, and a hostile
//! catalog already in a store (as an older build could have stored it)
//! restores with `revault restore -o DIR/` and `revault pull -o DIR/` (both
//! transfers) to an error naming the entry, with nothing written outside DIR.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::server::{client, Server};
use common::*;
use revault_engine::{
    backup,
    catalog::{Entry, Kind},
    BackupOptions, OpenMode, Source, Store,
};

const VICTIM: &[u8] = b"precious bytes outside the restore";
const VICTIM_MTIME: i64 = 1_500_000_000;
const PWNED: &[u8] = b"planted by a hostile catalog";

/// A test directory holding the store, the restore targets, a `canary/`
/// directory hostile symlinks point to and a `victim.txt` hostile hard
/// links name.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("canary")).unwrap();
        fs::create_dir(dir.path().join("srv")).unwrap();
        fs::create_dir(dir.path().join("targets")).unwrap();
        let victim = dir.path().join("victim.txt");
        fs::write(&victim, VICTIM).unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o640)).unwrap();
        filetime_set(&victim, VICTIM_MTIME);
        Scene { dir }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("srv/store")
    }

    fn canary(&self) -> PathBuf {
        self.dir.path().join("canary")
    }

    fn victim(&self) -> PathBuf {
        self.dir.path().join("victim.txt")
    }

    fn target(&self, name: &str) -> PathBuf {
        self.dir.path().join("targets").join(name)
    }

    /// Nothing outside the targets changed.
    fn assert_untouched(&self, case: &str, targets: &[String]) {
        let names = |p: &Path| {
            let mut v: Vec<String> = fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(self.dir.path()),
            ["canary", "srv", "targets", "victim.txt"],
            "{case}"
        );
        // A target may not even be made: a catalog is checked first.
        for n in names(&self.dir.path().join("targets")) {
            assert!(targets.contains(&n), "{case}: {n} made beside the targets");
        }
        assert!(
            names(&self.canary()).is_empty(),
            "{case}: wrote into the canary"
        );
        let m = fs::symlink_metadata(self.victim()).unwrap();
        assert_eq!(fs::read(self.victim()).unwrap(), VICTIM, "{case}");
        assert_eq!(m.mode() & 0o7777, 0o640, "{case}");
        assert_eq!(m.mtime(), VICTIM_MTIME, "{case}");
        assert_eq!(m.nlink(), 1, "{case}: the victim was hard-linked");
    }
}

fn filetime_set(p: &Path, secs: i64) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    assert_eq!(
        // SAFETY: `c` is a NUL-terminated path and the array holds the two times utimensat reads.
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) },
        0
    );
}

/// A tree source that hands the engine a catalog as it is, the way a store
/// written by an older build may hold it. Every file holds `PWNED`.
struct CatalogSource {
    entries: Vec<Entry>,
    pieces: usize,
    started: usize,
    pos: usize,
}

impl Source for CatalogSource {
    fn next_piece(&mut self) -> revault_engine::Result<bool> {
        if self.started == self.pieces {
            return Ok(false);
        }
        self.started += 1;
        self.pos = 0;
        Ok(true)
    }

    fn read(&mut self, buf: &mut [u8]) -> revault_engine::Result<usize> {
        if self.started == 0 {
            return Ok(0);
        }
        let rest = &PWNED[self.pos..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        Ok(n)
    }

    fn finish(self: Box<Self>) -> revault_engine::Result<Option<Vec<Entry>>> {
        Ok(Some(self.entries))
    }
}

fn entry(path: &str, kind: Kind, link: &str) -> Entry {
    let mut e = Entry::new(path.as_bytes().to_vec(), kind);
    e.link = link.as_bytes().to_vec();
    e.mode = if kind == Kind::Dir { 0o755 } else { 0o644 };
    if kind == Kind::File {
        e.size = PWNED.len() as u64;
        e.data_len = e.size;
    }
    e
}

/// Stores `entries` as the only version of `series`.
fn store_catalog(store: &Path, series: &str, entries: Vec<Entry>) {
    let s = Store::open(store, OpenMode::ReadWrite, "hostile test").unwrap();
    let pieces = entries.iter().filter(|e| e.kind == Kind::File).count();
    let src = CatalogSource {
        entries,
        pieces,
        started: 0,
        pos: 0,
    };
    backup(&s, series, Box::new(src), &BackupOptions::default()).unwrap();
}

/// The hostile catalogs: (series, entries, a name the error must contain).
fn hostile_catalogs(sc: &Scene) -> Vec<(&'static str, Vec<Entry>, &'static str)> {
    let canary = sc.canary().to_str().unwrap().to_string();
    let top = sc.dir.path().to_str().unwrap().to_string();
    let victim = sc.victim().to_str().unwrap().to_string();
    use Kind::*;
    vec![
        (
            "default/symlink-then-child",
            vec![
                entry("", Dir, ""),
                entry("dir", Dir, ""),
                entry("dir/evil", Symlink, &canary),
                entry("dir/evil/planted", File, ""),
            ],
            "dir/evil/planted",
        ),
        (
            "default/dir-below-symlink",
            vec![
                entry("", Dir, ""),
                entry("evil", Symlink, "../../canary"),
                entry("evil/sub", Dir, ""),
                entry("evil/sub/planted", File, ""),
            ],
            "evil/sub",
        ),
        (
            "default/hardlink-through-symlink",
            vec![
                entry("", Dir, ""),
                entry("s", Symlink, &top),
                entry("h", Hardlink, "s/victim.txt"),
            ],
            "\"h\"",
        ),
        (
            "default/hardlink-absolute",
            vec![entry("", Dir, ""), entry("h", Hardlink, &victim)],
            "\"h\"",
        ),
        (
            "default/dotdot-member",
            vec![entry("", Dir, ""), entry("../planted", File, "")],
            "../planted",
        ),
    ]
}

#[test]
fn a_hostile_catalog_in_the_store_writes_nothing_outside_the_target() {
    let sc = Scene::new();
    let store = sc.store();
    init(&store);
    let cases = hostile_catalogs(&sc);
    for (series, entries, _) in &cases {
        store_catalog(&store, series, entries.clone());
    }
    let mut targets = Vec::new();
    let store_s = store.to_str().unwrap();
    // Offline restore.
    for (series, _, name) in &cases {
        let t = format!("restore-{}", series.replace('/', "-"));
        let out = format!("{}/", sc.target(&t).display());
        let args = [
            "restore", "--store", store_s, "--series", series, "-o", &out,
        ];
        let err = fails(&args);
        targets.push(t);
        assert!(err.contains(name), "{series}: restore said {err}");
        sc.assert_untouched(&format!("restore {series}"), &targets);
    }
    // Through the server, both ways.
    let srv = Server::start(&store, &[]);
    let url = srv.url();
    for (series, _, name) in &cases {
        for transfer in ["blocks", "bytes"] {
            let t = format!("pull-{transfer}-{}", series.replace('/', "-"));
            let out = format!("{}/", sc.target(&t).display());
            let args = [
                "pull",
                "--server",
                &url,
                "--series",
                series,
                "-o",
                &out,
                "--transfer",
                transfer,
            ];
            let o = client(&args, None);
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            assert!(
                !o.status.success(),
                "{series} {transfer}: the pull succeeded"
            );
            targets.push(t);
            assert!(err.contains(name), "{series} {transfer}: pull said {err}");
            sc.assert_untouched(&format!("pull {transfer} {series}"), &targets);
        }
    }
    srv.stop();
}

/// One tar member with its name copied byte for byte into a GNU header.
fn member(name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

#[test]
fn a_hostile_tar_upload_is_refused_with_a_400_naming_the_member() {
    use tar::EntryType as T;
    let sc = Scene::new();
    let srv = Server::start(&sc.store(), &[]);
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "evil-child",
            vec![
                member("dir/", T::Directory, "", b""),
                member("dir/evil", T::Symlink, "/tmp", b""),
                member("dir/evil/planted", T::Regular, "", PWNED),
            ],
            "dir/evil/planted",
        ),
        (
            "evil-hardlink",
            vec![
                member("s", T::Symlink, "/etc", b""),
                member("h", T::Link, "s/shadow", b""),
            ],
            "\"h\"",
        ),
        (
            "duplicate",
            vec![
                member("f", T::Regular, "", PWNED),
                member("f", T::Symlink, "/etc/passwd", b""),
            ],
            "\"f\"",
        ),
    ];
    for (name, members, needle) in cases {
        let mut body = members.concat();
        body.extend_from_slice(&[0u8; 1024]);
        let r = srv.request(
            "PUT",
            &format!("/v1/series/default/{name}/versions"),
            &[("Content-Type", "application/x-tar")],
            &body,
        );
        r.assert_error(400, "invalid_argument");
        let msg = r.json()["message"].as_str().unwrap().to_string();
        assert!(msg.contains(needle), "{name}: {msg}");
        srv.get(&format!("/v1/series/default/{name}"), None)
            .assert_error(404, "unknown_series");
    }
    srv.stop();
}
