//! A tar stream as a tree source: how a directory reaches the worker over the
//! network. Headers become catalog entries and each regular file's data is one
//! piece, exactly as if the directory had been walked locally, so tar's
//! 512-byte headers never land inside content chunks.
//!
//! Parsed as a stream (nothing is buffered beyond one header): ustar and GNU
//! headers via the `tar` crate's `Header`, GNU long names and links, and PAX
//! extended headers (`path`, `linkpath`, `size`, `mtime`, `uid`, `gid`).
//! GNU sparse entries are refused with a clear error, and so is a stream that
//! cannot be one directory tree ([`TreeCheck`]): an entry below a symlink or
//! another non-directory, a path listed twice (a directory may repeat), a
//! hard link to anything but an earlier regular file, a name a directory
//! restore could not make. Numbers (sizes, owners, times) that do not fit
//! or do not parse are refused, never truncated or ignored.

use std::collections::HashMap;
use std::io::Read;

use crate::error::{Error, Result};
use crate::format::catalog::{Checked, Entry, Kind, TreeCheck};
use crate::source::{input_error, Source};

pub struct TarSource<R> {
    name: String,
    r: R,
    entries: Vec<Entry>,
    /// Data bytes of the current entry not yet read, then its padding.
    remaining: u64,
    padding: u64,
    ended: bool,
    pax: HashMap<String, Vec<u8>>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    /// The tree so far, to refuse members that cannot be part of it.
    check: TreeCheck,
}

impl<R: Read + Send> TarSource<R> {
    pub fn new(name: impl Into<String>, r: R) -> Self {
        TarSource {
            name: name.into(),
            r,
            entries: Vec::new(),
            remaining: 0,
            padding: 0,
            ended: false,
            pax: HashMap::new(),
            long_name: None,
            long_link: None,
            check: TreeCheck::for_upload(),
        }
    }

    fn bad(&self, what: impl std::fmt::Display) -> Error {
        Error::Invalid(format!("{} is not a valid tar stream: {what}", self.name))
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<bool> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => {
                    return if got == 0 {
                        Ok(false)
                    } else {
                        Err(self.bad("it ends inside a header"))
                    };
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err(e)),
            }
        }
        Ok(true)
    }

    fn io_err(&self, e: std::io::Error) -> Error {
        input_error(&self.name, e)
    }

    fn skip(&mut self, mut n: u64) -> Result<()> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let k = n.min(buf.len() as u64) as usize;
            if !self.read_exact(&mut buf[..k])? {
                return Err(self.bad("it ends inside an entry"));
            }
            n -= k as u64;
        }
        Ok(())
    }

    fn read_data(&mut self, size: u64) -> Result<Vec<u8>> {
        if size > 1 << 20 {
            return Err(self.bad("an extended header is larger than 1 MiB"));
        }
        let mut v = vec![0u8; size as usize];
        if !self.read_exact(&mut v)? {
            return Err(self.bad("it ends inside an extended header"));
        }
        self.skip(pad(size))?;
        Ok(v)
    }

    /// `size` bytes of member data and their padding, refused if a size
    /// from a header (up to 2^64 - 1 in base-256 or PAX) does not fit.
    fn padded(&self, size: u64) -> Result<u64> {
        size.checked_add(pad(size))
            .ok_or_else(|| self.bad(format!("a member size of {size} bytes is too large")))
    }

    /// A numeric PAX record, if present; one that is not a number is refused.
    fn pax_field<T: std::str::FromStr>(
        &self,
        pax: &HashMap<String, Vec<u8>>,
        key: &str,
    ) -> Result<Option<T>> {
        match pax.get(key) {
            None => Ok(None),
            Some(v) => pax_num(v).map(Some).ok_or_else(|| {
                self.bad(format!(
                    "the PAX {key} {:?} is not a valid number",
                    String::from_utf8_lossy(v)
                ))
            }),
        }
    }

    /// A uid or gid: PAX's if present, else the header's.
    fn owner(&self, pax: &HashMap<String, Vec<u8>>, key: &str, header: u64) -> Result<u32> {
        let id = self.pax_field::<u64>(pax, key)?.unwrap_or(header);
        u32::try_from(id)
            .map_err(|_| self.bad(format!("a member's {key} {id} does not fit 32 bits")))
    }

    /// Normalises a member path: no leading "./" or "/", no "..", no trailing '/'.
    fn clean_path(&self, p: &[u8]) -> Result<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        for c in p.split(|&b| b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => {
                    return Err(self.bad(format!(
                        "member {:?} escapes the tree",
                        String::from_utf8_lossy(p)
                    )))
                }
                c => parts.push(c),
            }
        }
        Ok(parts.join(&b'/'))
    }
}

/// Zero bytes after `n` bytes of member data, up to the next 512-byte block.
pub fn pad(n: u64) -> u64 {
    (512 - n % 512) % 512
}

/// The checksum a header block should carry: the sum of its bytes, with the
/// checksum field itself counted as spaces.
pub fn header_sum(block: &[u8; 512]) -> u32 {
    block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum()
}

fn parse_pax(data: &[u8]) -> Option<HashMap<String, Vec<u8>>> {
    let mut out = HashMap::new();
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > rest.len() {
            return None;
        }
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n")?;
        let eq = rec.iter().position(|&b| b == b'=')?;
        out.insert(
            String::from_utf8_lossy(&rec[..eq]).into_owned(),
            rec[eq + 1..].to_vec(),
        );
        rest = &rest[len..];
    }
    Some(out)
}

/// A PAX number: decimal, with an optional fraction (times) that is dropped.
fn pax_num<T: std::str::FromStr>(v: &[u8]) -> Option<T> {
    let s = std::str::from_utf8(v).ok()?;
    let whole = s.split_once('.').map_or(s, |(w, _)| w);
    whole.parse().ok()
}

impl<R: Read + Send> Source for TarSource<R> {
    fn next_piece(&mut self) -> Result<bool> {
        // Whatever the consumer did not read of the last file, and its padding
        // (`padded` checked that the sum fits).
        let left = self.remaining + self.padding;
        self.remaining = 0;
        self.padding = 0;
        self.skip(left)?;
        while !self.ended {
            let mut block = [0u8; 512];
            if !self.read_exact(&mut block)? {
                return Err(self.bad("it ends without the end-of-archive marker"));
            }
            if block.iter().all(|&b| b == 0) {
                // End of archive (a second zero block may follow; not required).
                self.ended = true;
                break;
            }
            let h = tar::Header::from_byte_slice(&block);
            if h.cksum().map_err(|e| self.bad(e))? != header_sum(&block) {
                return Err(self.bad("a header checksum does not match"));
            }
            let mut size = h.entry_size().map_err(|e| self.bad(e))?;
            let et = h.entry_type();
            match et {
                tar::EntryType::GNULongName => {
                    self.long_name = Some(
                        self.read_data(size)?
                            .split(|&b| b == 0)
                            .next()
                            .unwrap_or_default()
                            .to_vec(),
                    );
                    continue;
                }
                tar::EntryType::GNULongLink => {
                    self.long_link = Some(
                        self.read_data(size)?
                            .split(|&b| b == 0)
                            .next()
                            .unwrap_or_default()
                            .to_vec(),
                    );
                    continue;
                }
                tar::EntryType::XHeader => {
                    let d = self.read_data(size)?;
                    self.pax =
                        parse_pax(&d).ok_or_else(|| self.bad("a PAX header is malformed"))?;
                    continue;
                }
                tar::EntryType::XGlobalHeader => {
                    self.read_data(size)?;
                    continue;
                }
                tar::EntryType::GNUSparse => {
                    return Err(self.bad(
                        "GNU sparse members are not supported; send the file without --sparse",
                    ))
                }
                _ => {}
            }
            let pax = std::mem::take(&mut self.pax);
            let raw_path = match (self.long_name.take(), pax.get("path")) {
                (_, Some(p)) => p.clone(),
                (Some(p), None) => p,
                (None, None) => h.path_bytes().into_owned(),
            };
            let link = match (self.long_link.take(), pax.get("linkpath")) {
                (_, Some(p)) => p.clone(),
                (Some(p), None) => p,
                (None, None) => h
                    .link_name_bytes()
                    .map(|l| l.into_owned())
                    .unwrap_or_default(),
            };
            if let Some(s) = self.pax_field::<u64>(&pax, "size")? {
                size = s;
            }
            let path = self.clean_path(&raw_path)?;
            let kind = match et {
                tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
                tar::EntryType::Directory => Kind::Dir,
                tar::EntryType::Symlink => Kind::Symlink,
                tar::EntryType::Link => Kind::Hardlink,
                tar::EntryType::Char => Kind::CharDev,
                tar::EntryType::Block => Kind::BlockDev,
                tar::EntryType::Fifo => Kind::Fifo,
                other => {
                    return Err(self.bad(format!(
                        "unsupported member type {:?}",
                        other.as_byte() as char
                    )))
                }
            };
            let mut e = Entry::new(path, kind);
            // The header checksum already matched: a missing numeric field
            // (some writers leave mode empty) takes the usual default.
            e.mode = h.mode().unwrap_or(0o644) & 0o7777;
            // An owner that does not fit 32 bits is refused, not truncated
            // (4294967296 would become 0: root).
            e.uid = self.owner(&pax, "uid", h.uid().unwrap_or(0))?;
            e.gid = self.owner(&pax, "gid", h.gid().unwrap_or(0))?;
            e.mtime_sec = match self.pax_field::<i64>(&pax, "mtime")? {
                Some(t) => t,
                None => i64::try_from(h.mtime().unwrap_or(0)).map_err(|_| {
                    self.bad(format!(
                        "member {:?} has an mtime out of range",
                        e.path_str()
                    ))
                })?,
            };
            if matches!(kind, Kind::CharDev | Kind::BlockDev) {
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                e.rdev = libc::makedev(major, minor);
            }
            match kind {
                Kind::Symlink => e.link = link,
                Kind::Hardlink => e.link = self.clean_path(&link)?,
                _ => {}
            }
            let data = if kind == Kind::File { size } else { 0 };
            if kind == Kind::File {
                e.size = size;
                e.data_len = size;
            }
            match self.check.add(&e) {
                Ok(Checked::New) => {}
                // Directories may repeat (e.g. "./" and "."); keep the first.
                Ok(Checked::RepeatedDir) => {
                    self.skip(self.padded(size)?)?;
                    continue;
                }
                Err(why) => return Err(self.bad(format!("member {why}"))),
            }
            self.entries.push(e);
            if data > 0 {
                self.padding = self.padded(data)? - data;
                self.remaining = data;
                return Ok(true);
            }
            // Members without data may still carry padding-less payload for
            // some writers (e.g. a size on a hard link); skip it.
            if kind != Kind::File && size > 0 {
                self.skip(self.padded(size)?)?;
            }
        }
        Ok(false)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = (self.remaining.min(buf.len() as u64)) as usize;
        let n = loop {
            match self.r.read(&mut buf[..want]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r.map_err(|e| self.io_err(e))?,
            }
        };
        if n == 0 {
            return Err(self.bad("it ends inside a file"));
        }
        self.remaining -= n as u64;
        Ok(n)
    }

    fn finish(self: Box<Self>) -> Result<Option<Vec<Entry>>> {
        Ok(Some(self.entries))
    }
}

impl<R> TarSource<R> {
    /// The entries parsed since the last call, in stream order. A reader
    /// that uses the entries as they come (an extraction) takes them here so
    /// they are not all held; what it leaves is the catalog `finish` returns.
    pub(crate) fn take_entries(&mut self) -> Vec<Entry> {
        std::mem::take(&mut self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::tree::{read_all, TarWriter, TreeSource};
    use std::io::Write;

    #[test]
    fn a_tree_sent_as_tar_matches_the_tree_walked_locally() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/one.txt"), vec![1u8; 100_000]).unwrap();
        std::fs::write(root.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("a/b/one.txt", root.join("link")).unwrap();
        std::fs::write(root.join("y".repeat(150)), b"long").unwrap();
        let (cat, data) = read_all(Box::new(TreeSource::new(root).unwrap()));
        let cat = cat.unwrap();
        let mut w = TarWriter::new(Vec::new(), cat.clone());
        w.write_all(&data).unwrap();
        let tarball = w.finish().unwrap();
        let (cat2, data2) = read_all(Box::new(TarSource::new("t", &tarball[..])));
        assert_eq!(data2, data);
        let strip = |c: Vec<Entry>| {
            c.into_iter()
                .map(|mut e| {
                    e.mtime_nsec = 0;
                    e
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(cat2.unwrap()), strip(cat));
    }

    #[test]
    fn gnu_tar_output_parses() {
        // A tar written by the `tar` crate's builder (GNU headers, long names).
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("dir/{}", "z".repeat(200));
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(&mut h, &long, &b"hello"[..]).unwrap();
        let tarball = b.into_inner().unwrap();
        let (cat, data) = read_all(Box::new(TarSource::new("t", &tarball[..])));
        let cat = cat.unwrap();
        assert_eq!(cat[0].path, long.as_bytes());
        assert_eq!(cat[0].mode, 0o600);
        assert_eq!(data, b"hello");
    }

    #[test]
    fn garbage_and_truncation_are_clear_errors() {
        let mut s = TarSource::new("upload", &[7u8; 1024][..]);
        let e = s.next_piece().unwrap_err().to_string();
        assert!(e.contains("upload is not a valid tar stream"), "{e}");
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(10_000);
        h.set_cksum();
        b.append_data(&mut h, "f", &vec![1u8; 10_000][..]).unwrap();
        let t = b.into_inner().unwrap();
        let mut s = TarSource::new("upload", &t[..3000]);
        assert!(s.next_piece().unwrap());
        let mut buf = vec![0u8; 20_000];
        let mut err = None;
        for _ in 0..10 {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    err = Some(e.to_string());
                    break;
                }
            }
        }
        assert!(err.unwrap().contains("ends inside a file"));
        let mut s = TarSource::new("upload", &b"../../etc/passwd"[..]);
        assert!(s.next_piece().is_err());
    }
}
