//! Directory trees: reading one for backup ([`TreeSource`]) and writing one
//! back from a restored data stream, either into a directory ([`TreeWriter`])
//! or as a tar stream ([`TarWriter`]). A tar stream is extracted into a
//! directory by [`extract_tar`]. Both directory paths go through the one safe
//! writer in `dir.rs`: nothing is written outside the target.

mod dir;
mod source;
mod tarwriter;

use std::io::{self, Read, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::catalog::{Entry, Kind, TreeCheck};
use crate::source::tar::TarSource;
use crate::source::Source;
use dir::DirWriter;

pub use source::TreeSource;
pub use tarwriter::TarWriter;

/// What to do with each catalog entry while the data stream is replayed.
trait EntryHandler {
    /// Called in catalog order before any data of the entry.
    fn begin(&mut self, e: &Entry) -> Result<()>;
    /// File bytes at `offset` within the current file.
    fn data(&mut self, e: &Entry, offset: u64, buf: &[u8]) -> Result<()>;
    /// Called after the last data byte of a file.
    fn end_file(&mut self, e: &Entry) -> Result<()>;
    /// Called once every entry is written.
    fn finish(&mut self) -> Result<()>;
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
        self.handler.finish()?;
        Ok(self.handler)
    }
}

fn to_io(e: Error) -> io::Error {
    io::Error::other(e)
}

/// Restores a tree into a directory from its catalog and data stream.
pub struct TreeWriter {
    replay: CatalogReplay<DirWriter>,
}

impl TreeWriter {
    /// `root` must not exist or be an empty directory (a `lost+found` is
    /// allowed). The whole catalog is checked first, so a hostile one (see
    /// [`TreeCheck`]) fails before anything is written.
    pub fn new(root: &Path, entries: Vec<Entry>) -> Result<Self> {
        let mut check = TreeCheck::new();
        for e in &entries {
            check.add(e).map_err(|why| dir::refused(root, &why))?;
        }
        drop(check);
        Ok(TreeWriter {
            replay: CatalogReplay::new(entries, DirWriter::new(root)?),
        })
    }

    /// Applies the directories' metadata (owners, modes, times) and returns
    /// warnings for entries that could not be fully recreated (e.g. devices
    /// without privileges).
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

/// Extracts a tar stream into `root` (which must not exist or be empty) as
/// it arrives, through the same checks and writer as a restore from a
/// catalog. `name` names the stream in errors. Returns warnings for entries
/// that could not be fully recreated. Reading stops at the end-of-archive
/// marker; the caller drains whatever follows.
pub fn extract_tar(name: &str, r: impl Read + Send, root: &Path) -> Result<Vec<String>> {
    let mut src = TarSource::new(name, r);
    let mut w = DirWriter::new(root)?;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let more = src.next_piece()?;
        // Entries without data, then (with `more`) the file whose data follows.
        let entries = src.take_entries();
        let (others, with_data) = match entries.split_last() {
            Some((last, others)) if more => (others, Some(last)),
            _ => (&entries[..], None),
        };
        for e in others {
            w.begin(e)?;
            if e.kind == Kind::File {
                w.end_file(e)?;
            }
        }
        let Some(e) = with_data else {
            break;
        };
        w.begin(e)?;
        let mut offset = 0u64;
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            w.data(e, offset, &buf[..n])?;
            offset += n as u64;
        }
        w.end_file(e)?;
    }
    w.finish()?;
    Ok(w.warnings)
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
    use std::collections::HashMap;
    use std::fs::{self, File};
    use std::io::Read;
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

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
