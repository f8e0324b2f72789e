//! Files the server re-reads when they change (the token file, the quota file, the TLS
//! pair): a Kubernetes Secret mounted as a volume is swapped in place by the kubelet.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// A file's identity for polling it: a file replaced (new inode), rewritten or touched differs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Stamp {
    mtime: Option<SystemTime>,
    len: u64,
    ino: u64,
}

/// The stamp of the file at `p` (following links, as the kubelet's `..data` swap needs);
/// `None` when it cannot be read.
pub(super) fn stamp(p: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some(Stamp {
        mtime: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
    })
}

/// One file, and the stamp it had when it was last taken in.
pub(super) struct WatchedFile {
    path: PathBuf,
    seen: Mutex<Option<Stamp>>,
}

impl WatchedFile {
    pub fn new(path: PathBuf) -> WatchedFile {
        WatchedFile {
            path,
            seen: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is there and differs from when this last said so (the first call:
    /// whether it is there). The caller then reads it; a file changed again meanwhile is
    /// seen at the next call.
    pub fn changed(&self) -> bool {
        let Some(now) = stamp(&self.path) else {
            return false;
        };
        let mut seen = self.seen.lock().unwrap();
        if *seen == Some(now) {
            return false;
        }
        *seen = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_changed_once_per_change_and_not_while_missing() {
        let dir = tempfile::tempdir().unwrap();
        let w = WatchedFile::new(dir.path().join("f"));
        assert!(!w.changed(), "missing");
        std::fs::write(w.path(), "a").unwrap();
        assert!(w.changed(), "appeared");
        assert!(!w.changed(), "unchanged");
        std::fs::write(w.path(), "bb").unwrap();
        assert!(w.changed(), "rewritten");
        let other = dir.path().join("g");
        std::fs::write(&other, "bb").unwrap();
        std::fs::rename(&other, w.path()).unwrap();
        assert!(w.changed(), "replaced by another file");
    }
}
