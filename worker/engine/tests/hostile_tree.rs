//! Hostile directory trees: a restore writes nothing outside its target,
//! whatever the catalog holds (a store written by an older build may hold
//! anything), and a tar upload that cannot be one directory tree is refused
//! at backup time with an error naming the member.
//!
//! Every restore here runs in a scene: the target `out/` beside a `canary/`
//! directory (the target of hostile symlinks, which must stay empty) and a
//! `victim.txt` file (the target of hostile hard links, whose contents, mode,
//! mtime and link count must not change).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use revault_engine::{
    catalog::{Entry, Kind},
    tar::TarSource,
    Source, TreeWriter,
};

const VICTIM: &[u8] = b"precious bytes outside the restore";
const VICTIM_MTIME: i64 = 1_500_000_000;

struct Scene {
    dir: tempfile::TempDir,
    out: PathBuf,
    canary: PathBuf,
    victim: PathBuf,
}

fn scene() -> Scene {
    let dir = tempfile::tempdir().unwrap();
    let canary = dir.path().join("canary");
    fs::create_dir(&canary).unwrap();
    let victim = dir.path().join("victim.txt");
    fs::write(&victim, VICTIM).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o640)).unwrap();
    filetime::set_file_mtime(&victim, filetime::FileTime::from_unix_time(VICTIM_MTIME, 0)).unwrap();
    Scene {
        out: dir.path().join("out"),
        canary,
        victim,
        dir,
    }
}

impl Scene {
    fn canary_str(&self) -> &str {
        self.canary.to_str().unwrap()
    }

    fn victim_str(&self) -> &str {
        self.victim.to_str().unwrap()
    }

    /// Nothing outside `out/` changed: no new names beside it, the canary is
    /// empty, the victim is as it was.
    fn assert_untouched(&self, case: &str) {
        let mut names: Vec<String> = fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "out")
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["canary", "victim.txt"],
            "{case}: new names beside the target"
        );
        let planted: Vec<_> = fs::read_dir(&self.canary)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            planted.is_empty(),
            "{case}: wrote outside the target: {planted:?}"
        );
        let m = fs::symlink_metadata(&self.victim).unwrap();
        assert_eq!(
            fs::read(&self.victim).unwrap(),
            VICTIM,
            "{case}: victim rewritten"
        );
        assert_eq!(m.mode() & 0o7777, 0o640, "{case}: victim's mode changed");
        assert_eq!(m.mtime(), VICTIM_MTIME, "{case}: victim's mtime changed");
        assert_eq!(m.nlink(), 1, "{case}: victim was hard-linked");
        let c = fs::metadata(&self.canary).unwrap();
        assert_eq!(c.mode() & 0o7777, 0o755, "{case}: canary's mode changed");
    }
}

fn dir(p: &str) -> Entry {
    let mut e = Entry::new(p.as_bytes().to_vec(), Kind::Dir);
    e.mode = 0o755;
    e
}

/// A regular file holding `PWNED`.
fn file(p: &str) -> Entry {
    let mut e = Entry::new(p.as_bytes().to_vec(), Kind::File);
    e.size = PWNED.len() as u64;
    e.data_len = e.size;
    e
}

fn symlink(p: &str, target: &str) -> Entry {
    let mut e = Entry::new(p.as_bytes().to_vec(), Kind::Symlink);
    e.link = target.as_bytes().to_vec();
    e.mode = 0o777;
    e
}

fn hardlink(p: &str, target: &str) -> Entry {
    let mut e = Entry::new(p.as_bytes().to_vec(), Kind::Hardlink);
    e.link = target.as_bytes().to_vec();
    e
}

fn special(p: &str, kind: Kind, rdev: u64) -> Entry {
    let mut e = Entry::new(p.as_bytes().to_vec(), kind);
    e.rdev = rdev;
    e.mode = 0o600;
    e
}

const PWNED: &[u8] = b"planted by a hostile catalog";

/// A catalog and its data stream: each file's `data_len` bytes of `PWNED`.
fn catalog(entries: Vec<Entry>) -> (Vec<Entry>, Vec<u8>) {
    let mut data = Vec::new();
    for e in entries.iter().filter(|e| e.kind == Kind::File) {
        data.extend_from_slice(&PWNED[..e.data_len as usize]);
    }
    (entries, data)
}

/// Restores a catalog with the directory writer, in a thread with a time
/// limit: a writer that opened a FIFO would block forever.
fn restore(out: &Path, entries: Vec<Entry>) -> Result<Vec<String>, String> {
    let (entries, data) = catalog(entries);
    let out = out.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| {
            let mut w = TreeWriter::new(&out, entries).map_err(|e| e.to_string())?;
            w.write_all(&data).map_err(|e| e.to_string())?;
            w.finish().map_err(|e| e.to_string())
        })();
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the restore hung (did it open a FIFO?)")
        }
        Err(e) => panic!("the restore thread panicked: {e}"),
    }
}

/// Asserts that restoring `entries` fails with an error naming `names`, and
/// that nothing outside the target changed.
fn refused(case: &str, entries: Vec<Entry>, names: &[&str]) {
    let s = scene();
    let r = restore(&s.out, entries);
    s.assert_untouched(case);
    let e = match r {
        Err(e) => e,
        Ok(w) => panic!("{case}: the restore succeeded (warnings {w:?})"),
    };
    for n in names {
        assert!(e.contains(n), "{case}: the error does not name {n:?}: {e}");
    }
}

#[test]
fn a_symlink_then_an_entry_beneath_it_writes_nothing_outside() {
    let s = scene();
    let canary = s.canary_str().to_string();
    // From out/dir/evil, "../../canary" is the canary beside out/.
    let targets = [canary.as_str(), "../../canary"];
    for target in targets {
        let beneath: Vec<(&str, Vec<Entry>)> = vec![
            ("a file", vec![file("dir/evil/file")]),
            ("a directory", vec![dir("dir/evil/sub")]),
            (
                "a file deeper down",
                vec![dir("dir/evil/a"), file("dir/evil/a/file")],
            ),
            ("a symlink", vec![symlink("dir/evil/file", "/etc/passwd")]),
            ("a FIFO", vec![special("dir/evil/file", Kind::Fifo, 0)]),
            (
                "a hard link",
                vec![file("f"), hardlink("dir/evil/file", "f")],
            ),
            // A path with an empty component walks through the symlink too.
            ("a file through '//'", vec![file("dir/evil//file")]),
        ];
        for (what, rest) in beneath {
            let case = format!("symlink to {target} then {what}");
            let mut es = vec![dir(""), dir("dir"), symlink("dir/evil", target)];
            es.extend(rest);
            refused(&case, es, &["dir/evil"]);
        }
    }
    // A relative symlink that climbs out with "..".
    refused(
        "symlink ../canary at the top",
        vec![symlink("up", "../canary"), file("up/planted")],
        &["up/planted"],
    );
}

#[test]
fn hard_links_may_only_name_an_earlier_regular_file() {
    let s = scene();
    let scene_dir = s.dir.path().to_str().unwrap().to_string();
    let victim = s.victim_str().to_string();
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        (
            "through a symlink",
            vec![symlink("s", &scene_dir), hardlink("h", "s/victim.txt")],
        ),
        ("to an absolute path", vec![hardlink("h", &victim)]),
        ("with '..'", vec![hardlink("h", "../victim.txt")]),
        (
            "with '..' inside",
            vec![dir("d"), hardlink("h", "d/../../victim.txt")],
        ),
        (
            "to a symlink",
            vec![symlink("s", &victim), hardlink("h", "s")],
        ),
        ("to a directory", vec![dir("d"), hardlink("h", "d")]),
        ("to the root", vec![hardlink("h", "")]),
        (
            "to a FIFO",
            vec![special("p", Kind::Fifo, 0), hardlink("h", "p")],
        ),
        (
            "to a character device",
            vec![
                special("null", Kind::CharDev, makedev(1, 3)),
                hardlink("h", "null"),
            ],
        ),
        ("to a later file", vec![hardlink("h", "f"), file("f")]),
        ("to a missing file", vec![hardlink("h", "nothing")]),
        ("to itself", vec![hardlink("h", "h")]),
    ];
    for (what, es) in cases {
        refused(&format!("a hard link {what}"), es, &["\"h\""]);
    }
}

#[test]
fn unsafe_member_paths_are_refused() {
    let s = scene();
    let inside_canary = format!("{}/planted", s.canary_str());
    for p in [
        "../planted",
        "../canary/planted",
        "a/../../canary/planted",
        inside_canary.as_str(),
        "./a",
        "a/.",
        "a//b",
        "a/",
    ] {
        refused(&format!("path {p:?}"), vec![file(p)], &[p]);
    }
    // The root itself must be a directory.
    refused(
        "the root as a symlink",
        vec![symlink("", s.canary_str())],
        &["root"],
    );
    refused("the root as a file", vec![file("")], &["root"]);
}

#[test]
fn duplicate_paths_are_refused_in_every_combination() {
    let s = scene();
    let canary = s.canary_str().to_string();
    let kinds: Vec<(&str, Entry)> = vec![
        ("file", file("x")),
        (
            "empty file",
            file("x").tap(|e| {
                e.size = 0;
                e.data_len = 0;
            }),
        ),
        ("symlink", symlink("x", &canary)),
        ("directory", dir("x")),
        ("hard link", hardlink("x", "first")),
        ("FIFO", special("x", Kind::Fifo, 0)),
    ];
    for (a, ea) in &kinds {
        for (b, eb) in &kinds {
            let case = format!("{a} then {b}");
            let es = vec![file("first"), ea.clone(), eb.clone()];
            if ea.kind == Kind::Dir && eb.kind == Kind::Dir {
                // A directory listed twice is an ordinary tar: restored once.
                let s = scene();
                restore(&s.out, es).unwrap_or_else(|e| panic!("{case}: {e}"));
                assert!(fs::symlink_metadata(s.out.join("x")).unwrap().is_dir());
                s.assert_untouched(&case);
                continue;
            }
            refused(&case, es, &["\"x\""]);
        }
    }
    // A directory implied by its children, then listed as something else.
    refused(
        "a/b then a as a symlink",
        vec![file("a/b"), symlink("a", &canary)],
        &["\"a\""],
    );
}

trait Tap: Sized {
    fn tap(self, f: impl FnOnce(&mut Self)) -> Self;
}

impl Tap for Entry {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}

fn makedev(major: u32, minor: u32) -> u64 {
    libc::makedev(major, minor)
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn device_nodes_and_fifos_are_made_never_opened() {
    let s = scene();
    let es = vec![
        dir(""),
        special("pipe", Kind::Fifo, 0).tap(|e| e.mode = 0o640),
        special("null", Kind::CharDev, makedev(1, 3)).tap(|e| e.mode = 0o666),
        file("after"),
    ];
    let warnings = restore(&s.out, es).unwrap();
    s.assert_untouched("devices");
    let p = fs::symlink_metadata(s.out.join("pipe")).unwrap();
    assert!(p.file_type().is_fifo());
    assert_eq!(p.mode() & 0o7777, 0o640);
    assert_eq!(fs::read(s.out.join("after")).unwrap(), PWNED);
    if is_root() {
        let n = fs::symlink_metadata(s.out.join("null")).unwrap();
        assert!(n.file_type().is_char_device());
        assert_eq!(n.rdev(), makedev(1, 3));
        assert_eq!(n.mode() & 0o7777, 0o666);
        assert!(warnings.is_empty(), "{warnings:?}");
    } else {
        assert!(warnings.iter().any(|w| w.contains("null")), "{warnings:?}");
    }
    // Data for a path that is a FIFO or a device never reaches it.
    refused(
        "a file over a FIFO",
        vec![special("p", Kind::Fifo, 0), file("p")],
        &["\"p\""],
    );
    refused(
        "a file over a device",
        vec![special("z", Kind::CharDev, makedev(1, 5)), file("z")],
        &["\"z\""],
    );
    refused(
        "a file below a FIFO",
        vec![special("p", Kind::Fifo, 0), file("p/x")],
        &["p/x"],
    );
}

#[test]
fn modes_and_owners_apply_only_to_what_the_restore_made() {
    let s = scene();
    let es = vec![
        dir("").tap(|e| e.mode = 0o750),
        file("bin").tap(|e| {
            e.mode = 0o4755;
            e.mtime_sec = 1_234_567_890;
        }),
        // A symlink's mode means nothing and is never applied through it.
        symlink("to-victim", s.victim_str()).tap(|e| {
            e.mode = 0o7777;
            e.mtime_sec = 1_111_111_111;
        }),
        // A hard link shares its first path's inode: its own mode is ignored.
        hardlink("bin2", "bin").tap(|e| e.mode = 0o777),
        dir("ro").tap(|e| e.mode = 0o555),
        file("ro/inside").tap(|e| e.mode = 0o400),
    ];
    restore(&s.out, es).unwrap();
    s.assert_untouched("modes");
    let bin = fs::metadata(s.out.join("bin")).unwrap();
    assert_eq!(bin.mode() & 0o7777, 0o4755);
    assert_eq!(bin.mtime(), 1_234_567_890);
    assert_eq!(bin.nlink(), 2);
    assert_eq!(fs::read(s.out.join("bin2")).unwrap(), PWNED);
    let l = fs::symlink_metadata(s.out.join("to-victim")).unwrap();
    assert!(l.file_type().is_symlink());
    assert_eq!(l.mtime(), 1_111_111_111);
    assert_eq!(
        fs::read_link(s.out.join("to-victim")).unwrap(),
        Path::new(s.victim_str())
    );
    assert_eq!(
        fs::metadata(s.out.join("ro")).unwrap().mode() & 0o7777,
        0o555
    );
    assert_eq!(fs::read(s.out.join("ro/inside")).unwrap(), PWNED);
    assert_eq!(fs::metadata(&s.out).unwrap().mode() & 0o7777, 0o750);
    // Let the temporary directory be removed.
    fs::set_permissions(s.out.join("ro"), fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn unlisted_parents_are_made_and_a_directory_may_follow_its_children() {
    let s = scene();
    let es = vec![
        file("a/b/c.txt"),
        dir("a/b").tap(|e| {
            e.mode = 0o705;
            e.mtime_sec = 1_000_000_000;
        }),
        file("z/y.txt"),
    ];
    restore(&s.out, es).unwrap();
    s.assert_untouched("parents");
    assert_eq!(fs::read(s.out.join("a/b/c.txt")).unwrap(), PWNED);
    assert_eq!(fs::read(s.out.join("z/y.txt")).unwrap(), PWNED);
    let b = fs::metadata(s.out.join("a/b")).unwrap();
    assert_eq!(b.mode() & 0o7777, 0o705);
    assert_eq!(b.mtime(), 1_000_000_000);
    assert!(fs::metadata(s.out.join("a")).unwrap().is_dir());
}

#[test]
fn deep_trees_restore_with_directories_opened_again_when_needed() {
    // Deeper than the writer keeps directory descriptors open, then back up
    // and down again, so closed levels are opened again on the way.
    let s = scene();
    let deep = |n: usize| vec!["d"; n].join("/");
    let mut es = vec![dir("")];
    for n in 1..=300 {
        es.push(dir(&deep(n)).tap(|e| e.mtime_sec = 1_000_000_000 + n as i64));
    }
    es.push(file(&format!("{}/bottom", deep(300))));
    es.push(file(&format!("{}/middle", deep(100))));
    es.push(file(&format!("{}/again", deep(299))));
    restore(&s.out, es).unwrap();
    s.assert_untouched("deep");
    for f in [
        format!("{}/bottom", deep(300)),
        format!("{}/middle", deep(100)),
        format!("{}/again", deep(299)),
    ] {
        assert_eq!(fs::read(s.out.join(&f)).unwrap(), PWNED, "{f}");
    }
    for n in [1, 64, 65, 200, 300] {
        let m = fs::metadata(s.out.join(deep(n))).unwrap();
        assert_eq!(m.mtime(), 1_000_000_000 + n as i64, "depth {n}");
        assert_eq!(m.mode() & 0o7777, 0o755, "depth {n}");
    }
}

#[test]
fn an_error_part_way_keeps_what_was_written_and_names_the_entry() {
    // `lost+found` may already be in the target; a catalog entry that
    // collides with it fails there, after the entries before it.
    let s = scene();
    fs::create_dir_all(s.out.join("lost+found")).unwrap();
    let r = restore(
        &s.out,
        vec![dir(""), file("a"), file("lost+found"), file("b")],
    );
    let e = r.unwrap_err();
    assert!(e.contains("lost+found"), "{e}");
    assert_eq!(fs::read(s.out.join("a")).unwrap(), PWNED);
    assert!(!s.out.join("b").exists());
    s.assert_untouched("part-way");
}

// ---- Tar uploads: refused at backup time, or accepted as they always were.

/// One tar member with its name and link name copied byte for byte into a
/// GNU header (the `tar` crate's builder would refuse some of these names).
fn member(name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    h.set_mtime(1_700_000_000);
    h.set_size(data.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn tarball(members: &[Vec<u8>]) -> Vec<u8> {
    let mut t: Vec<u8> = members.concat();
    t.extend_from_slice(&[0u8; 1024]);
    t
}

use tar::EntryType as T;

fn reg(name: &str) -> Vec<u8> {
    member(name, T::Regular, "", PWNED)
}

/// Reads a tar as a backup would: (catalog, data) or the error.
fn read_tar(t: &[u8]) -> Result<(Vec<Entry>, Vec<u8>), String> {
    let mut src: Box<dyn Source + '_> = Box::new(TarSource::new("upload.tar", t));
    let mut data = Vec::new();
    let mut buf = vec![0u8; 4096];
    while src.next_piece().map_err(|e| e.to_string())? {
        loop {
            let n = src.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
    }
    Ok((src.finish().map_err(|e| e.to_string())?.unwrap(), data))
}

#[test]
fn impossible_trees_are_refused_at_backup_time() {
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "an entry below a symlink",
            vec![
                member("dir/", T::Directory, "", b""),
                member("dir/evil", T::Symlink, "/tmp", b""),
                reg("dir/evil/file"),
            ],
            "dir/evil/file",
        ),
        (
            "an entry below a symlink, with ./",
            vec![member("./evil", T::Symlink, "../..", b""), reg("./evil/x")],
            "evil/x",
        ),
        (
            "a directory below a symlink",
            vec![
                member("evil", T::Symlink, "/etc", b""),
                member("evil/cron.d/", T::Directory, "", b""),
            ],
            "evil/cron.d",
        ),
        ("an entry below a file", vec![reg("f"), reg("f/x")], "f/x"),
        (
            "an entry below a hard link",
            vec![reg("f"), member("h", T::Link, "f", b""), reg("h/x")],
            "h/x",
        ),
        (
            "an entry below a FIFO",
            vec![member("p", T::Fifo, "", b""), reg("p/x")],
            "p/x",
        ),
        ("a file twice", vec![reg("f"), reg("f")], "\"f\""),
        (
            "a file then a directory",
            vec![reg("f"), member("f/", T::Directory, "", b"")],
            "\"f\"",
        ),
        (
            "a directory then a file",
            vec![member("d/", T::Directory, "", b""), reg("d")],
            "\"d\"",
        ),
        (
            "an implied directory then a symlink",
            vec![reg("d/f"), member("d", T::Symlink, "/tmp", b"")],
            "\"d\"",
        ),
        (
            "a symlink then a file",
            vec![member("s", T::Symlink, "/etc/passwd", b""), reg("s")],
            "\"s\"",
        ),
        (
            "a hard link twice",
            vec![
                reg("f"),
                member("h", T::Link, "f", b""),
                member("h", T::Link, "f", b""),
            ],
            "\"h\"",
        ),
        (
            "a hard link to a missing file",
            vec![member("h", T::Link, "nothing", b"")],
            "\"h\"",
        ),
        (
            "a hard link to a later file",
            vec![member("h", T::Link, "f", b""), reg("f")],
            "\"h\"",
        ),
        (
            "a hard link to a symlink",
            vec![
                member("s", T::Symlink, "/etc/shadow", b""),
                member("h", T::Link, "s", b""),
            ],
            "\"h\"",
        ),
        (
            "a hard link to a directory",
            vec![
                member("d/", T::Directory, "", b""),
                member("h", T::Link, "d", b""),
            ],
            "\"h\"",
        ),
        (
            "a hard link through a symlink",
            vec![
                member("s", T::Symlink, "/etc", b""),
                member("h", T::Link, "s/shadow", b""),
            ],
            "\"h\"",
        ),
        (
            "a hard link to a FIFO",
            vec![
                member("p", T::Fifo, "", b""),
                member("h", T::Link, "p", b""),
            ],
            "\"h\"",
        ),
        ("a member with ..", vec![reg("a/../../x")], "a/../../x"),
        (
            "a hard link with ..",
            vec![reg("f"), member("h", T::Link, "../f", b"")],
            "../f",
        ),
        (
            "the root as a symlink",
            vec![member("./", T::Symlink, "/etc", b"")],
            "root",
        ),
    ];
    for (what, members, name) in cases {
        let e = match read_tar(&tarball(&members)) {
            Err(e) => e,
            Ok((cat, _)) => panic!("{what}: accepted as {cat:?}"),
        };
        assert!(
            e.contains("upload.tar is not a valid tar stream"),
            "{what}: {e}"
        );
        assert!(
            e.contains(name),
            "{what}: the error does not name {name}: {e}"
        );
    }
}

/// Restores a tar's catalog and data into `out`, as a backup then a restore
/// would.
fn round_trip(t: &[u8], out: &Path) -> Vec<Entry> {
    let (cat, data) = read_tar(t).unwrap();
    let mut w = TreeWriter::new(out, cat.clone()).unwrap();
    w.write_all(&data).unwrap();
    w.finish().unwrap();
    cat
}

/// (what, members, files that must hold `PWNED` after the restore).
type Accepted<'a> = (&'a str, Vec<Vec<u8>>, Vec<&'a str>);

#[test]
fn ordinary_tars_are_still_accepted() {
    let cases: Vec<Accepted<'_>> = vec![
        (
            "parents not listed",
            vec![reg("a/b/c.txt")],
            vec!["a/b/c.txt"],
        ),
        (
            "./ prefixes",
            vec![
                member("./", T::Directory, "", b""),
                member("./a/", T::Directory, "", b""),
                reg("./a/x"),
            ],
            vec!["a/x"],
        ),
        (
            "a directory listed twice",
            vec![
                member("d/", T::Directory, "", b""),
                member("./d/", T::Directory, "", b""),
                reg("d/f"),
            ],
            vec!["d/f"],
        ),
        (
            "a directory after its children",
            vec![reg("d/f"), member("d/", T::Directory, "", b"")],
            vec!["d/f"],
        ),
        (
            "absolute names, made relative",
            vec![reg("/abs/f"), member("/abs/h", T::Link, "/abs/f", b"")],
            vec!["abs/f", "abs/h"],
        ),
        (
            "symlinks that point anywhere, with nothing below them",
            vec![
                member("up", T::Symlink, "../../..", b""),
                member("etc", T::Symlink, "/etc", b""),
                reg("f"),
                member("h", T::Link, "f", b""),
            ],
            vec!["f", "h"],
        ),
    ];
    for (what, members, files) in cases {
        let s = scene();
        round_trip(&tarball(&members), &s.out);
        for f in files {
            assert_eq!(fs::read(s.out.join(f)).unwrap(), PWNED, "{what}: {f}");
        }
        s.assert_untouched(what);
    }
}

#[test]
fn gnu_long_names_and_pax_headers_are_accepted() {
    let long = format!("{}/{}", "d".repeat(90), "f".repeat(120));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(PWNED.len() as u64);
    h.set_mode(0o600);
    h.set_cksum();
    b.append_data(&mut h, &long, PWNED).unwrap();
    // A PAX path that overrides the header's own name.
    let pax_name = format!("pax/{}", "p".repeat(150));
    b.append_pax_extensions([("path", pax_name.as_bytes())])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("placeholder").unwrap();
    h.set_size(PWNED.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, PWNED).unwrap();
    let t = b.into_inner().unwrap();
    let s = scene();
    round_trip(&t, &s.out);
    assert_eq!(fs::read(s.out.join(&long)).unwrap(), PWNED);
    assert_eq!(fs::read(s.out.join(&pax_name)).unwrap(), PWNED);
    assert!(!s.out.join("placeholder").exists());
    s.assert_untouched("long names");
}

/// A member preceded by PAX records (a `path` there may be longer than any
/// header field).
fn pax(records: &[(&str, &[u8])], kind: tar::EntryType) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions(records.iter().copied()).unwrap();
    let mut out = b.get_ref().clone(); // without the end-of-archive marker
    let data: &[u8] = if kind == T::Regular { PWNED } else { b"" };
    out.extend(member("placeholder", kind, "", data));
    out
}

fn pax_member(path: &str, kind: tar::EntryType, link: &str) -> Vec<u8> {
    let mut records: Vec<(&str, &[u8])> = vec![("path", path.as_bytes())];
    if !link.is_empty() {
        records.push(("linkpath", link.as_bytes()));
    }
    pax(&records, kind)
}

/// Numbers in PAX records are checked, not truncated or ignored: a uid of
/// 2^32 once became 0 (root), a size near 2^64 wrapped around.
#[test]
fn pax_numbers_out_of_range_or_malformed_are_refused() {
    let cases: Vec<(&str, &[u8], &str)> = vec![
        ("uid", b"4294967296", "uid 4294967296 does not fit 32 bits"),
        (
            "gid",
            b"99999999999",
            "gid 99999999999 does not fit 32 bits",
        ),
        ("uid", b"root", "the PAX uid \"root\" is not a valid number"),
        (
            "mtime",
            b"yesterday",
            "the PAX mtime \"yesterday\" is not a valid number",
        ),
        ("size", b"-1", "the PAX size \"-1\" is not a valid number"),
        (
            "size",
            b"18446744073709551615",
            "a member size of 18446744073709551615 bytes is too large",
        ),
    ];
    for (key, value, why) in cases {
        let t = tarball(&[pax(&[("path", b"f"), (key, value)], T::Regular)]);
        let e = read_tar(&t).unwrap_err();
        assert!(
            e.contains(why),
            "{key}={:?}: {e}",
            String::from_utf8_lossy(value)
        );
    }
    // Valid ones apply: fractional and negative times, 32-bit owners.
    let t = tarball(&[pax(
        &[("path", b"f"), ("uid", b"4294967295"), ("mtime", b"-5.25")],
        T::Regular,
    )]);
    let (cat, data) = read_tar(&t).unwrap();
    let f = cat.iter().find(|e| e.path == b"f").unwrap();
    assert_eq!((f.uid, f.mtime_sec), (u32::MAX, -5));
    assert_eq!(data, PWNED);
}

/// Names no directory restore could make are refused when they arrive (a
/// 400 naming the member), not when someone restores them. Deep paths are
/// fine (a restore makes them one component at a time), and checking them
/// costs memory in proportion to their length (once quadratic: a 1 MiB PAX
/// path of one-byte components would have needed ~137 GB). A version stored
/// before these limits still restores everything it can.
#[test]
fn names_too_long_to_restore_are_refused_at_backup_time() {
    // ~4 KiB (the target directory's own path must fit in PATH_MAX too).
    let deep = |top: usize| format!("t{top}/{}", ["a"; 2000].join("/"));
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "a component longer than 255 bytes",
            pax_member(&format!("dir/{}", "n".repeat(256)), T::Regular, ""),
            "a component of 256 bytes".into(),
        ),
        (
            "a symlink target longer than 4095 bytes",
            pax_member("s", T::Symlink, &"x/".repeat(2100)),
            "a target of 4200 bytes".into(),
        ),
    ];
    for (case, m, why) in cases {
        let e = read_tar(&tarball(&[m])).unwrap_err();
        assert!(
            e.contains("upload.tar is not a valid tar stream") && e.contains(&why),
            "{case}: {e}"
        );
    }
    // The longest allowed names still pass, and restore; so do paths
    // longer than PATH_MAX.
    let longest = format!("{}/f", ["d"; 2100].join("/"));
    let ok = [
        pax_member(&format!("dir/{}", "n".repeat(255)), T::Regular, ""),
        pax_member(&deep(0), T::Regular, ""),
        pax_member(&deep(1), T::Regular, ""),
        pax_member(&longest, T::Regular, ""),
        pax_member("s", T::Symlink, &"x".repeat(4095)),
    ];
    let s = scene();
    let entries = round_trip(&tarball(&ok), &s.out);
    assert_eq!(entries.iter().filter(|e| e.kind == Kind::File).count(), 4);
    assert_eq!(fs::read(s.out.join(deep(1))).unwrap(), PWNED);
    assert_eq!(
        fs::read_link(s.out.join("s")).unwrap().as_os_str().len(),
        4095
    );
    s.assert_untouched("long names");

    // A stored catalog (older builds accepted such names) restores what it
    // can and fails at the entry that cannot be made, naming it.
    let mut long = file("x");
    long.path = format!("d/{}", "n".repeat(300)).into_bytes();
    let s = scene();
    let e = restore(&s.out, vec![dir(""), dir("d"), file("d/first"), long]).unwrap_err();
    assert!(e.contains(&"n".repeat(300)), "{}", &e[..e.len().min(400)]);
    assert_eq!(fs::read(s.out.join("d/first")).unwrap(), PWNED);
    s.assert_untouched("a stored long component");
}

/// A small tree with every kind of entry a tar tool writes.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::write(root.join("a/b/one.txt"), b"one").unwrap();
    fs::write(root.join("a/two.txt"), b"two").unwrap();
    fs::hard_link(root.join("a/two.txt"), root.join("two.hard")).unwrap();
    std::os::unix::fs::symlink("a/b/one.txt", root.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("abs-link")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    fs::write(root.join("n".repeat(150)), b"long").unwrap();
}

fn assert_tree_restored(out: &Path, what: &str) {
    assert_eq!(fs::read(out.join("a/b/one.txt")).unwrap(), b"one", "{what}");
    assert_eq!(fs::read(out.join("two.hard")).unwrap(), b"two", "{what}");
    assert_eq!(
        fs::metadata(out.join("two.hard")).unwrap().nlink(),
        2,
        "{what}"
    );
    assert_eq!(
        fs::read_link(out.join("link")).unwrap(),
        Path::new("a/b/one.txt")
    );
    assert_eq!(
        fs::read_link(out.join("abs-link")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert!(out.join("empty").is_dir(), "{what}");
    assert_eq!(
        fs::read(out.join("n".repeat(150))).unwrap(),
        b"long",
        "{what}"
    );
}

#[test]
fn gnu_tar_output_is_accepted() {
    let src = tempfile::tempdir().unwrap();
    make_tree(src.path());
    for format in ["gnu", "posix", "ustar"] {
        let out = Command::new("tar")
            .args(["-C", src.path().to_str().unwrap()])
            .args(["--format", format, "-cf", "-", "."])
            .output()
            .expect("GNU tar is installed");
        if format == "ustar" {
            // ustar cannot hold a 150-byte name: GNU tar says so and skips it.
            assert!(!out.stdout.is_empty());
            let (cat, _) = read_tar(&out.stdout).unwrap();
            assert!(cat.iter().any(|e| e.path == b"a/b/one.txt"));
            continue;
        }
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = scene();
        round_trip(&out.stdout, &s.out);
        assert_tree_restored(&s.out, format);
        s.assert_untouched(format);
    }
    // Named members: the parents are not listed.
    let out = Command::new("tar")
        .args(["-C", src.path().to_str().unwrap()])
        .args(["-cf", "-", "a/b/one.txt", "link"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = scene();
    round_trip(&out.stdout, &s.out);
    assert_eq!(fs::read(s.out.join("a/b/one.txt")).unwrap(), b"one");
}

/// `tests/data/bsdtar.tar`: `make_tree` above archived by bsdtar 3.6.2
/// (libarchive-tools) with `bsdtar -C tree -cf bsdtar.tar .` (its default
/// format: ustar headers, PAX ones where a name does not fit).
#[test]
fn bsdtar_output_is_accepted() {
    let t = fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bsdtar.tar")).unwrap();
    let s = scene();
    round_trip(&t, &s.out);
    assert_tree_restored(&s.out, "bsdtar");
    s.assert_untouched("bsdtar");
}
