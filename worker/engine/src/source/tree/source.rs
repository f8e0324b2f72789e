//! Reading a directory tree for backup.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};
use crate::format::catalog::{Entry, Kind};
use crate::source::Source;

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
        // SAFETY: lseek takes plain integers; `fd` is open for as long as `file` is borrowed.
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
