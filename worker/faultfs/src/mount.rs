//! Mounting the filesystem, and what is left of it once unmounted: the log
//! and the snapshots every power cut is made from.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fuser::{BackgroundSession, Config, MountOption};

use crate::fuse::FaultFs;
use crate::model::{Op, Tree};

/// Why this machine cannot mount the filesystem, if it cannot.
pub fn unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist (no FUSE in this kernel or container)".into());
    }
    None
}

/// A mounted, empty, recording filesystem.
pub struct Mount {
    /// None once unmounted.
    session: Option<BackgroundSession>,
    tree: Arc<Mutex<Tree>>,
    dir: PathBuf,
}

impl Mount {
    /// Mounts an empty filesystem on `dir` (an existing, empty directory).
    /// As root this is a plain mount(2); otherwise fuser runs `fusermount3`.
    pub fn new(dir: &Path) -> io::Result<Mount> {
        let tree = Arc::new(Mutex::new(Tree::default()));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("faultfs".into()),
            MountOption::Subtype("faultfs".into()),
        ];
        let fs = FaultFs {
            tree: Arc::clone(&tree),
        };
        let session = fuser::spawn_mount(fs, dir, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mounting faultfs on {}: {e}", dir.display()),
            )
        })?;
        Ok(Mount {
            session: Some(session),
            tree,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many operations the log holds: a cut here keeps all of them that
    /// were synced.
    pub fn position(&self) -> usize {
        self.tree
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .log()
            .len()
    }

    /// Unmounts (failing if a file on it is still open); the recording
    /// stays for materialising cuts.
    pub fn unmount(mut self) -> io::Result<Recording> {
        if let Some(s) = self.session.take() {
            s.umount_and_join()?;
        }
        let tree = Arc::try_unwrap(std::mem::take(&mut self.tree))
            .map_err(|_| io::Error::other("the filesystem thread still holds the tree"))?
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        Ok(Recording { tree })
    }
}

impl Drop for Mount {
    /// A test that fails while mounted must not leave a dead mount behind:
    /// detach it lazily (the kernel ends it once nothing uses it).
    fn drop(&mut self) {
        if self.session.is_some() {
            if let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid C string; umount2 has no other preconditions.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// Everything that happened on a mount, in order.
pub struct Recording {
    tree: Tree,
}

impl Recording {
    pub fn ops(&self) -> &[Op] {
        self.tree.log()
    }

    /// Writes into `dest` (an empty directory) what a power cut after the
    /// first `pos` operations leaves.
    pub fn materialise(&self, pos: usize, dest: &Path) -> io::Result<()> {
        self.tree.materialise(pos, dest)
    }
}
