//! Directory trees for tests: one made with the shapes a tar must carry (modes, a symlink, a
//! long name, an mtime, a sparse-looking file), and a listing to compare two trees by.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::random;

/// Every entry under `root`: type, mode, mtime, size, content hash, link.
pub fn tree_listing(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let ft = m.file_type();
            let what = if ft.is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if ft.is_dir() {
                walk(root, &p, out);
                "dir".to_string()
            } else {
                format!(
                    "file {} {}",
                    m.len(),
                    hex::encode(Sha256::digest(std::fs::read(&p).unwrap()))
                )
            };
            let mode = if ft.is_symlink() {
                0
            } else {
                m.mode() & 0o7777
            };
            let mtime = if ft.is_file() { m.mtime() } else { 0 };
            out.insert(rel, format!("{what} mode {mode:o} mtime {mtime}"));
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

pub fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("etc/conf.d")).unwrap();
    std::fs::create_dir_all(root.join("data/empty")).unwrap();
    std::fs::write(root.join("data/big.bin"), random(3 << 20, 7)).unwrap();
    let mut sparse = vec![0u8; 1 << 20];
    sparse[500_000..500_100].copy_from_slice(&random(100, 8));
    std::fs::write(root.join("data/mostly-zero"), sparse).unwrap();
    std::fs::write(root.join("etc/conf.d/a.conf"), b"key = value\n").unwrap();
    std::fs::write(root.join("etc/secret"), b"s3cr3t\n").unwrap();
    std::fs::set_permissions(
        root.join("etc/secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("etc/conf.d/a.conf", root.join("link")).unwrap();
    std::fs::write(root.join(format!("long-{}", "n".repeat(150))), b"long name").unwrap();
    let t = filetime_of(1_700_000_000);
    set_mtime(&root.join("run.sh"), t);
}

pub fn filetime_of(secs: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    }
}

pub fn set_mtime(p: &Path, t: libc::timespec) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let times = [t, t];
    // SAFETY: valid path and times for utimensat.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0);
}
