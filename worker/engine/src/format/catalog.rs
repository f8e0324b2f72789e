//! The per-version catalog of a directory backup: every entry's name, type,
//! mode, owner, times, link target and sparse layout, kept apart from file
//! contents so that renaming the top directory or touching mtimes does not
//! disturb content dedup (tar interleaves 512-byte headers with data, which puts
//! metadata inside content chunks).
//!
//! Contents of regular files appear in the version's data stream in catalog
//! order; each file records how many bytes it contributes (`data_len`), so a
//! file's stream offset is the sum of the `data_len` of the files before it.
//!
//! Encoding: entries sorted by path, each path stored as (shared prefix length,
//! suffix), fields as varints; the whole catalog zstd-compressed and split into
//! parts sealed with CRC32C.

use std::collections::HashMap;

use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_bytes, put_ivarint, put_uvarint, seal_crc, Reader};

pub const PART_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A hard link to an earlier file entry (`link` is that entry's path).
    Hardlink,
    Fifo,
    CharDev,
    BlockDev,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::File => 0,
            Kind::Dir => 1,
            Kind::Symlink => 2,
            Kind::Hardlink => 3,
            Kind::Fifo => 4,
            Kind::CharDev => 5,
            Kind::BlockDev => 6,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            0 => Kind::File,
            1 => Kind::Dir,
            2 => Kind::Symlink,
            3 => Kind::Hardlink,
            4 => Kind::Fifo,
            5 => Kind::CharDev,
            6 => Kind::BlockDev,
            _ => return None,
        })
    }

    /// The kind in words, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Dir => "a directory",
            Kind::Symlink => "a symlink",
            Kind::Hardlink => "a hard link",
            Kind::Fifo => "a FIFO",
            Kind::CharDev => "a character device",
            Kind::BlockDev => "a block device",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the backed-up directory, `/`-separated; "" is the
    /// directory itself.
    pub path: Vec<u8>,
    pub kind: Kind,
    /// Permission and special bits (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    /// Logical size of a regular file.
    pub size: u64,
    /// Bytes this file contributes to the data stream.
    pub data_len: u64,
    /// Data extents (offset, length) of a sparse file; empty for a dense file.
    pub extents: Vec<(u64, u64)>,
    /// Symlink target or hard link's earlier path.
    pub link: Vec<u8>,
    pub rdev: u64,
}

impl Entry {
    pub fn new(path: Vec<u8>, kind: Kind) -> Self {
        Entry {
            path,
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            size: 0,
            data_len: 0,
            extents: Vec::new(),
            link: Vec::new(),
            rdev: 0,
        }
    }

    pub fn is_sparse(&self) -> bool {
        !self.extents.is_empty()
    }

    pub fn path_str(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// Checks, entry by entry in stream order, that entries describe one
/// directory tree that can be recreated as it is. Tar readers use it to
/// refuse impossible uploads, and restores to refuse hostile catalogs
/// (a store written by an older build may hold any catalog).
///
/// The rules:
/// - a path is relative and clean: `/`-separated components, none empty,
///   `.` or `..`, no NUL; `""` is the root, and must be a directory;
/// - nothing lies below a non-directory (above all a symlink: a restore
///   would otherwise write through it);
/// - no path repeats, except a directory listed again (tar does that);
/// - a hard link names an earlier regular file (or an earlier hard link to
///   one) by a clean path; a symlink's target is content, anything but
///   empty or holding NUL;
/// - a file's sparse layout fits its size and data length.
///
/// Parents that are not listed are implied directories, and a directory may
/// be listed after its children.
///
/// Uploads ([`TreeCheck::for_upload`]) are also held to what a directory
/// restore can make: a component of at most [`NAME_MAX`] bytes, a symlink
/// target of at most [`SYMLINK_MAX`] (Linux's limits; `mkdirat` and
/// `symlinkat` refuse longer ones). Whole paths have no limit: restores make
/// them one component at a time. Restores do not apply these limits, so a
/// version stored before them restores everything it can, failing at the
/// entry that cannot be made.
pub struct TreeCheck {
    /// The tree so far, one node per path: node 0 is the root, the others
    /// found by (parent node, component). Keyed by
    /// component, not by whole path, so a deep path costs its length, not
    /// its length squared.
    /// (A map per directory, so a lookup borrows the component instead of
    /// allocating a key: this runs for every component of every entry.)
    children: HashMap<u32, HashMap<Box<[u8]>, u32>>,
    /// What each node is (`None`: the root, until it is listed).
    seen: Vec<Option<Seen>>,
    /// Refuse names a directory restore could not make.
    upload: bool,
}

/// The longest file name component a directory restore can make.
pub const NAME_MAX: usize = 255;
/// The longest symlink target a directory restore can make.
pub const SYMLINK_MAX: usize = 4095;

#[derive(Clone, Copy)]
enum Seen {
    /// A directory only implied by a deeper path.
    Implied,
    Entry(Kind),
}

/// What [`TreeCheck::add`] found an entry to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    New,
    /// A directory listed before: nothing new to create.
    RepeatedDir,
}

/// The path as it is shown in messages: quoted, with escapes.
fn quoted(p: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(p))
}

/// True for `""` (the root) and for relative paths whose components are
/// neither empty, `.` nor `..`, without NUL bytes.
pub fn is_clean_path(p: &[u8]) -> bool {
    p.is_empty()
        || (!p.contains(&0)
            && p.split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b".."))
}

impl Default for TreeCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl TreeCheck {
    pub fn new() -> Self {
        TreeCheck {
            children: HashMap::new(),
            seen: vec![None],
            upload: false,
        }
    }

    /// The check for new uploads: also refuses names no restore could make.
    pub fn for_upload() -> Self {
        TreeCheck {
            upload: true,
            ..Self::new()
        }
    }

    /// Checks the next entry. The error says what is wrong, naming the
    /// entry's path first (callers say whether it is a member or an entry).
    pub fn add(&mut self, e: &Entry) -> std::result::Result<Checked, String> {
        let path = &e.path[..];
        let name = quoted(path);
        if !is_clean_path(path) {
            return Err(format!(
                "{name} is not a clean relative path (no leading '/', no empty, '.' or '..' components, no NUL)"
            ));
        }
        if self.upload {
            check_lengths(e, &name)?;
        }
        if path.is_empty() && e.kind != Kind::Dir {
            return Err(format!(
                "{name} (the root) must be a directory, not {}",
                e.kind.describe()
            ));
        }
        check_content(e, &name)?;
        if e.kind == Kind::Hardlink {
            self.check_hardlink(e, &name)?;
        }
        // The deepest node that exists, then the components below it.
        let (at, rest) = self.walk(path, &name)?;
        let checked = if rest.is_empty() {
            self.relisted(at, e, &name)?
        } else {
            let mut parent = at;
            for c in &rest[..rest.len() - 1] {
                parent = self.insert(parent, c, Seen::Implied);
            }
            self.insert(parent, rest[rest.len() - 1], Seen::Entry(e.kind));
            Checked::New
        };
        Ok(checked)
    }

    /// Walks `path` down from the root while its nodes exist. Returns the
    /// last node reached and the components left (none: the path itself
    /// exists), or an error if a parent on the way is not a directory.
    fn walk<'p>(
        &self,
        path: &'p [u8],
        name: &str,
    ) -> std::result::Result<(u32, Vec<&'p [u8]>), String> {
        let comps: Vec<&[u8]> = if path.is_empty() {
            Vec::new()
        } else {
            path.split(|&b| b == b'/').collect()
        };
        let mut at = 0u32;
        let mut end = 0usize;
        for (i, c) in comps.iter().enumerate() {
            if let Some(Some(Seen::Entry(k))) = self.seen.get(at as usize) {
                if *k != Kind::Dir {
                    return Err(format!(
                        "{name} lies below {}, which is {}",
                        quoted(&path[..end]),
                        k.describe()
                    ));
                }
            }
            match self.child(at, c) {
                Some(n) => at = n,
                None => return Ok((at, comps[i..].to_vec())),
            }
            end += c.len() + usize::from(i > 0);
        }
        Ok((at, Vec::new()))
    }

    /// An entry whose path exists already: a directory may be listed again
    /// (or after what lies below it); anything else is refused.
    fn relisted(&mut self, at: u32, e: &Entry, name: &str) -> std::result::Result<Checked, String> {
        let slot = &mut self.seen[at as usize];
        match *slot {
            None => {
                *slot = Some(Seen::Entry(e.kind));
                Ok(Checked::New)
            }
            Some(Seen::Implied) if e.kind == Kind::Dir => {
                *slot = Some(Seen::Entry(Kind::Dir));
                Ok(Checked::New)
            }
            Some(Seen::Entry(Kind::Dir)) if e.kind == Kind::Dir => Ok(Checked::RepeatedDir),
            Some(Seen::Implied) => Err(format!(
                "{name} is {}, but earlier entries lie below it",
                e.kind.describe()
            )),
            Some(Seen::Entry(k)) => Err(format!(
                "{name} is listed twice: {}, then {}",
                k.describe(),
                e.kind.describe()
            )),
        }
    }

    fn insert(&mut self, parent: u32, c: &[u8], what: Seen) -> u32 {
        // More than 2^32 paths would exhaust memory long before.
        let id = u32::try_from(self.seen.len()).expect("fewer than 2^32 paths");
        self.seen.push(Some(what));
        self.children
            .entry(parent)
            .or_default()
            .insert(c.into(), id);
        id
    }

    fn child(&self, parent: u32, c: &[u8]) -> Option<u32> {
        self.children.get(&parent)?.get(c).copied()
    }

    /// What `path` is, if the tree holds it.
    fn lookup(&self, path: &[u8]) -> Option<Seen> {
        let mut at = 0u32;
        if !path.is_empty() {
            for c in path.split(|&b| b == b'/') {
                at = self.child(at, c)?;
            }
        }
        self.seen[at as usize]
    }

    fn check_hardlink(&self, e: &Entry, name: &str) -> std::result::Result<(), String> {
        let target = quoted(&e.link);
        if e.link.is_empty() || !is_clean_path(&e.link) {
            return Err(format!(
                "{name} is a hard link to {target}, which is not a clean relative path inside the tree"
            ));
        }
        match self.lookup(&e.link) {
            Some(Seen::Entry(Kind::File | Kind::Hardlink)) => Ok(()),
            Some(Seen::Entry(k)) => Err(format!(
                "{name} is a hard link to {target}, which is {}; a hard link may only name a regular file",
                k.describe()
            )),
            Some(Seen::Implied) => Err(format!(
                "{name} is a hard link to {target}, which is a directory; a hard link may only name a regular file"
            )),
            None => Err(format!(
                "{name} is a hard link to {target}, which is not an earlier regular file of the tree"
            )),
        }
    }
}

/// Names a directory restore can make: see [`TreeCheck`].
fn check_lengths(e: &Entry, name: &str) -> std::result::Result<(), String> {
    if let Some(c) = e.path.split(|&b| b == b'/').find(|c| c.len() > NAME_MAX) {
        return Err(format!(
            "{name} has a component of {} bytes; at most {NAME_MAX} are allowed",
            c.len()
        ));
    }
    if e.kind == Kind::Symlink && e.link.len() > SYMLINK_MAX {
        return Err(format!(
            "{name} is a symlink to a target of {} bytes; at most {SYMLINK_MAX} are allowed",
            e.link.len()
        ));
    }
    Ok(())
}

/// Per-kind content: a symlink's target, a file's layout.
fn check_content(e: &Entry, name: &str) -> std::result::Result<(), String> {
    match e.kind {
        Kind::Symlink if e.link.is_empty() || e.link.contains(&0) => Err(format!(
            "{name} is a symlink with an empty target or one holding NUL"
        )),
        Kind::File if !layout_fits(e) => Err(format!(
            "{name} has a data layout that does not fit its size ({} bytes, {} of data, extents {:?})",
            e.size, e.data_len, e.extents
        )),
        _ => Ok(()),
    }
}

/// A dense file has at most its size in data; a sparse one's extents are in
/// order, do not overlap, end within the size and add up to the data length.
fn layout_fits(e: &Entry) -> bool {
    if e.extents.is_empty() {
        return e.data_len <= e.size;
    }
    let mut end = 0u64;
    let mut total = 0u64;
    for &(off, len) in &e.extents {
        let Some(next) = off.checked_add(len) else {
            return false;
        };
        if off < end || next > e.size {
            return false;
        }
        end = next;
        total += len;
    }
    total == e.data_len
}

/// Encodes entries (already in stream order) into sealed, compressed parts.
pub fn encode(entries: &[Entry]) -> Vec<Vec<u8>> {
    let mut raw = Vec::with_capacity(entries.len() * 48);
    raw.push(1u8);
    put_uvarint(&mut raw, entries.len() as u64);
    let mut prev: &[u8] = b"";
    for e in entries {
        let shared = prev.iter().zip(&e.path).take_while(|(a, b)| a == b).count();
        put_uvarint(&mut raw, shared as u64);
        put_bytes(&mut raw, &e.path[shared..]);
        prev = &e.path;
        raw.push(e.kind.code());
        put_uvarint(&mut raw, u64::from(e.mode));
        put_uvarint(&mut raw, u64::from(e.uid));
        put_uvarint(&mut raw, u64::from(e.gid));
        put_ivarint(&mut raw, e.mtime_sec);
        put_uvarint(&mut raw, u64::from(e.mtime_nsec));
        match e.kind {
            Kind::File => {
                put_uvarint(&mut raw, e.size);
                put_uvarint(&mut raw, e.data_len);
                put_uvarint(&mut raw, e.extents.len() as u64);
                let mut last = 0u64;
                for &(off, len) in &e.extents {
                    put_uvarint(&mut raw, off - last);
                    put_uvarint(&mut raw, len);
                    last = off + len;
                }
            }
            Kind::Symlink | Kind::Hardlink => put_bytes(&mut raw, &e.link),
            Kind::CharDev | Kind::BlockDev => put_uvarint(&mut raw, e.rdev),
            Kind::Dir | Kind::Fifo => {}
        }
    }
    let packed = zstd::bulk::compress(&raw, 3).expect("zstd compresses in memory");
    packed
        .chunks(PART_BYTES)
        .map(|c| {
            let mut p = c.to_vec();
            seal_crc(&mut p);
            p
        })
        .collect()
}

/// Decodes a catalog from its parts. `what` names the version in errors.
pub fn decode(what: &str, parts: &[Vec<u8>]) -> Result<Vec<Entry>> {
    let bad = |d: &str| corrupt_meta(format!("catalog of {what}"), d.to_string());
    let mut packed = Vec::new();
    for p in parts {
        packed.extend_from_slice(open_crc(p).ok_or_else(|| bad("checksum mismatch"))?);
    }
    let raw = zstd::stream::decode_all(&packed[..]).map_err(|e| bad(&e.to_string()))?;
    let mut r = Reader::new(&raw);
    let t = || bad("truncated entry");
    if r.u8().ok_or_else(t)? != 1 {
        return Err(bad("unknown catalog format"));
    }
    let n = r.uvarint().ok_or_else(t)? as usize;
    let mut out: Vec<Entry> = Vec::with_capacity(n.min(1 << 20));
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..n {
        let shared = r.uvarint().ok_or_else(t)? as usize;
        let suffix = r.bytes().ok_or_else(t)?;
        if shared > prev.len() {
            return Err(bad("bad path prefix"));
        }
        let mut path = prev[..shared].to_vec();
        path.extend_from_slice(suffix);
        let kind =
            Kind::from_code(r.u8().ok_or_else(t)?).ok_or_else(|| bad("unknown entry type"))?;
        let mut e = Entry::new(path, kind);
        e.mode = r.uvarint().ok_or_else(t)? as u32;
        e.uid = r.uvarint().ok_or_else(t)? as u32;
        e.gid = r.uvarint().ok_or_else(t)? as u32;
        e.mtime_sec = r.ivarint().ok_or_else(t)?;
        e.mtime_nsec = r.uvarint().ok_or_else(t)? as u32;
        match kind {
            Kind::File => {
                e.size = r.uvarint().ok_or_else(t)?;
                e.data_len = r.uvarint().ok_or_else(t)?;
                let ne = r.uvarint().ok_or_else(t)? as usize;
                let mut last = 0u64;
                let past_end = || bad("an extent ends past the largest file offset");
                for _ in 0..ne {
                    let off = last
                        .checked_add(r.uvarint().ok_or_else(t)?)
                        .ok_or_else(past_end)?;
                    let len = r.uvarint().ok_or_else(t)?;
                    e.extents.push((off, len));
                    last = off.checked_add(len).ok_or_else(past_end)?;
                }
            }
            Kind::Symlink | Kind::Hardlink => e.link = r.bytes().ok_or_else(t)?.to_vec(),
            Kind::CharDev | Kind::BlockDev => e.rdev = r.uvarint().ok_or_else(t)?,
            Kind::Dir | Kind::Fifo => {}
        }
        prev.clone_from(&e.path);
        out.push(e);
    }
    if !r.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        let mut root = Entry::new(b"".to_vec(), Kind::Dir);
        root.mode = 0o755;
        let mut f = Entry::new(b"a/file.txt".to_vec(), Kind::File);
        f.size = 10_000;
        f.data_len = 4096;
        f.extents = vec![(0, 2048), (8000, 2048)];
        f.mtime_sec = -5;
        f.mtime_nsec = 999_999_999;
        let mut l = Entry::new(b"a/link".to_vec(), Kind::Symlink);
        l.link = b"file.txt".to_vec();
        let mut d = Entry::new(b"dev".to_vec(), Kind::CharDev);
        d.rdev = 0x0103;
        vec![root, Entry::new(b"a".to_vec(), Kind::Dir), f, l, d]
    }

    #[test]
    fn catalog_round_trips() {
        let es = sample();
        let parts = encode(&es);
        assert_eq!(decode("v", &parts).unwrap(), es);
    }

    /// Compresses and seals a raw entry encoding as `encode` does.
    fn parts_of(raw: &[u8]) -> Vec<Vec<u8>> {
        let mut p = zstd::bulk::compress(raw, 1).unwrap();
        seal_crc(&mut p);
        vec![p]
    }

    #[test]
    fn extents_past_the_largest_offset_are_refused() {
        // One sparse file whose only extent starts at u64::MAX and is 2 bytes long.
        let mut raw = vec![1u8];
        put_uvarint(&mut raw, 1);
        put_uvarint(&mut raw, 0);
        put_bytes(&mut raw, b"f");
        raw.push(Kind::File.code());
        for field in [0o644, 0, 0, 0, 0, 10, 2, 1, u64::MAX, 2] {
            put_uvarint(&mut raw, field);
        }
        let e = decode("default/x version 1", &parts_of(&raw))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("catalog of default/x version 1") && e.contains("extent"),
            "{e}"
        );
    }

    #[test]
    fn corrupt_catalog_is_reported() {
        let mut parts = encode(&sample());
        let n = parts[0].len();
        parts[0][n / 2] ^= 0x40;
        let e = decode("default/x version 2", &parts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("catalog of default/x version 2"), "{e}");
    }
}
