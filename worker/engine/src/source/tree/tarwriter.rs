//! Writing a tree as a tar stream.

use std::io::{self, Write};

use super::{to_io, CatalogReplay, EntryHandler};
use crate::error::{Error, Result};
use crate::format::catalog::{Entry, Kind};
use crate::source::tar::pad;

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

    fn data(&mut self, e: &Entry, offset: u64, buf: &[u8]) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        // A catalog's extents in order and within the size (an old store's
        // may not be): otherwise the member would not match its header.
        let end = offset + buf.len() as u64;
        if offset < self.written || end > e.size {
            return Err(Error::CorruptMetadata {
                what: "catalog".into(),
                detail: format!(
                    "the data layout of {:?} does not fit its size",
                    e.path_str()
                ),
            });
        }
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

    fn finish(&mut self) -> Result<()> {
        let io_ctx = |err: io::Error| Error::Io {
            context: "writing tar stream".into(),
            source: err,
        };
        self.zeros(1024).map_err(io_ctx)?;
        self.out.flush().map_err(io_ctx)
    }
}
