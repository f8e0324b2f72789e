//! Container files: append-only, written once, never modified in place.
//!
//! ```text
//! header  (64 B)  magic "RVLTCON1", container id, created (unix s), format, crc32c
//! blocks          chunk data, zstd-compressed (or raw) in blocks of >= 64 KiB
//! footer          block table (flags, stored len, data len, crc32c of stored bytes)
//!                 unit table (unit id, data offset, chunks: flags, len, fingerprint)
//! trailer (32 B)  footer offset, footer len, footer crc32c, container id, magic "RVLTEND1"
//! ```
//!
//! Chunk data is addressed by its offset in the container's *data space*: the
//! concatenation of all blocks' uncompressed bytes. A unit (segment or chunk)
//! occupies one contiguous range of that space. Every block carries a CRC32C of
//! its stored bytes, checked before it is decompressed, so a flipped byte is
//! reported with the container's name and never returned as data.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::config::Compression;
use crate::error::{Error, IoContext, Result};
use crate::format::codec::{put_uvarint, Reader};
use crate::format::fp::Fp;

pub const HEADER_LEN: u64 = 64;
pub const TRAILER_LEN: u64 = 32;
const MAGIC: &[u8; 8] = b"RVLTCON1";
const END_MAGIC: &[u8; 8] = b"RVLTEND1";
const FORMAT: u32 = 1;

pub const BLOCK_RAW: u8 = 0;
pub const BLOCK_ZSTD: u8 = 1;

pub const CHUNK_ZERO: u8 = 1;
pub const CHUNK_ABSENT: u8 = 2;
/// The chunk's bytes are another unit's chunk, stored earlier by the same
/// backup (a duplicate inside one version); `link` names it.
pub const CHUNK_LINK: u8 = 4;

/// A container id: the session that wrote it and a sequence number within the
/// session. A crashed session's containers are exactly its directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(pub u64);

impl ContainerId {
    pub const SEQ_BITS: u32 = 24;
    /// Session ids are below this: the rest of the id's 64 bits.
    pub const SESSION_LIMIT: u64 = 1 << (64 - Self::SEQ_BITS);

    pub fn new(session: u64, seq: u64) -> Self {
        debug_assert!(seq < 1 << Self::SEQ_BITS);
        ContainerId((session << Self::SEQ_BITS) | seq)
    }

    pub fn session(self) -> u64 {
        self.0 >> Self::SEQ_BITS
    }

    pub fn seq(self) -> u64 {
        self.0 & ((1 << Self::SEQ_BITS) - 1)
    }

    /// Path relative to the data directory.
    pub fn rel_path(self) -> PathBuf {
        PathBuf::from(session_dir_name(self.session())).join(format!("{:06x}.rvc", self.seq()))
    }

    pub fn path(self, data_dir: &Path) -> PathBuf {
        data_dir.join(self.rel_path())
    }
}

pub fn session_dir_name(session: u64) -> String {
    format!("{session:08x}")
}

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{:06x}", session_dir_name(self.session()), self.seq())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub flags: u8,
    /// Offset of the stored bytes in the file.
    pub offset: u64,
    pub stored_len: u32,
    /// Offset of the block's first byte in the container's data space.
    pub vbase: u64,
    pub vlen: u32,
    pub crc: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub flags: u8,
    pub len: u32,
    pub fp: Fp,
    /// For `CHUNK_LINK`: (unit, chunk index) holding the bytes.
    pub link: Option<(u64, u32)>,
}

impl ChunkEntry {
    pub fn new(flags: u8, len: u32, fp: Fp) -> Self {
        ChunkEntry {
            flags,
            len,
            fp,
            link: None,
        }
    }

    /// The chunk this one's bytes come from, if it is a live link.
    pub fn link_target(&self) -> Option<(u64, u32)> {
        if self.flags & CHUNK_LINK != 0 && self.flags & CHUNK_ABSENT == 0 {
            self.link
        } else {
            None
        }
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(self.flags);
        put_uvarint(out, u64::from(self.len));
        out.extend_from_slice(&self.fp.0);
        if self.flags & CHUNK_LINK != 0 {
            let (u, i) = self.link.unwrap_or_default();
            put_uvarint(out, u);
            put_uvarint(out, u64::from(i));
        }
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Option<Self> {
        let flags = r.u8()?;
        if flags & !(CHUNK_ZERO | CHUNK_ABSENT | CHUNK_LINK) != 0 {
            return None;
        }
        let len = u32::try_from(r.uvarint()?).ok()?;
        let fp = Fp(r.array()?);
        let link = if flags & CHUNK_LINK != 0 {
            Some((r.uvarint()?, u32::try_from(r.uvarint()?).ok()?))
        } else {
            None
        };
        Some(ChunkEntry {
            flags,
            len,
            fp,
            link,
        })
    }

    /// Bytes this chunk occupies in the data space.
    pub fn stored_len(&self) -> u64 {
        if self.flags & (CHUNK_ZERO | CHUNK_ABSENT | CHUNK_LINK) != 0 {
            0
        } else {
            u64::from(self.len)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitEntry {
    pub unit: u64,
    pub vbase: u64,
    pub chunks: Vec<ChunkEntry>,
}

#[derive(Clone, Debug, Default)]
pub struct Footer {
    pub blocks: Vec<BlockInfo>,
    pub units: Vec<UnitEntry>,
    pub vbytes: u64,
}

impl Footer {
    /// Blocks overlapping the data-space range `[vaddr, vaddr+len)`.
    pub fn blocks_for(&self, vaddr: u64, len: u64) -> Range<usize> {
        if len == 0 {
            return 0..0;
        }
        let first = self
            .blocks
            .partition_point(|b| b.vbase + u64::from(b.vlen) <= vaddr);
        let end = vaddr.saturating_add(len);
        let last = self.blocks.partition_point(|b| b.vbase < end);
        first..last.max(first)
    }
}

fn corrupt(id: ContainerId, detail: impl Into<String>) -> Error {
    Error::CorruptContainer {
        container: id.to_string(),
        detail: detail.into(),
    }
}

/// Compresses one block. Falls back to raw when compression does not help.
pub fn encode_block(data: &[u8], compression: Compression) -> (u8, Vec<u8>) {
    if let Compression::Zstd(level) = compression {
        ZSTD_C.with(|c| {
            let mut c = c.borrow_mut();
            if c.as_ref().map(|(l, _)| *l) != Some(level) {
                *c = zstd::bulk::Compressor::new(level).ok().map(|z| (level, z));
            }
            if let Some((_, z)) = c.as_mut() {
                if let Ok(out) = z.compress(data) {
                    if out.len() < data.len() {
                        return (BLOCK_ZSTD, out);
                    }
                }
            }
            (BLOCK_RAW, data.to_vec())
        })
    } else {
        (BLOCK_RAW, data.to_vec())
    }
}

thread_local! {
    static ZSTD_C: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_D: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// zstd holds at most 128 KiB of content per block of at least 4 bytes (an RLE block).
const ZSTD_MAX_RATIO: u64 = 32 * 1024;

/// Whether `vlen` bytes can come out of `stored_len` stored bytes: callers size a block's
/// buffer by `vlen` before decoding it, so a footer or a transfer stream claiming more than
/// its bytes can hold is refused before anything that large is allocated.
pub(crate) fn plausible_block(flags: u8, stored_len: u32, vlen: u32) -> bool {
    match flags {
        BLOCK_RAW => stored_len == vlen,
        _ => u64::from(vlen) <= u64::from(stored_len) * ZSTD_MAX_RATIO,
    }
}

/// Verifies a block's checksum and decodes it into `out` (exactly `vlen` bytes).
pub fn decode_block(id: ContainerId, b: &BlockInfo, stored: &[u8], out: &mut [u8]) -> Result<()> {
    if stored.len() != b.stored_len as usize || out.len() != b.vlen as usize {
        return Err(corrupt(
            id,
            format!("block at offset {} has the wrong size", b.offset),
        ));
    }
    if crc32c::crc32c(stored) != b.crc {
        return Err(corrupt(
            id,
            format!("checksum mismatch in the block at offset {}", b.offset),
        ));
    }
    match b.flags {
        BLOCK_RAW => {
            out.copy_from_slice(stored);
            Ok(())
        }
        BLOCK_ZSTD => ZSTD_D.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = zstd::bulk::Decompressor::new().ok();
            }
            let d = d
                .as_mut()
                .ok_or_else(|| corrupt(id, "cannot create a zstd decompressor"))?;
            match d.decompress_to_buffer(stored, out) {
                Ok(n) if n == out.len() => Ok(()),
                Ok(n) => Err(corrupt(
                    id,
                    format!(
                        "block at offset {} decompressed to {n} bytes, expected {}",
                        b.offset,
                        out.len()
                    ),
                )),
                Err(e) => Err(corrupt(id, format!("block at offset {}: {e}", b.offset))),
            }
        }),
        f => Err(corrupt(id, format!("unknown block encoding {f}"))),
    }
}

/// Writes one container file sequentially. Blocks arrive already encoded (the
/// caller compresses them in parallel); `finish` writes the footer and fsyncs.
pub struct ContainerWriter {
    id: ContainerId,
    path: PathBuf,
    file: std::io::BufWriter<File>,
    offset: u64,
    vbytes: u64,
    footer: Footer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedContainer {
    pub id: ContainerId,
    /// Bytes of the file on disk.
    pub file_bytes: u64,
    /// Uncompressed bytes of chunk data.
    pub vbytes: u64,
}

impl ContainerWriter {
    pub fn create(data_dir: &Path, id: ContainerId) -> Result<Self> {
        let path = id.path(data_dir);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).ctx(|| format!("creating {}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(|| format!("creating container {}", path.display()))?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&id.0.to_le_bytes());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        header.extend_from_slice(&now.to_le_bytes());
        header.extend_from_slice(&FORMAT.to_le_bytes());
        header.resize(60, 0);
        let crc = crc32c::crc32c(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        let mut file = std::io::BufWriter::with_capacity(1 << 20, file);
        file.write_all(&header)
            .ctx(|| format!("writing container {}", path.display()))?;
        Ok(ContainerWriter {
            id,
            path,
            file,
            offset: HEADER_LEN,
            vbytes: 0,
            footer: Footer::default(),
        })
    }

    pub fn write_block(&mut self, flags: u8, stored: &[u8], vlen: u32) -> Result<()> {
        self.file
            .write_all(stored)
            .ctx(|| format!("writing container {}", self.path.display()))?;
        self.footer.blocks.push(BlockInfo {
            flags,
            offset: self.offset,
            stored_len: stored.len() as u32,
            vbase: self.vbytes,
            vlen,
            crc: crc32c::crc32c(stored),
        });
        self.offset += stored.len() as u64;
        self.vbytes += u64::from(vlen);
        Ok(())
    }

    pub fn add_unit(&mut self, u: UnitEntry) {
        self.footer.units.push(u);
    }

    /// Writes the footer and trailer and fsyncs the file (the tests' shortcut;
    /// sessions use `finish_unsynced` so sealing overlaps with writeback).
    #[cfg(test)]
    pub fn finish(self) -> Result<SealedContainer> {
        let (sealed, file) = self.finish_unsynced()?;
        file.sync_data()
            .ctx(|| format!("syncing container {}", sealed.id))?;
        Ok(sealed)
    }

    /// Writes the footer and trailer and starts writeback without waiting for
    /// it; the caller must `sync_data` the returned file before the commit.
    /// Sealing the next container then overlaps with this one reaching disk.
    pub fn finish_unsynced(mut self) -> Result<(SealedContainer, File)> {
        let footer = encode_footer(&self.footer);
        let mut trailer = Vec::with_capacity(TRAILER_LEN as usize);
        trailer.extend_from_slice(&self.offset.to_le_bytes());
        trailer.extend_from_slice(&(footer.len() as u32).to_le_bytes());
        trailer.extend_from_slice(&crc32c::crc32c(&footer).to_le_bytes());
        trailer.extend_from_slice(&self.id.0.to_le_bytes());
        trailer.extend_from_slice(END_MAGIC);
        let path = self.path.clone();
        let ctx = || format!("writing container {}", path.display());
        self.file.write_all(&footer).ctx(ctx)?;
        self.file.write_all(&trailer).ctx(ctx)?;
        let file = self
            .file
            .into_inner()
            .map_err(|e| e.into_error())
            .ctx(ctx)?;
        use std::os::fd::AsRawFd;
        // SAFETY: advisory writeback request on a valid fd.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
        let sealed = SealedContainer {
            id: self.id,
            file_bytes: self.offset + footer.len() as u64 + TRAILER_LEN,
            vbytes: self.vbytes,
        };
        Ok((sealed, file))
    }

    /// Removes a container that will not be finished (an aborted backup).
    pub fn discard(self) {
        let path = self.path.clone();
        drop(self.file);
        let _ = std::fs::remove_file(path);
    }
}

pub(crate) fn encode_footer(f: &Footer) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + f.blocks.len() * 12 + f.units.len() * 64);
    out.push(1u8);
    put_uvarint(&mut out, f.blocks.len() as u64);
    for b in &f.blocks {
        out.push(b.flags);
        put_uvarint(&mut out, u64::from(b.stored_len));
        put_uvarint(&mut out, u64::from(b.vlen));
        out.extend_from_slice(&b.crc.to_le_bytes());
    }
    put_uvarint(&mut out, f.units.len() as u64);
    for u in &f.units {
        put_uvarint(&mut out, u.unit);
        put_uvarint(&mut out, u.vbase);
        put_uvarint(&mut out, u.chunks.len() as u64);
        for c in &u.chunks {
            c.encode_into(&mut out);
        }
    }
    out
}

pub(crate) fn decode_footer(id: ContainerId, buf: &[u8], with_units: bool) -> Result<Footer> {
    let bad = || corrupt(id, "malformed footer");
    let mut r = Reader::new(buf);
    if r.u8().ok_or_else(bad)? != 1 {
        return Err(corrupt(id, "unknown footer format"));
    }
    let n = r.uvarint().ok_or_else(bad)? as usize;
    let mut f = Footer {
        blocks: Vec::with_capacity(n.min(1 << 20)),
        ..Default::default()
    };
    let mut offset = HEADER_LEN;
    for _ in 0..n {
        let flags = r.u8().ok_or_else(bad)?;
        let stored_len = u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?;
        let vlen = u32::try_from(r.uvarint().ok_or_else(bad)?).map_err(|_| bad())?;
        let crc = r.u32_le().ok_or_else(bad)?;
        if !plausible_block(flags, stored_len, vlen) {
            return Err(corrupt(
                id,
                format!("a block of {stored_len} stored bytes claims {vlen} bytes of data"),
            ));
        }
        f.blocks.push(BlockInfo {
            flags,
            offset,
            stored_len,
            vbase: f.vbytes,
            vlen,
            crc,
        });
        offset += u64::from(stored_len);
        f.vbytes += u64::from(vlen);
    }
    if with_units {
        let nu = r.uvarint().ok_or_else(bad)? as usize;
        for _ in 0..nu {
            let unit = r.uvarint().ok_or_else(bad)?;
            let vbase = r.uvarint().ok_or_else(bad)?;
            let nc = r.uvarint().ok_or_else(bad)? as usize;
            let mut chunks = Vec::with_capacity(nc.min(1 << 16));
            for _ in 0..nc {
                chunks.push(ChunkEntry::decode_from(&mut r).ok_or_else(bad)?);
            }
            f.units.push(UnitEntry {
                unit,
                vbase,
                chunks,
            });
        }
        if !r.is_empty() {
            return Err(bad());
        }
    }
    Ok(f)
}

/// A container's file that is not in the data directory: evicted to the durable tier
/// (revault-remote) and read back on demand. Offsets are those of the file as written.
pub trait ColdFile: Send + Sync {
    /// The file's length in bytes.
    fn file_len(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`; a copy that does not open (corrupt or tampered)
    /// is an error naming the container, never bytes.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Hints that `range` will be read soon (a restore's next window).
    fn prefetch(&self, _range: Range<u64>) {}
}

/// Where an open container's bytes come from.
pub enum Backing {
    /// Its file in the data directory.
    Local(File),
    /// The durable tier.
    Cold(Box<dyn ColdFile>),
}

impl Backing {
    fn read_at(&self, buf: &mut [u8], offset: u64, id: ContainerId) -> Result<()> {
        match self {
            Backing::Local(f) => read_at(f, buf, offset, id),
            Backing::Cold(c) => c.read_at(buf, offset),
        }
    }
}

/// An open container: its file and decoded footer.
pub struct ContainerFile {
    pub id: ContainerId,
    pub backing: Backing,
    pub footer: Footer,
    pub file_len: u64,
}

impl ContainerFile {
    /// Opens the container's file in `data_dir` and validates header, trailer and footer
    /// checksums.
    pub fn open(data_dir: &Path, id: ContainerId, with_units: bool) -> Result<Self> {
        match Self::open_local(data_dir, id)? {
            Some(file) => Self::open_backing(id, Backing::Local(file), with_units),
            None => Err(Error::MissingContainer {
                container: id.to_string(),
                path: id.path(data_dir),
            }),
        }
    }

    /// The container's file in `data_dir`, or `None` if there is none.
    pub fn open_local(data_dir: &Path, id: ContainerId) -> Result<Option<File>> {
        let path = id.path(data_dir);
        match File::open(&path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io {
                context: format!("opening container {}", path.display()),
                source: e,
            }),
        }
    }

    /// Validates header, trailer and footer checksums of the container behind `backing`.
    pub fn open_backing(id: ContainerId, backing: Backing, with_units: bool) -> Result<Self> {
        let file_len = match &backing {
            Backing::Local(f) => f
                .metadata()
                .ctx(|| format!("reading container {id}"))?
                .len(),
            Backing::Cold(c) => c.file_len(),
        };
        if file_len < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(id, format!("file is truncated ({file_len} bytes)")));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        backing.read_at(&mut header, 0, id)?;
        if &header[..8] != MAGIC {
            return Err(corrupt(id, "bad header magic"));
        }
        if crc32c::crc32c(&header[..60]) != u32::from_le_bytes(header[60..64].try_into().unwrap()) {
            return Err(corrupt(id, "header checksum mismatch"));
        }
        if u64::from_le_bytes(header[8..16].try_into().unwrap()) != id.0 {
            return Err(corrupt(id, "header names a different container"));
        }
        let mut trailer = [0u8; TRAILER_LEN as usize];
        backing.read_at(&mut trailer, file_len - TRAILER_LEN, id)?;
        if &trailer[24..32] != END_MAGIC {
            return Err(corrupt(
                id,
                "bad trailer (the file is truncated or overwritten)",
            ));
        }
        if u64::from_le_bytes(trailer[16..24].try_into().unwrap()) != id.0 {
            return Err(corrupt(id, "trailer names a different container"));
        }
        let foff = u64::from_le_bytes(trailer[0..8].try_into().unwrap());
        let flen = u64::from(u32::from_le_bytes(trailer[8..12].try_into().unwrap()));
        let fcrc = u32::from_le_bytes(trailer[12..16].try_into().unwrap());
        if foff < HEADER_LEN || foff.checked_add(flen + TRAILER_LEN) != Some(file_len) {
            return Err(corrupt(
                id,
                "footer position is inconsistent with the file size",
            ));
        }
        let mut fbuf = vec![0u8; flen as usize];
        backing.read_at(&mut fbuf, foff, id)?;
        if crc32c::crc32c(&fbuf) != fcrc {
            return Err(corrupt(id, "footer checksum mismatch"));
        }
        let footer = decode_footer(id, &fbuf, with_units)?;
        let blocks_end = footer
            .blocks
            .last()
            .map(|b| b.offset + u64::from(b.stored_len))
            .unwrap_or(HEADER_LEN);
        if blocks_end != foff {
            return Err(corrupt(id, "block table does not match the file layout"));
        }
        Ok(ContainerFile {
            id,
            backing,
            footer,
            file_len,
        })
    }

    /// Reads the stored bytes of blocks `range` with one read.
    pub fn read_blocks(&self, range: Range<usize>, buf: &mut Vec<u8>) -> Result<u64> {
        if range.is_empty() {
            buf.clear();
            return Ok(0);
        }
        let first = &self.footer.blocks[range.start];
        let last = &self.footer.blocks[range.end - 1];
        let start = first.offset;
        let end = last.offset + u64::from(last.stored_len);
        buf.resize((end - start) as usize, 0);
        self.backing.read_at(buf, start, self.id)?;
        Ok(end - start)
    }

    /// Hints that data-space bytes `[vaddr, vaddr+len)` will be read soon: the kernel starts
    /// reading them from a local file, a cold file fetches them from the bucket in the
    /// background (so a restore's waits for them overlap its decoding of what came before).
    /// Returns the stored bytes the hint covers.
    pub fn prefetch(&self, vaddr: u64, len: u64) -> u64 {
        let blocks = &self.footer.blocks[self.footer.blocks_for(vaddr, len)];
        let (Some(b0), Some(b1)) = (blocks.first(), blocks.last()) else {
            return 0;
        };
        let (start, end) = (b0.offset, b1.offset + u64::from(b1.stored_len));
        match &self.backing {
            Backing::Local(file) => {
                use std::os::fd::AsRawFd;
                // SAFETY: advisory call on a valid fd.
                unsafe {
                    libc::posix_fadvise(
                        file.as_raw_fd(),
                        start as libc::off_t,
                        (end - start) as libc::off_t,
                        libc::POSIX_FADV_WILLNEED,
                    );
                }
            }
            Backing::Cold(c) => c.prefetch(start..end),
        }
        end - start
    }

    /// The whole data space, decoded (empty for a container without data).
    pub fn read_all(&self) -> Result<Vec<u8>> {
        let mut data = vec![0u8; self.footer.vbytes as usize];
        if !data.is_empty() {
            self.read_range(0, &mut data)?;
        }
        Ok(data)
    }

    /// Decodes data-space range `[vaddr, vaddr+out.len())` into `out`: one
    /// read, blocks checksummed and decompressed in parallel (a whole
    /// container is decoded by every core; restores wait on this).
    pub fn read_range(&self, vaddr: u64, out: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        if out.is_empty() {
            return Ok(());
        }
        // The metadata names the range; the footer says what the file holds.
        // A range past the data (they disagree) is corruption, not a panic
        // or a short read that leaves part of `out` unwritten.
        let end = vaddr.checked_add(out.len() as u64);
        if end.is_none_or(|e| e > self.footer.vbytes) {
            return Err(corrupt(
                self.id,
                format!(
                    "the metadata asks for data bytes {vaddr}..{} but the container holds {}",
                    vaddr.saturating_add(out.len() as u64),
                    self.footer.vbytes
                ),
            ));
        }
        let blocks = self.footer.blocks_for(vaddr, out.len() as u64);
        let mut stored = Vec::new();
        self.read_blocks(blocks.clone(), &mut stored)?;
        let base_off = self.footer.blocks[blocks.start].offset;
        let end = vaddr + out.len() as u64;
        // Each block's share of `out`, as disjoint slices.
        let mut parts: Vec<(&BlockInfo, &mut [u8])> = Vec::with_capacity(blocks.len());
        let mut rest = out;
        for bi in blocks {
            let b = &self.footer.blocks[bi];
            let lo = vaddr.max(b.vbase);
            let hi = end.min(b.vbase + u64::from(b.vlen));
            let (part, tail) = std::mem::take(&mut rest).split_at_mut((hi - lo) as usize);
            parts.push((b, part));
            rest = tail;
        }
        parts
            .into_par_iter()
            .with_max_len(4)
            .try_for_each(|(b, part)| {
                let s = (b.offset - base_off) as usize;
                let src = &stored[s..s + b.stored_len as usize];
                if part.len() == b.vlen as usize {
                    return decode_block(self.id, b, src, part);
                }
                // A block the range only partly covers: decode it whole, copy the part.
                let mut plain = vec![0u8; b.vlen as usize];
                decode_block(self.id, b, src, &mut plain)?;
                let lo = (vaddr.max(b.vbase) - b.vbase) as usize;
                part.copy_from_slice(&plain[lo..lo + part.len()]);
                Ok(())
            })
    }
}

fn read_at(file: &File, buf: &mut [u8], offset: u64, id: ContainerId) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(id, "file is truncated")
        } else {
            Error::Io {
                context: format!("reading container {id}"),
                source: e,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_sample(dir: &Path, compression: Compression) -> (ContainerId, Vec<u8>) {
        let id = ContainerId::new(7, 3);
        let mut w = ContainerWriter::create(dir, id).unwrap();
        let mut all = Vec::new();
        for i in 0..5u32 {
            let block: Vec<u8> = (0..100_000u32).map(|j| ((j / 7 + i) % 251) as u8).collect();
            let (flags, stored) = encode_block(&block, compression);
            w.write_block(flags, &stored, block.len() as u32).unwrap();
            all.extend_from_slice(&block);
        }
        w.add_unit(UnitEntry {
            unit: 42,
            vbase: 0,
            chunks: vec![ChunkEntry::new(0, all.len() as u32, Fp::of(&all))],
        });
        let sealed = w.finish().unwrap();
        assert_eq!(sealed.vbytes, all.len() as u64);
        (id, all)
    }

    #[test]
    fn ranges_round_trip_across_blocks() {
        for comp in [Compression::None, Compression::Zstd(3)] {
            let dir = tempfile::tempdir().unwrap();
            let (id, all) = write_sample(dir.path(), comp);
            let c = ContainerFile::open(dir.path(), id, true).unwrap();
            assert_eq!(c.footer.units.len(), 1);
            assert_eq!(c.footer.units[0].unit, 42);
            for (start, len) in [
                (0usize, 10usize),
                (99_990, 30),
                (150_000, 300_000),
                (0, 500_000),
            ] {
                let mut out = vec![0u8; len];
                c.read_range(start as u64, &mut out).unwrap();
                assert_eq!(&out[..], &all[start..start + len]);
            }
        }
    }

    #[test]
    fn a_flipped_byte_is_reported_with_the_container_name() {
        let dir = tempfile::tempdir().unwrap();
        let (id, _) = write_sample(dir.path(), Compression::Zstd(3));
        let path = id.path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_LEN as usize + 100] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let c = ContainerFile::open(dir.path(), id, false).unwrap();
        let mut out = vec![0u8; 1000];
        let err = c.read_range(0, &mut out).unwrap_err().to_string();
        assert!(err.contains("00000007/000003"), "{err}");
        assert!(err.contains("checksum"), "{err}");
    }

    #[test]
    fn a_truncated_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (id, _) = write_sample(dir.path(), Compression::None);
        let path = id.path(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let err = ContainerFile::open(dir.path(), id, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("corrupt container 00000007/000003"), "{err}");
    }

    /// Issue 18: metadata that names bytes past the container's data made
    /// `read_range` panic or leave part of its output unwritten.
    #[test]
    fn a_range_past_the_data_is_reported_not_half_read() {
        let dir = tempfile::tempdir().unwrap();
        let (id, all) = write_sample(dir.path(), Compression::Zstd(3));
        let c = ContainerFile::open(dir.path(), id, false).unwrap();
        let n = all.len() as u64;
        for (start, len) in [(n - 10, 20usize), (n, 1), (n + 5000, 10), (u64::MAX - 3, 8)] {
            let mut out = vec![0u8; len];
            let e = c.read_range(start, &mut out).unwrap_err().to_string();
            assert!(
                e.contains("corrupt container 00000007/000003"),
                "{start}+{len}: {e}"
            );
            assert!(e.contains(&format!("holds {n}")), "{e}");
        }
        let mut none = [];
        c.read_range(n, &mut none).unwrap();
    }

    #[test]
    fn a_footer_claiming_more_data_than_its_blocks_hold_is_refused() {
        // A zstd block of 1007 bytes claiming 2 GB (the transfer fuzzer's out-of-memory
        // input), and a raw block claiming more than it stores.
        for (flags, stored_len, vlen) in [(BLOCK_ZSTD, 1007, 2_113_966_999), (BLOCK_RAW, 10, 20)] {
            let f = Footer {
                blocks: vec![BlockInfo {
                    flags,
                    offset: HEADER_LEN,
                    stored_len,
                    vbase: 0,
                    vlen,
                    crc: 0,
                }],
                units: vec![],
                vbytes: u64::from(vlen),
            };
            let e = decode_footer(ContainerId(7), &encode_footer(&f), true)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("claims {vlen} bytes")), "{e}");
        }
    }

    #[test]
    fn blocks_for_finds_overlaps() {
        let f = Footer {
            blocks: (0..4)
                .map(|i| BlockInfo {
                    flags: 0,
                    offset: 0,
                    stored_len: 0,
                    vbase: i * 100,
                    vlen: 100,
                    crc: 0,
                })
                .collect(),
            units: vec![],
            vbytes: 400,
        };
        assert_eq!(f.blocks_for(0, 1), 0..1);
        assert_eq!(f.blocks_for(99, 2), 0..2);
        assert_eq!(f.blocks_for(100, 100), 1..2);
        assert_eq!(f.blocks_for(150, 250), 1..4);
        assert_eq!(f.blocks_for(50, 0), 0..0);
    }
}
