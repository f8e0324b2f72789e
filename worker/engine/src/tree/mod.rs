//! Directory trees: reading one for backup ([`TreeSource`]) and writing one
//! back from a restored data stream, either as files ([`TreeWriter`]) or as a
//! tar stream ([`TarWriter`]).

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::catalog::{Entry, Kind};
use crate::error::{Error, IoContext, Result};
use crate::source::Source;
use crate::tarsource::pad;

fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

/// Walks a directory depth-first in byte order of names; each regular file with
/// data is one piece.
pub struct TreeSource {
    root: PathBuf,
    /// Directories being listed: (relative path, remaining names, reversed).
    stack: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    entries: Vec<Entry>,
    hardlinks: HashMap<(u64, u64), Vec<u8>>,
    cur: Option<OpenFile>,
    started: bool,
}

struct OpenFile {
    entry: usize,
    file: File,
    /// Data extents still to read: (offset, length).
    extents: Vec<(u64, u64)>,
    next_extent: usize,
    pos_in_extent: u64,
    read: u64,
}

impl TreeSource {
    pub fn new(root: &Path) -> Result<Self> {
        let meta = fs::metadata(root).ctx(|| format!("reading {}", root.display()))?;
        if !meta.is_dir() {
            return Err(Error::Invalid(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        Ok(TreeSource {
            root: root.to_path_buf(),
            stack: Vec::new(),
            entries: Vec::new(),
            hardlinks: HashMap::new(),
            cur: None,
            started: false,
        })
    }

    fn list(&self, rel: &[u8]) -> Result<Vec<Vec<u8>>> {
        let dir = join(&self.root, rel);
        let mut names: Vec<Vec<u8>> = fs::read_dir(&dir)
            .ctx(|| format!("reading directory {}", dir.display()))?
            .map(|e| {
                e.map(|e| e.file_name().as_bytes().to_vec())
                    .ctx(|| format!("reading directory {}", dir.display()))
            })
            .collect::<Result<_>>()?;
        names.sort_unstable();
        names.reverse();
        Ok(names)
    }

    fn add_entry(&mut self, rel: Vec<u8>) -> Result<Option<OpenFile>> {
        let path = join(&self.root, &rel);
        let m = fs::symlink_metadata(&path).ctx(|| format!("reading {}", path.display()))?;
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_fifo() {
            Kind::Fifo
        } else if ft.is_char_device() {
            Kind::CharDev
        } else if ft.is_block_device() {
            Kind::BlockDev
        } else {
            // Sockets cannot be recreated meaningfully; like tar, skip them.
            return Ok(None);
        };
        let mut e = Entry::new(rel, kind);
        e.mode = m.mode() & 0o7777;
        e.uid = m.uid();
        e.gid = m.gid();
        e.mtime_sec = m.mtime();
        e.mtime_nsec = m.mtime_nsec() as u32;
        e.rdev = m.rdev();
        let mut open = None;
        match kind {
            Kind::Dir => {
                let names = self.list(&e.path)?;
                self.stack.push((e.path.clone(), names));
            }
            Kind::Symlink => {
                e.link = fs::read_link(&path)
                    .ctx(|| format!("reading link {}", path.display()))?
                    .as_os_str()
                    .as_bytes()
                    .to_vec();
            }
            Kind::File => {
                if m.nlink() > 1 {
                    let key = (m.dev(), m.ino());
                    if let Some(first) = self.hardlinks.get(&key) {
                        e.kind = Kind::Hardlink;
                        e.link = first.clone();
                        self.entries.push(e);
                        return Ok(None);
                    }
                    self.hardlinks.insert(key, e.path.clone());
                }
                e.size = m.len();
                if e.size > 0 {
                    let file =
                        File::open(&path).ctx(|| format!("cannot read {}", path.display()))?;
                    let extents =
                        data_extents(&file, &m).ctx(|| format!("reading {}", path.display()))?;
                    let dense = extents.len() == 1 && extents[0] == (0, e.size);
                    if !dense {
                        e.extents = extents.clone();
                    }
                    e.data_len = extents.iter().map(|x| x.1).sum();
                    if e.data_len > 0 {
                        open = Some(OpenFile {
                            entry: self.entries.len(),
                            file,
                            extents,
                            next_extent: 0,
                            pos_in_extent: 0,
                            read: 0,
                        });
                    }
                }
            }
            _ => {}
        }
        self.entries.push(e);
        Ok(open)
    }

    fn close_current(&mut self) {
        if let Some(c) = self.cur.take() {
            // A file that shrank while we read it: record what we actually read.
            let e = &mut self.entries[c.entry];
            if c.read != e.data_len {
                e.data_len = c.read;
                if e.extents.is_empty() {
                    e.size = c.read;
                } else {
                    let mut left = c.read;
                    e.extents.retain_mut(|x| {
                        let take = x.1.min(left);
                        left -= take;
                        x.1 = take;
                        take > 0
                    });
                }
            }
        }
    }
}

/// Data extents of a file: the whole file unless it looks sparse, in which case
/// SEEK_DATA/SEEK_HOLE list the allocated ranges.
fn data_extents(file: &File, m: &fs::Metadata) -> io::Result<Vec<(u64, u64)>> {
    let size = m.len();
    if m.blocks() * 512 >= size {
        return Ok(vec![(0, size)]);
    }
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        // SAFETY: lseek on a valid fd has no memory effects.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // no more data: the rest is a hole
            }
            if err.raw_os_error() == Some(libc::EINVAL) {
                return Ok(vec![(0, size)]); // filesystem without SEEK_DATA
            }
            return Err(err);
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = (hole as u64).min(size);
        if end > data as u64 {
            out.push((data as u64, end - data as u64));
        }
        pos = hole;
    }
    Ok(out)
}

impl Source for TreeSource {
    fn next_piece(&mut self) -> Result<bool> {
        self.close_current();
        if !self.started {
            self.started = true;
            if let Some(f) = self.add_entry(Vec::new())? {
                self.cur = Some(f);
                return Ok(true);
            }
        }
        loop {
            let Some((dir, names)) = self.stack.last_mut() else {
                return Ok(false);
            };
            let Some(name) = names.pop() else {
                self.stack.pop();
                continue;
            };
            let mut rel = dir.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
            if let Some(f) = self.add_entry(rel)? {
                self.cur = Some(f);
                return Ok(true);
            }
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let Some(c) = self.cur.as_mut() else {
            return Ok(0);
        };
        while c.next_extent < c.extents.len() {
            let (off, len) = c.extents[c.next_extent];
            if c.pos_in_extent == len {
                c.next_extent += 1;
                c.pos_in_extent = 0;
                continue;
            }
            let want = ((len - c.pos_in_extent) as usize).min(buf.len());
            let n = loop {
                match c.file.read_at(&mut buf[..want], off + c.pos_in_extent) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            }
            .ctx(|| {
                format!(
                    "cannot read {}",
                    join(&self.root, &self.entries[c.entry].path).display()
                )
            })?;
            if n == 0 {
                // The file shrank: stop here.
                c.next_extent = c.extents.len();
                break;
            }
            c.pos_in_extent += n as u64;
            c.read += n as u64;
            return Ok(n);
        }
        Ok(0)
    }

    fn finish(mut self: Box<Self>) -> Result<Option<Vec<Entry>>> {
        self.close_current();
        Ok(Some(std::mem::take(&mut self.entries)))
    }
}

/// What to do with each catalog entry while the data stream is replayed.
trait EntryHandler {
    /// Called in catalog order before any data of the entry.
    fn begin(&mut self, e: &Entry) -> Result<()>;
    /// File bytes at `offset` within the current file.
    fn data(&mut self, e: &Entry, offset: u64, buf: &[u8]) -> Result<()>;
    /// Called after the last data byte of a file.
    fn end_file(&mut self, e: &Entry) -> Result<()>;
    fn finish(&mut self, entries: &[Entry]) -> Result<()>;
}

/// Replays a restored data stream against a catalog: routes stream bytes to
/// files (with their sparse layout) and creates every other entry in order.
struct CatalogReplay<H> {
    entries: Vec<Entry>,
    next: usize,
    /// The file whose data is being received: (entry, extent, offset in extent).
    cur: Option<(usize, usize, u64)>,
    handler: H,
    failed: bool,
}

impl<H: EntryHandler> CatalogReplay<H> {
    fn new(entries: Vec<Entry>, handler: H) -> Self {
        CatalogReplay {
            entries,
            next: 0,
            cur: None,
            handler,
            failed: false,
        }
    }

    /// Begins entries until one that expects data.
    fn advance(&mut self) -> Result<()> {
        while self.cur.is_none() && self.next < self.entries.len() {
            let i = self.next;
            self.next += 1;
            let e = &self.entries[i];
            self.handler.begin(e)?;
            if e.kind == Kind::File {
                if e.data_len > 0 {
                    self.cur = Some((i, 0, 0));
                } else {
                    self.handler.end_file(e)?;
                }
            }
        }
        Ok(())
    }

    fn feed(&mut self, mut buf: &[u8]) -> Result<()> {
        while !buf.is_empty() {
            self.advance()?;
            let Some((i, ext, pos)) = self.cur else {
                return Err(Error::CorruptMetadata {
                    what: "catalog".into(),
                    detail: "the data stream is longer than the catalog's files".into(),
                });
            };
            let e = &self.entries[i];
            let (off, len) = if e.extents.is_empty() {
                (0, e.size.min(e.data_len))
            } else {
                e.extents[ext]
            };
            let take = ((len - pos) as usize).min(buf.len());
            self.handler.data(e, off + pos, &buf[..take])?;
            buf = &buf[take..];
            let pos = pos + take as u64;
            if pos < len {
                self.cur = Some((i, ext, pos));
            } else if !e.extents.is_empty() && ext + 1 < e.extents.len() {
                self.cur = Some((i, ext + 1, 0));
            } else {
                self.cur = None;
                self.handler.end_file(e)?;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<H> {
        self.advance()?;
        if self.cur.is_some() {
            return Err(Error::CorruptMetadata {
                what: "catalog".into(),
                detail: "the data stream ended before the catalog's files".into(),
            });
        }
        self.handler.finish(&self.entries)?;
        Ok(self.handler)
    }
}

fn to_io(e: Error) -> io::Error {
    io::Error::other(e)
}

/// Restores a tree into a directory.
pub struct TreeWriter {
    replay: CatalogReplay<DirHandler>,
}

struct DirHandler {
    root: PathBuf,
    file: Option<File>,
    restore_owners: bool,
    warnings: Vec<String>,
}

impl TreeWriter {
    /// `root` must not exist or be an empty directory (a `lost+found` is allowed).
    pub fn new(root: &Path, entries: Vec<Entry>) -> Result<Self> {
        match fs::read_dir(root) {
            Ok(mut it) => {
                if it.any(|e| e.map(|e| e.file_name() != "lost+found").unwrap_or(true)) {
                    return Err(Error::Invalid(format!(
                        "restore target {} is not empty; restore into a new or empty directory",
                        root.display()
                    )));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(root).ctx(|| format!("creating {}", root.display()))?
            }
            Err(e) => {
                return Err(Error::Io {
                    context: format!("reading {}", root.display()),
                    source: e,
                })
            }
        }
        Ok(TreeWriter {
            replay: CatalogReplay::new(
                entries,
                DirHandler {
                    root: root.to_path_buf(),
                    file: None,
                    // Only root may give files away; others keep their own uid.
                    restore_owners: unsafe { libc::geteuid() } == 0,
                    warnings: Vec::new(),
                },
            ),
        })
    }

    /// Applies metadata (owners, modes, times) and returns warnings for entries
    /// that could not be fully recreated (e.g. devices without privileges).
    pub fn finish(self) -> Result<Vec<String>> {
        Ok(self.replay.finish()?.warnings)
    }
}

impl Write for TreeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.replay.failed {
            return Err(io::Error::other("an earlier write failed"));
        }
        self.replay.feed(buf).map_err(|e| {
            self.replay.failed = true;
            to_io(e)
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("path contains NUL"))
}

impl EntryHandler for DirHandler {
    fn begin(&mut self, e: &Entry) -> Result<()> {
        if e.path
            .split(|&b| b == b'/')
            .any(|c| c == b".." || c == b".")
            || e.path.starts_with(b"/")
        {
            return Err(Error::CorruptMetadata {
                what: "catalog".into(),
                detail: format!("unsafe path {:?}", e.path_str()),
            });
        }
        let p = join(&self.root, &e.path);
        let ctx = || format!("creating {}", p.display());
        match e.kind {
            Kind::Dir => {
                if !e.path.is_empty() {
                    fs::create_dir(&p).ctx(ctx)?;
                }
            }
            Kind::File => {
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .ctx(ctx)?;
                self.file = Some(f);
            }
            Kind::Symlink => std::os::unix::fs::symlink(OsStr::from_bytes(&e.link), &p).ctx(ctx)?,
            Kind::Hardlink => fs::hard_link(join(&self.root, &e.link), &p).ctx(ctx)?,
            Kind::Fifo | Kind::CharDev | Kind::BlockDev => {
                let fmt = match e.kind {
                    Kind::Fifo => libc::S_IFIFO,
                    Kind::CharDev => libc::S_IFCHR,
                    _ => libc::S_IFBLK,
                };
                let c = cstr(&p).ctx(ctx)?;
                // SAFETY: valid C string; mknod has no memory effects.
                let r = unsafe { libc::mknod(c.as_ptr(), fmt | 0o600, e.rdev as libc::dev_t) };
                if r != 0 {
                    let err = io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::EPERM) {
                        self.warnings.push(format!(
                            "{}: cannot create a device node without privileges",
                            e.path_str()
                        ));
                    } else {
                        return Err(Error::Io {
                            context: ctx(),
                            source: err,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn data(&mut self, e: &Entry, offset: u64, buf: &[u8]) -> Result<()> {
        let f = self
            .file
            .as_mut()
            .expect("file is open while it receives data");
        f.write_all_at(buf, offset)
            .ctx(|| format!("writing {}", join(&self.root, &e.path).display()))
    }

    fn end_file(&mut self, e: &Entry) -> Result<()> {
        if let Some(f) = self.file.take() {
            // Trailing holes of sparse files (and any size not covered by data).
            if f.metadata().map(|m| m.len()).unwrap_or(0) != e.size {
                f.set_len(e.size)
                    .ctx(|| format!("writing {}", join(&self.root, &e.path).display()))?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, entries: &[Entry]) -> Result<()> {
        // Children before parents so directory modes and times are applied last.
        for e in entries.iter().rev() {
            if e.kind == Kind::Hardlink {
                continue; // shares the inode of its first path
            }
            let p = join(&self.root, &e.path);
            let c = cstr(&p).ctx(|| format!("restoring {}", p.display()))?;
            let ctx = || format!("restoring metadata of {}", p.display());
            if self.restore_owners {
                // SAFETY: valid C string.
                if unsafe { libc::lchown(c.as_ptr(), e.uid, e.gid) } != 0 {
                    return Err(Error::Io {
                        context: ctx(),
                        source: io::Error::last_os_error(),
                    });
                }
            }
            if e.kind != Kind::Symlink {
                let r = unsafe { libc::chmod(c.as_ptr(), e.mode as libc::mode_t) };
                if r != 0 {
                    return Err(Error::Io {
                        context: ctx(),
                        source: io::Error::last_os_error(),
                    });
                }
            }
            let t = libc::timespec {
                tv_sec: e.mtime_sec as libc::time_t,
                tv_nsec: e.mtime_nsec as libc::c_long,
            };
            let times = [t, t];
            let r = unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 {
                return Err(Error::Io {
                    context: ctx(),
                    source: io::Error::last_os_error(),
                });
            }
        }
        Ok(())
    }
}

/// Writes a tree as a tar stream (GNU format, long names supported, sparse
/// files expanded), e.g. to restore a directory version to a file or stdout.
pub struct TarWriter<W: Write> {
    replay: CatalogReplay<TarHandler<W>>,
}

struct TarHandler<W: Write> {
    out: W,
    /// Bytes of the current file already written (holes included).
    written: u64,
}

impl<W: Write> TarWriter<W> {
    pub fn new(out: W, entries: Vec<Entry>) -> Self {
        TarWriter {
            replay: CatalogReplay::new(entries, TarHandler { out, written: 0 }),
        }
    }

    pub fn finish(self) -> Result<W> {
        Ok(self.replay.finish()?.out)
    }
}

impl<W: Write> Write for TarWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.replay.failed {
            return Err(io::Error::other("an earlier write failed"));
        }
        self.replay.feed(buf).map_err(|e| {
            self.replay.failed = true;
            to_io(e)
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.replay.handler.out.flush()
    }
}

const ZEROS: [u8; 4096] = [0; 4096];

impl<W: Write> TarHandler<W> {
    fn zeros(&mut self, mut n: u64) -> io::Result<()> {
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.out.write_all(&ZEROS[..k])?;
            n -= k as u64;
        }
        Ok(())
    }

    fn long(&mut self, kind: tar::EntryType, value: &[u8]) -> io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(kind);
        h.set_mode(0);
        h.set_size(value.len() as u64 + 1);
        h.set_cksum();
        self.out.write_all(h.as_bytes())?;
        self.out.write_all(value)?;
        self.zeros(1)?;
        self.zeros(pad(value.len() as u64 + 1))
    }
}

impl<W: Write> EntryHandler for TarHandler<W> {
    fn begin(&mut self, e: &Entry) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        let mut name = if e.path.is_empty() {
            b".".to_vec()
        } else {
            e.path.clone()
        };
        if e.kind == Kind::Dir {
            name.push(b'/');
        }
        let mut h = tar::Header::new_gnu();
        let kind = match e.kind {
            Kind::File => tar::EntryType::Regular,
            Kind::Dir => tar::EntryType::Directory,
            Kind::Symlink => tar::EntryType::Symlink,
            Kind::Hardlink => tar::EntryType::Link,
            Kind::Fifo => tar::EntryType::Fifo,
            Kind::CharDev => tar::EntryType::Char,
            Kind::BlockDev => tar::EntryType::Block,
        };
        if name.len() > 100 {
            self.long(tar::EntryType::GNULongName, &name)
                .map_err(io_ctx)?;
        }
        if e.link.len() > 100 {
            self.long(tar::EntryType::GNULongLink, &e.link)
                .map_err(io_ctx)?;
        }
        let n = name.len().min(100);
        h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
        let l = e.link.len().min(100);
        h.as_old_mut().linkname[..l].copy_from_slice(&e.link[..l]);
        h.set_entry_type(kind);
        h.set_mode(e.mode);
        h.set_uid(u64::from(e.uid));
        h.set_gid(u64::from(e.gid));
        h.set_mtime(e.mtime_sec.max(0) as u64);
        h.set_size(if e.kind == Kind::File { e.size } else { 0 });
        if matches!(e.kind, Kind::CharDev | Kind::BlockDev) {
            let major = libc::major(e.rdev as libc::dev_t);
            let minor = libc::minor(e.rdev as libc::dev_t);
            h.set_device_major(major).map_err(io_ctx)?;
            h.set_device_minor(minor).map_err(io_ctx)?;
        }
        h.set_cksum();
        self.out.write_all(h.as_bytes()).map_err(io_ctx)?;
        self.written = 0;
        Ok(())
    }

    fn data(&mut self, _e: &Entry, offset: u64, buf: &[u8]) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        self.zeros(offset - self.written).map_err(io_ctx)?;
        self.out.write_all(buf).map_err(io_ctx)?;
        self.written = offset + buf.len() as u64;
        Ok(())
    }

    fn end_file(&mut self, e: &Entry) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        self.zeros(e.size - self.written.min(e.size))
            .map_err(io_ctx)?;
        self.zeros(pad(e.size)).map_err(io_ctx)
    }

    fn finish(&mut self, _entries: &[Entry]) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        self.zeros(1024).map_err(io_ctx)?;
        self.out.flush().map_err(io_ctx)
    }
}

/// Reads a whole piece-structured source into (catalog, data) — used in tests.
#[cfg(test)]
pub(crate) fn read_all<'a>(mut s: Box<dyn Source + 'a>) -> (Option<Vec<Entry>>, Vec<u8>) {
    let mut data = Vec::new();
    let mut buf = vec![0u8; 7777];
    while s.next_piece().unwrap() {
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
    }
    (s.finish().unwrap(), data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    fn make_tree(root: &Path) {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/hello.txt"), b"hello world").unwrap();
        fs::write(root.join("a/empty"), b"").unwrap();
        fs::write(root.join("big.bin"), vec![7u8; 300_000]).unwrap();
        std::os::unix::fs::symlink("a/b/hello.txt", root.join("link")).unwrap();
        fs::hard_link(root.join("big.bin"), root.join("big.hard")).unwrap();
        fs::create_dir(root.join("emptydir")).unwrap();
        fs::set_permissions(
            root.join("a/b/hello.txt"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let long = "x".repeat(120);
        fs::write(root.join(&long), b"long name").unwrap();
        // A sparse file: 1 MiB hole, 4 KiB data, 1 MiB hole.
        let f = File::create(root.join("sparse")).unwrap();
        f.write_all_at(&[9u8; 4096], 1 << 20).unwrap();
        f.set_len(2 << 20 | 4096).unwrap();
        filetime::set_file_mtime(
            root.join("big.bin"),
            filetime::FileTime::from_unix_time(1_600_000_000, 123),
        )
        .unwrap();
    }

    #[test]
    fn tree_round_trips_through_catalog_and_stream() {
        let src = tempfile::tempdir().unwrap();
        make_tree(src.path());
        let (cat, data) = read_all(Box::new(TreeSource::new(src.path()).unwrap()));
        let cat = cat.unwrap();
        let sparse = cat.iter().find(|e| e.path == b"sparse").unwrap();
        assert!(sparse.is_sparse(), "sparse file detected: {sparse:?}");
        assert_eq!(sparse.data_len, 4096);
        assert!(cat.iter().any(|e| e.kind == Kind::Hardlink));
        let dst = tempfile::tempdir().unwrap();
        let out = dst.path().join("restored");
        let mut w = TreeWriter::new(&out, cat.clone()).unwrap();
        for piece in data.chunks(1000) {
            w.write_all(piece).unwrap();
        }
        w.finish().unwrap();
        let (cat2, data2) = read_all(Box::new(TreeSource::new(&out).unwrap()));
        assert_eq!(data, data2);
        let strip = |c: Vec<Entry>| -> Vec<Entry> {
            c.into_iter()
                .map(|mut e| {
                    if e.path.is_empty() {
                        e.mtime_sec = 0;
                        e.mtime_nsec = 0;
                    }
                    e
                })
                .collect()
        };
        assert_eq!(strip(cat), strip(cat2.unwrap()));
        let m = fs::metadata(out.join("big.bin")).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_600_000_000, 123));
        assert_eq!(
            fs::read_link(out.join("link")).unwrap(),
            Path::new("a/b/hello.txt")
        );
        assert_eq!(
            fs::metadata(out.join("a/b/hello.txt")).unwrap().mode() & 0o777,
            0o600
        );
        assert!(fs::metadata(out.join("sparse")).unwrap().blocks() * 512 < 1 << 20);
    }

    #[test]
    fn tar_output_matches_the_tree() {
        let src = tempfile::tempdir().unwrap();
        make_tree(src.path());
        let (cat, data) = read_all(Box::new(TreeSource::new(src.path()).unwrap()));
        let mut w = TarWriter::new(Vec::new(), cat.unwrap());
        w.write_all(&data).unwrap();
        let tarball = w.finish().unwrap();
        let mut ar = tar::Archive::new(&tarball[..]);
        let mut seen = HashMap::new();
        for ent in ar.entries().unwrap() {
            let mut ent = ent.unwrap();
            let p = ent.path().unwrap().to_string_lossy().into_owned();
            let mut buf = Vec::new();
            ent.read_to_end(&mut buf).unwrap();
            seen.insert(p, buf);
        }
        assert_eq!(seen["a/b/hello.txt"], b"hello world");
        assert_eq!(seen[&"x".repeat(120)], b"long name");
        let sp = &seen["sparse"];
        assert_eq!(sp.len(), (2 << 20) | 4096);
        assert!(sp[..1 << 20].iter().all(|&b| b == 0));
        assert_eq!(&sp[1 << 20..(1 << 20) + 4096], &[9u8; 4096][..]);
    }

    #[test]
    fn restore_refuses_a_non_empty_target() {
        let dst = tempfile::tempdir().unwrap();
        fs::write(dst.path().join("keep.txt"), b"mine").unwrap();
        let e = TreeWriter::new(dst.path(), vec![])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not empty"), "{e}");
        assert_eq!(fs::read(dst.path().join("keep.txt")).unwrap(), b"mine");
    }
}
