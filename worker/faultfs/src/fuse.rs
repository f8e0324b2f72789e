//! The FUSE side: each kernel request becomes one call on the [`Tree`], under
//! one lock, so the log's order is the order the requests were served in.
//!
//! No writeback cache is asked for (fuser does not ask by default), so every
//! `write(2)` reaches the tree before it returns, and the kernel sends every
//! `fsync`, `fdatasync` and directory `fsync` here. Nor are POSIX or BSD locks
//! asked for: the kernel then keeps `flock` and `fcntl` locks itself, which is
//! all the store's lock file and RocksDB's `LOCK` need.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{component, Body, Tree};

/// Only the kernel changes the tree, so what it caches stays true.
const TTL: Duration = Duration::from_secs(60);

pub struct FaultFs {
    pub tree: Arc<Mutex<Tree>>,
}

impl FaultFs {
    fn tree(&self) -> MutexGuard<'_, Tree> {
        // A panic while serving one request must not stop the others.
        self.tree.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attr(tree: &Tree, ino: u64) -> Result<FileAttr, Errno> {
        let n = tree.node(ino)?;
        let (kind, size) = match &n.body {
            Body::File(c) => (FileType::RegularFile, c.size()),
            Body::Dir(_) => (FileType::Directory, 0),
            Body::Symlink(t) => (FileType::Symlink, t.as_os_str().len() as u64),
        };
        // Times are not modelled (the store never reads them).
        let t = SystemTime::UNIX_EPOCH;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: n.perm,
            nlink: n.nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// Replies with a new or looked-up entry, which the kernel then holds.
    fn entry(&self, made: Result<u64, Errno>, reply: ReplyEntry) {
        let mut tree = self.tree();
        match made.and_then(|ino| Self::attr(&tree, ino)) {
            Ok(attr) => {
                tree.remember(attr.ino.0);
                reply.entry(&TTL, &attr, Generation(0));
            }
            Err(e) => reply.error(e),
        }
    }
}

fn done(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.tree().lookup(parent.0, name);
        self.entry(found, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.tree().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match Self::attr(&self.tree(), ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut tree = self.tree();
        let r = (|| {
            if let Some(m) = mode {
                tree.set_perm(ino.0, perm(m, 0))?;
            }
            if let Some(s) = size {
                tree.set_len(ino.0, s)?;
            }
            Self::attr(&tree, ino.0)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.tree().readlink(ino.0) {
            Ok(t) => reply.data(t.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Only regular files: the store makes no devices, fifos or sockets.
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let made = component(name).and_then(|n| self.tree().create(parent.0, n, perm(mode, umask)));
        self.entry(made, reply);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = component(name).and_then(|n| self.tree().mkdir(parent.0, n, perm(mode, umask)));
        self.entry(made, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(self.tree().unlink(parent.0, name), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(self.tree().rmdir(parent.0, name), reply);
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let made = component(link_name).and_then(|n| self.tree().symlink(parent.0, n, target));
        self.entry(made, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        // RENAME_EXCHANGE and RENAME_WHITEOUT are not needed by the store.
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let r = component(newname).and_then(|to| {
            self.tree()
                .rename(parent.0, name, newparent.0, to, noreplace)
        });
        done(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = component(newname)
            .and_then(|n| self.tree().link(ino.0, newparent.0, n))
            .map(|()| ino.0);
        self.entry(r, reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.tree().read(ino.0, offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut tree = self.tree();
        let mut r = tree.write(ino.0, offset, data);
        // A file opened O_SYNC or O_DSYNC is synced by every write.
        if flags.0 & libc::O_DSYNC != 0 {
            r = r.and_then(|()| tree.fsync(ino.0));
        }
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // fdatasync keeps the bytes and the size, all the model tracks.
        done(self.tree().fsync(ino.0), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let tree = self.tree();
        let list = match tree.list(ino.0) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let dots = [
            (ino.0, FileType::Directory, OsStr::new(".")),
            (ino.0, FileType::Directory, OsStr::new("..")),
        ];
        let entries = dots
            .into_iter()
            .chain(list.into_iter().map(|(i, body, name)| {
                let kind = match body {
                    Body::File(_) => FileType::RegularFile,
                    Body::Dir(_) => FileType::Directory,
                    Body::Symlink(_) => FileType::Symlink,
                };
                (i, kind, name)
            }));
        // The offset of an entry is its index + 1: where the next call resumes.
        for (i, (child, kind, name)) in entries.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(self.tree().fsyncdir(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room, in case a caller checks before writing.
        let blocks = 1 << 28;
        reply.statfs(blocks, blocks, blocks, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        // The kernel sends `create` only for a name it found missing.
        let mut tree = self.tree();
        let made = component(name).and_then(|n| tree.create(parent.0, n, perm(mode, umask)));
        match made.and_then(|ino| Self::attr(&tree, ino)) {
            Ok(attr) => {
                tree.remember(attr.ino.0);
                reply.created(
                    &TTL,
                    &attr,
                    Generation(0),
                    FileHandle(0),
                    FopenFlags::empty(),
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        done(self.tree().fallocate(ino.0, offset, length, mode), reply);
    }
}
