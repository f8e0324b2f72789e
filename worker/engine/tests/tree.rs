//! Directory versions: contents dedup apart from metadata, and restores
//! reproduce names, modes, owners, times, links and empty directories.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use revault_engine::{
    backup, restore, BackupOptions, DedupUnit, RestoreOptions, RestoreTarget, StoreConfig,
    TreeSource, VersionSel,
};

fn make_tree(root: &Path) {
    for d in 0..20 {
        let dir = root.join(format!("pkg{d:02}/sub"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..40 {
            let len = 2_000 + (d * 40 + f) * 211 % 30_000;
            fs::write(
                dir.join(format!("file{f:03}.go")),
                random(len, (d * 100 + f) as u64),
            )
            .unwrap();
        }
    }
    fs::create_dir_all(root.join("empty/dir")).unwrap();
    std::os::unix::fs::symlink("../pkg00/sub/file000.go", root.join("empty/link")).unwrap();
    fs::set_permissions(
        root.join("pkg01/sub/file001.go"),
        fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    fs::set_permissions(root.join("pkg02"), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::lchown(root.join("pkg03/sub/file003.go"), Some(1234), Some(5678)).unwrap();
}

fn tree_size(root: &Path) -> u64 {
    let mut n = 0;
    for e in fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            tree_size(&e.path())
        } else if m.is_file() {
            m.len()
        } else {
            0 // symlinks carry no file data
        };
    }
    n
}

fn touch_all(root: &Path, t: i64) {
    for e in fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            touch_all(&e.path(), t);
        }
        if !ft.is_symlink() {
            filetime::set_file_mtime(e.path(), filetime::FileTime::from_unix_time(t, 0)).unwrap();
        }
    }
}

/// What a user would compare between two trees, per entry.
#[derive(Debug, PartialEq, Eq)]
struct Described {
    path: String,
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    size: u64,
    link: String,
}

fn describe(root: &Path) -> Vec<Described> {
    fn walk(root: &Path, p: &Path, out: &mut Vec<Described>) {
        let mut es: Vec<_> = fs::read_dir(p).unwrap().map(|e| e.unwrap()).collect();
        es.sort_by_key(|e| e.file_name());
        for e in es {
            let m = fs::symlink_metadata(e.path()).unwrap();
            let kind = if m.is_dir() {
                "dir"
            } else if m.file_type().is_symlink() {
                "link"
            } else {
                "file"
            };
            out.push(Described {
                path: e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                kind,
                mode: m.mode() & 0o7777,
                uid: m.uid(),
                gid: m.gid(),
                mtime: if kind == "link" { 0 } else { m.mtime() },
                size: if kind == "file" { m.len() } else { 0 },
                link: if kind == "link" {
                    fs::read_link(e.path())
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                } else {
                    String::new()
                },
            });
            if m.is_dir() {
                walk(root, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn renamed_top_dir_and_touched_mtimes_add_little_more_than_the_catalog() {
    for unit in [DedupUnit::Segment, DedupUnit::Chunk] {
        let (_dir, store) = new_store(StoreConfig::default());
        let work = tempfile::tempdir().unwrap();
        let v1 = work.path().join("app-v1");
        make_tree(&v1);
        let size = tree_size(&v1);
        let series = format!("default/tree-{unit}");
        let opts = BackupOptions {
            unit: Some(unit),
            ..Default::default()
        };
        let r1 = backup(
            &store,
            &series,
            Box::new(TreeSource::new(&v1).unwrap()),
            &opts,
        )
        .unwrap();
        assert_eq!(r1.logical_bytes, size);

        let v2 = work.path().join("renamed-top-dir");
        fs::rename(&v1, &v2).unwrap();
        touch_all(&v2, 1_750_000_000);
        let r2 = backup(
            &store,
            &series,
            Box::new(TreeSource::new(&v2).unwrap()),
            &opts,
        )
        .unwrap();
        let added = r2.new_container_bytes + r2.catalog_bytes + r2.recipe_bytes;
        assert!(
            (added as f64) < 0.02 * size as f64,
            "{unit}: version 2 added {added} bytes for a {size}-byte tree"
        );
        assert_eq!(r2.new_vbytes, 0, "{unit}: no content changed");

        let (v, src) = (2u32, &v2);
        let out = work.path().join(format!("restore-{unit}-{v}"));
        let rep = restore(
            &store,
            &series,
            VersionSel::Number(v),
            &RestoreOptions::default(),
            RestoreTarget::Dir(&out),
        )
        .unwrap();
        assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
        assert_eq!(describe(&out), describe(src));
        assert_eq!(
            fs::read(out.join("pkg05/sub/file007.go")).unwrap(),
            fs::read(src.join("pkg05/sub/file007.go")).unwrap()
        );
        assert_eq!(
            fs::metadata(&out).unwrap().mode() & 0o7777,
            fs::metadata(src).unwrap().mode() & 0o7777
        );
    }
}

#[test]
fn a_stream_version_refuses_a_directory_target() {
    let (_dir, store) = new_store(small_config());
    backup_bytes(&store, "default/s", b"hello", DedupUnit::Segment);
    let out = tempfile::tempdir().unwrap();
    let e = restore(
        &store,
        "default/s",
        VersionSel::Latest,
        &RestoreOptions::default(),
        RestoreTarget::Dir(out.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("single stream"), "{e}");
}

#[test]
fn identical_files_far_apart_restore_exactly_through_reuse() {
    // Four copies of one file between large unrelated files: chunk mode
    // dedups the copies, and a small assembly area (each window holds about
    // one copy) gets them from memory instead of their first container.
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("tree");
    let same = random(100_000, 77);
    for d in 0..4u64 {
        let dir = src.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("big.bin"), random(1_500_000, 80 + d)).unwrap();
        fs::write(dir.join("same.txt"), &same).unwrap();
    }
    for unit in [DedupUnit::Chunk, DedupUnit::Segment] {
        let (_dir, store) = new_store(small_config());
        let series = format!("default/same-{unit}");
        backup(
            &store,
            &series,
            Box::new(TreeSource::new(&src).unwrap()),
            &BackupOptions {
                unit: Some(unit),
                ..Default::default()
            },
        )
        .unwrap();
        let out = work.path().join(format!("out-{unit}"));
        let rep = restore(
            &store,
            &series,
            VersionSel::Latest,
            &RestoreOptions {
                cache_bytes: 2 << 20,
                cache: revault_engine::CachePolicy::Faa,
                ..Default::default()
            },
            RestoreTarget::Dir(&out),
        )
        .unwrap();
        if unit == DedupUnit::Chunk {
            assert!(rep.reused_bytes > 0, "{rep:?}");
        }
        assert_eq!(describe(&out), describe(&src));
        for d in 0..4 {
            let p = format!("d{d}/same.txt");
            assert_eq!(fs::read(out.join(&p)).unwrap(), same, "{unit}: {p}");
        }
    }
}
