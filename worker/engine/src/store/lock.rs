//! The store lock: one process may change a store at a time; readers share.
//! An exclusive holder writes who it is into the lock file so that a refused
//! process can say what it is waiting for.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::{Error, IoContext, Result};

pub struct StoreLock {
    file: File,
    exclusive: bool,
}

impl StoreLock {
    pub fn acquire(root: &Path, exclusive: bool, what: &str) -> Result<StoreLock> {
        let path = root.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .ctx(|| format!("opening {}", path.display()))?;
        let r = if exclusive {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match r {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    path: root.to_path_buf(),
                    holder: describe_holder(&mut file),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::Io {
                    context: format!("locking {}", path.display()),
                    source: e,
                })
            }
        }
        if exclusive {
            let info = format!("pid {}: {}", std::process::id(), what);
            file.set_len(0)
                .ctx(|| format!("writing {}", path.display()))?;
            file.seek(SeekFrom::Start(0))
                .ctx(|| format!("writing {}", path.display()))?;
            file.write_all(info.as_bytes())
                .ctx(|| format!("writing {}", path.display()))?;
        }
        Ok(StoreLock { file, exclusive })
    }
}

fn describe_holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.seek(SeekFrom::Start(0));
    let _ = file.read_to_string(&mut s);
    let alive = s
        .strip_prefix("pid ")
        .and_then(|r| r.split(':').next())
        .and_then(|p| p.trim().parse::<i32>().ok())
        // SAFETY: kill with signal 0 only checks that the process exists.
        .is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0);
    if alive {
        format!("another revault process ({})", s.trim())
    } else {
        "another revault process".to_string()
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        if self.exclusive {
            let _ = self.file.set_len(0);
        }
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let first = StoreLock::acquire(dir.path(), true, "revault backup default/db").unwrap();
        let e = StoreLock::acquire(dir.path(), true, "revault gc")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("locked by another revault process"), "{e}");
        assert!(e.contains("revault backup default/db"), "{e}");
        let e = StoreLock::acquire(dir.path(), false, "revault list")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("locked"), "{e}");
        drop(first);
        let r1 = StoreLock::acquire(dir.path(), false, "a").unwrap();
        let _r2 = StoreLock::acquire(dir.path(), false, "b").unwrap();
        assert!(StoreLock::acquire(dir.path(), true, "w").is_err());
        drop(r1);
    }
}
