//! Block transfer: a restore split between the store and the receiver.
//!
//! A restore served over the network spends most of its CPU where it runs:
//! decompressing blocks, assembling windows, and then copying every restored
//! byte through the socket on both ends. With block transfer the sender plans
//! the same forward-assembly windows as [`crate::restore`] and reads the same
//! containers, but ships each window's extents and the *stored* blocks they
//! need (compressed and checksummed, as on disk); the receiver checks,
//! decompresses and assembles them into its output. A fraction of the bytes
//! crosses the wire (1/5.8 on the kube series) and the decoding runs where
//! the data is wanted.
//!
//! The stream is a sequence of frames, each `tag: u8, len: u64 LE, payload`:
//!
//! - `H` (first): `RVB1`, `u32` JSON length, JSON `{series, version, kind,
//!   logical_bytes}`, `u32` catalog part count, then each part as `u32`
//!   length and bytes (tree versions: the receiver rebuilds the tar stream or
//!   the directory from the catalog and the content, as a local restore does);
//! - `W` (one per window): `u32` group count; per group (one container) its
//!   id `u64`, `u32` block count, per block `vbase u64, vlen u32, stored_len
//!   u32, flags u8, crc u32`, then the blocks' stored bytes; then `u32` extent
//!   count and per extent `0, len u64` (zeros) or `1, group u32, vaddr u64,
//!   len u64` (bytes of that group's container);
//! - `E` (last): empty; a stream without it was cut short.
//!
//! Every block is checksummed by the sender before it goes (a corrupt
//! container fails the restore there) and again by the receiver before it is
//! decoded (nothing damaged on the way is written out).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::config::MIB;
use crate::error::{Error, Result};
use crate::format::catalog;
use crate::format::container::{BlockInfo, ContainerId};
use crate::format::records::VersionKind;
use crate::recipe::{catalog_parts, version_extents, Extent};
use crate::restore::faa::{blocks_of, fill_pieces, prefetch, take_window, ContainerCache, Piece};
use crate::restore::{begin, conclude, RestoreOptions, RestoreReport};
use crate::source::tree::{TarWriter, TreeWriter};
use crate::store::{Store, VersionSel};

/// The media type of a block-transfer stream.
pub const MEDIA_TYPE: &str = "application/vnd.revault.blocks.v1";

const MAGIC: &[u8; 4] = b"RVB1";
const HEADER: u8 = b'H';
const WINDOW: u8 = b'W';
const END: u8 = b'E';
const FRAME_HEAD: usize = 9;
const BLOCK_META: usize = 21;
/// Larger frames are refused: a window is at most the restore memory (16 GiB
/// by the API's bound) and its blocks are no larger than its bytes.
const MAX_FRAME: u64 = 40 << 30;

/// What the header frame says about the version.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TransferHeader {
    pub series: String,
    pub version: u32,
    pub kind: VersionKind,
    pub logical_bytes: u64,
}

/// Sends a version as a block-transfer stream into `out`, planning windows of
/// `opts.cache_bytes` (the receiver's assembly memory). The cache policy is
/// always the forward assembly area: the receiver holds one window and no
/// container cache.
pub fn send(
    store: &Store,
    series: &str,
    sel: VersionSel,
    opts: &RestoreOptions,
    out: &mut dyn Write,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let view = store.read_view();
    let (s, v, mut rep) = begin(&view, series, &sel, opts)?;
    rep.cache = "faa".into();
    let parts = match v.kind {
        VersionKind::Tree => catalog_parts(&view, &s, &v)?,
        VersionKind::Stream => Vec::new(),
    };
    let head = TransferHeader {
        series: s.name.clone(),
        version: v.number,
        kind: v.kind,
        logical_bytes: v.logical_bytes,
    };
    let json = serde_json::to_vec(&head).expect("header serialises");
    let mut p = Vec::new();
    p.extend_from_slice(MAGIC);
    p.extend_from_slice(&(json.len() as u32).to_le_bytes());
    p.extend_from_slice(&json);
    p.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for part in &parts {
        p.extend_from_slice(&(part.len() as u32).to_le_bytes());
        p.extend_from_slice(part);
    }
    write_frame(out, HEADER, &p)?;

    let (mut ex, depth) = version_extents(&view, &s, &v)?;
    rep.chain_depth = depth;
    let cap = opts.cache_bytes.max(MIB);
    let cache = ContainerCache::default();
    let mut carry = None;
    let mut next = take_window(&view, &mut ex, &mut carry, cap)?;
    // The first window too: for containers read back from a bucket, every range of a window is
    // requested at once instead of two at a time by the threads that assemble it.
    prefetch(store, &cache, &next);
    let mut sent = 0u64;
    while !next.is_empty() {
        let window = std::mem::take(&mut next);
        next = take_window(&view, &mut ex, &mut carry, cap)?;
        prefetch(store, &cache, &next);
        if let Some(c) = &opts.cancel {
            if c.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
        }
        window_frame(store, &cache, &window, &mut p, out, &mut rep)?;
        sent += window.iter().map(|e| e.len()).sum::<u64>();
        if let Some(pr) = &opts.progress {
            pr(sent);
        }
    }
    write_frame(out, END, &[])?;
    out.flush()
        .map_err(|e| out_err(e, "sending restored data"))?;
    rep.peak_cache_bytes = cap.min(v.logical_bytes);
    conclude(&mut rep, started);
    Ok(rep)
}

/// Sends one window's frame: its containers' needed blocks, then its
/// extents. The frame's length is known from the containers' block tables
/// before anything is read, so each container's blocks go out as soon as
/// they are read and checked: the server holds one container's blocks, not
/// the window's.
fn window_frame(
    store: &Store,
    cache: &ContainerCache,
    window: &[Extent],
    p: &mut Vec<u8>,
    out: &mut dyn Write,
    rep: &mut RestoreReport,
) -> Result<()> {
    let mut group_of: FxHashMap<ContainerId, u32> = FxHashMap::default();
    let mut groups: Vec<(ContainerId, BTreeSet<usize>)> = Vec::new();
    let mut files = Vec::new();
    for e in window {
        if let Extent::Stored {
            container,
            vaddr,
            len,
        } = *e
        {
            let g = *group_of.entry(container).or_insert_with(|| {
                groups.push((container, BTreeSet::new()));
                groups.len() as u32 - 1
            });
            if files.len() <= g as usize {
                files.push(cache.get(store, container)?);
            }
            groups[g as usize]
                .1
                .extend(blocks_of(&files[g as usize], vaddr, len)?);
        }
    }
    let mut len = 4 + 4;
    for ((_, needed), cf) in groups.iter().zip(&files) {
        len += 8 + 4 + needed.len() * BLOCK_META;
        len += needed
            .iter()
            .map(|&i| cf.footer.blocks[i].stored_len as usize)
            .sum::<usize>();
    }
    for e in window {
        len += match e {
            Extent::Zero { .. } => 1 + 8,
            Extent::Stored { .. } => 1 + 4 + 8 + 8,
        };
    }
    let mut head = [0u8; FRAME_HEAD];
    head[0] = WINDOW;
    head[1..].copy_from_slice(&(len as u64).to_le_bytes());
    out.write_all(&head)
        .map_err(|e| out_err(e, "sending restored data"))?;
    let mut sent = 0;
    let mut put = |b: &[u8]| -> Result<()> {
        sent += b.len();
        out.write_all(b)
            .map_err(|e| out_err(e, "sending restored data"))
    };
    put(&(groups.len() as u32).to_le_bytes())?;
    let mut stored = Vec::new();
    for ((id, needed), cf) in groups.iter().zip(&files) {
        let (lo, hi) = (
            *needed.first().expect("a group has blocks"),
            *needed.last().expect("a group has blocks") + 1,
        );
        // One read spanning the group's blocks, as the FAA does.
        let n = cf.read_blocks(lo..hi, &mut stored)?;
        rep.container_reads += 1;
        rep.bytes_read += n;
        p.clear();
        p.extend_from_slice(&id.0.to_le_bytes());
        p.extend_from_slice(&(needed.len() as u32).to_le_bytes());
        for &i in needed {
            let b = &cf.footer.blocks[i];
            p.extend_from_slice(&b.vbase.to_le_bytes());
            p.extend_from_slice(&b.vlen.to_le_bytes());
            p.extend_from_slice(&b.stored_len.to_le_bytes());
            p.push(b.flags);
            p.extend_from_slice(&b.crc.to_le_bytes());
            rep.bytes_decoded += u64::from(b.vlen);
        }
        put(p)?;
        let base = cf.footer.blocks[lo].offset;
        for &i in needed {
            let b = &cf.footer.blocks[i];
            let s = (b.offset - base) as usize;
            let bytes = &stored[s..s + b.stored_len as usize];
            if crc32c::crc32c(bytes) != b.crc {
                return Err(Error::CorruptContainer {
                    container: id.to_string(),
                    detail: format!("checksum mismatch in the block at offset {}", b.offset),
                });
            }
            put(bytes)?;
        }
    }
    p.clear();
    p.extend_from_slice(&(window.len() as u32).to_le_bytes());
    for e in window {
        match *e {
            Extent::Zero { len } => {
                p.push(0);
                p.extend_from_slice(&len.to_le_bytes());
            }
            Extent::Stored {
                container,
                vaddr,
                len,
            } => {
                p.push(1);
                p.extend_from_slice(&group_of[&container].to_le_bytes());
                p.extend_from_slice(&vaddr.to_le_bytes());
                p.extend_from_slice(&len.to_le_bytes());
            }
        }
    }
    put(p)?;
    if sent != len {
        // The receiver would misread everything after this frame.
        return Err(Error::Invalid(format!(
            "block transfer: a window frame announced {len} bytes and holds {sent}"
        )));
    }
    Ok(())
}

fn write_frame(out: &mut dyn Write, tag: u8, payload: &[u8]) -> Result<()> {
    let mut head = [0u8; FRAME_HEAD];
    head[0] = tag;
    head[1..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    out.write_all(&head)
        .and_then(|_| out.write_all(payload))
        .map_err(|e| out_err(e, "sending restored data"))
}

fn out_err(e: std::io::Error, context: &str) -> Error {
    match e.downcast::<Error>() {
        Ok(inner) => inner,
        Err(e) => Error::Io {
            context: context.into(),
            source: e,
        },
    }
}

/// Where a receiver puts the version.
pub enum Destination {
    /// The version's bytes: a stream version as-is, a tree version as tar.
    Writer(Box<dyn Write + Send>),
    /// Recreate a directory version under this path.
    Dir(PathBuf),
}

enum Output {
    Raw(Box<dyn Write + Send>),
    Tar(TarWriter<Box<dyn Write + Send>>),
    Tree(TreeWriter),
}

impl Output {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::Raw(w) => w,
            Output::Tar(w) => w,
            Output::Tree(w) => w,
        }
    }
}

/// What a finished transfer wrote.
#[derive(Clone, Debug)]
pub struct Received {
    pub header: TransferHeader,
    /// Directory restores: what could not be restored as it was (ownership as
    /// a non-root user, ...).
    pub warnings: Vec<String>,
}

/// Decodes a block-transfer stream fed to it in pieces of any size (as they
/// come off the network) and writes the version to its destination. Each
/// complete window goes to a decoding thread, which checks, decompresses
/// (a window's containers in parallel) and writes it while the next window
/// arrives; one window waits at most, so memory stays at about two windows'
/// stored blocks and one assembly area.
pub struct Receiver {
    /// The frame being received: its head (tag and length) and payload.
    head: Vec<u8>,
    frame: Vec<u8>,
    /// Payload length of the frame being received, once its head is complete.
    need: Option<usize>,
    dest: Option<Destination>,
    header: Option<TransferHeader>,
    decoder: Option<Decoder>,
    written: Arc<AtomicU64>,
    ended: bool,
}

struct Decoder {
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
    /// Frames the decoder is done with, to be filled again: a fresh buffer
    /// per window costs a page fault per 4 KiB.
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    thread: std::thread::JoinHandle<Result<Output>>,
}

impl Receiver {
    pub fn new(dest: Destination) -> Self {
        Receiver {
            head: Vec::with_capacity(FRAME_HEAD),
            frame: Vec::new(),
            need: None,
            dest: Some(dest),
            header: None,
            decoder: None,
            written: Arc::default(),
            ended: false,
        }
    }

    /// The header, once its frame has arrived.
    pub fn header(&self) -> Option<&TransferHeader> {
        self.header.as_ref()
    }

    /// Bytes of the version written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Takes the next piece of the stream and hands on every frame it completes.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<()> {
        if self.ended && !data.is_empty() {
            return Err(bad("data after the end frame"));
        }
        loop {
            let len = match self.need {
                Some(n) => n,
                None => {
                    let n = (FRAME_HEAD - self.head.len()).min(data.len());
                    self.head.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if self.head.len() < FRAME_HEAD {
                        return Ok(());
                    }
                    let len = u64::from_le_bytes(self.head[1..].try_into().unwrap());
                    if len > MAX_FRAME {
                        return Err(bad(format!("a frame of {len} bytes")));
                    }
                    let mut f = match &self.decoder {
                        Some(d) => d.spare.try_recv().unwrap_or_default(),
                        None => Vec::new(),
                    };
                    f.clear();
                    // Grows as the bytes arrive beyond 64 MiB: a damaged length
                    // must not allocate what never comes.
                    f.reserve((len as usize).min(64 << 20));
                    self.frame = f;
                    self.need = Some(len as usize);
                    len as usize
                }
            };
            let n = (len - self.frame.len()).min(data.len());
            self.frame.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.frame.len() < len {
                return Ok(());
            }
            let tag = self.head[0];
            self.head.clear();
            self.need = None;
            let frame = std::mem::take(&mut self.frame);
            match (tag, self.header.is_some(), self.ended) {
                (HEADER, false, _) => self.header_frame(&frame)?,
                (WINDOW, true, false) => self.window(frame)?,
                (END, true, false) => self.ended = true,
                _ => return Err(bad(format!("unexpected frame {:?}", tag as char))),
            }
            if data.is_empty() {
                return Ok(());
            }
            if self.ended {
                return Err(bad("data after the end frame"));
            }
        }
    }

    /// Ends the transfer: fails when the stream stopped before its end frame,
    /// else completes the output (a directory's metadata, the tar trailer).
    pub fn finish(mut self) -> Result<Received> {
        let Some(header) = self.header.take() else {
            return Err(bad("the stream ended before its header"));
        };
        let out = self
            .decoder
            .take()
            .ok_or_else(|| bad("the decoding thread stopped"))?
            .join()?;
        let written = self.written();
        if !self.ended || !self.head.is_empty() || written != header.logical_bytes {
            return Err(bad(format!(
                "the stream ended after {written} of {} bytes of the version",
                header.logical_bytes
            )));
        }
        let warnings = match out {
            Output::Raw(mut w) => {
                w.flush().map_err(|e| out_err(e, "writing restored data"))?;
                Vec::new()
            }
            Output::Tar(w) => {
                w.finish()?
                    .flush()
                    .map_err(|e| out_err(e, "writing restored data"))?;
                Vec::new()
            }
            Output::Tree(w) => w.finish()?,
        };
        Ok(Received { header, warnings })
    }

    fn header_frame(&mut self, p: &[u8]) -> Result<()> {
        let mut r = Reader(p);
        if r.take(4)? != MAGIC {
            return Err(bad("not a block-transfer stream"));
        }
        let n = r.u32()? as usize;
        let header: TransferHeader =
            serde_json::from_slice(r.take(n)?).map_err(|e| bad(format!("header: {e}")))?;
        let parts = (0..r.u32()?)
            .map(|_| {
                let n = r.u32()? as usize;
                Ok(r.take(n)?.to_vec())
            })
            .collect::<Result<Vec<_>>>()?;
        let what = format!("{} version {}", header.series, header.version);
        let out = match (header.kind, self.dest.take().expect("one header")) {
            (VersionKind::Stream, Destination::Writer(w)) => Output::Raw(w),
            (VersionKind::Stream, Destination::Dir(p)) => {
                return Err(Error::Invalid(format!(
                "{what} is a single stream, not a directory; restore it to a file instead of {}",
                p.display()
            )))
            }
            (VersionKind::Tree, Destination::Writer(w)) => {
                Output::Tar(TarWriter::new(w, catalog::decode(&what, &parts)?))
            }
            (VersionKind::Tree, Destination::Dir(p)) => {
                Output::Tree(TreeWriter::new(&p, catalog::decode(&what, &parts)?)?)
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(1);
        let (spare_tx, spare) = std::sync::mpsc::channel::<Vec<u8>>();
        let written = self.written.clone();
        let logical = header.logical_bytes;
        let thread = std::thread::Builder::new()
            .name("revault-receive".into())
            .spawn(move || -> Result<Output> {
                let mut out = out;
                let mut area = Vec::new();
                for frame in rx {
                    decode_window(&frame, &mut area, out.writer(), &written, logical)?;
                    let _ = spare_tx.send(frame);
                }
                Ok(out)
            })
            .expect("spawn the decoding thread");
        self.decoder = Some(Decoder { tx, spare, thread });
        self.header = Some(header);
        Ok(())
    }

    /// Hands a window to the decoding thread; when that thread has stopped
    /// on an error, returns its error.
    fn window(&mut self, frame: Vec<u8>) -> Result<()> {
        let d = self.decoder.as_ref().expect("after the header");
        if d.tx.send(frame).is_ok() {
            return Ok(());
        }
        match self.decoder.take().expect("checked").join() {
            Err(e) => Err(e),
            Ok(_) => Err(bad("the decoding thread stopped")),
        }
    }
}

impl Decoder {
    fn join(self) -> Result<Output> {
        drop(self.tx);
        self.thread
            .join()
            .map_err(|p| crate::error::panicked("decoding", p))?
    }
}

/// Decodes one window frame and writes its bytes.
fn decode_window(
    p: &[u8],
    area: &mut Vec<u8>,
    out: &mut dyn Write,
    written: &AtomicU64,
    logical: u64,
) -> Result<()> {
    let mut r = Reader(p);
    let n_groups = r.u32()? as usize;
    let mut groups = Vec::with_capacity(n_groups.min(1 << 16));
    for _ in 0..n_groups {
        let id = ContainerId(r.u64()?);
        let n = r.u32()? as usize;
        let mut metas = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let m = r.take(BLOCK_META)?;
            metas.push(BlockInfo {
                vbase: u64::from_le_bytes(m[0..8].try_into().unwrap()),
                vlen: u32::from_le_bytes(m[8..12].try_into().unwrap()),
                stored_len: u32::from_le_bytes(m[12..16].try_into().unwrap()),
                flags: m[16],
                crc: u32::from_le_bytes(m[17..21].try_into().unwrap()),
                offset: 0,
            });
        }
        let mut blocks = Vec::with_capacity(metas.len());
        // Blocks come in data-space order and apart, as in their container.
        let mut end = 0u64;
        for m in &metas {
            if m.vbase < end {
                return Err(bad("a container's blocks overlap or are out of order"));
            }
            if !crate::format::container::plausible_block(m.flags, m.stored_len, m.vlen) {
                return Err(bad(format!(
                    "a block of {} stored bytes claims {} bytes of data",
                    m.stored_len, m.vlen
                )));
            }
            end = (m.vbase.checked_add(u64::from(m.vlen)))
                .ok_or_else(|| bad("a block ends past 2^64"))?;
            blocks.push(r.take(m.stored_len as usize)?);
        }
        groups.push((id, metas, blocks));
    }
    let n_ext = r.u32()? as usize;
    let mut extents = Vec::with_capacity(n_ext.min(1 << 20));
    let mut total = 0u64;
    for _ in 0..n_ext {
        let e = match r.take(1)?[0] {
            0 => (None, 0, r.u64()?),
            1 => {
                let g = r.u32()? as usize;
                if g >= groups.len() {
                    return Err(bad(format!(
                        "an extent of container group {g} of {}",
                        groups.len()
                    )));
                }
                let (vaddr, len) = (r.u64()?, r.u64()?);
                if vaddr.checked_add(len).is_none() {
                    return Err(bad("an extent ends past 2^64"));
                }
                (Some(g), vaddr, len)
            }
            k => return Err(bad(format!("extent kind {k}"))),
        };
        total = total
            .checked_add(e.2)
            .ok_or_else(|| bad("a window's extents add up past 2^64 bytes"))?;
        extents.push(e);
    }
    if !r.0.is_empty() {
        return Err(bad("trailing bytes in a window"));
    }
    let done = written.load(Ordering::Relaxed);
    if total > logical - done {
        return Err(bad(format!(
            "windows hold more than the version's {logical} bytes"
        )));
    }
    // The window's area, cut into one piece per extent, grouped by container.
    let total = total as usize;
    if area.len() < total {
        area.resize(total, 0);
    }
    let mut pieces: Vec<Vec<Piece<'_>>> = (0..groups.len()).map(|_| Vec::new()).collect();
    let mut rest: &mut [u8] = &mut area[..total];
    for &(g, vaddr, len) in &extents {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
        rest = tail;
        match g {
            None => head.fill(0),
            Some(g) => pieces[g].push((head, vaddr)),
        }
    }
    let decoded = AtomicU64::new(0);
    groups
        .par_iter()
        .zip(pieces)
        .try_for_each(|((id, metas, blocks), pieces)| {
            let pairs: Vec<(&BlockInfo, &[u8])> =
                metas.iter().zip(blocks.iter().copied()).collect();
            fill_pieces(*id, &pairs, pieces, &decoded)
        })?;
    out.write_all(&area[..total])
        .map_err(|e| out_err(e, "writing restored data"))?;
    written.store(done + total as u64, Ordering::Relaxed);
    Ok(())
}

fn bad(what: impl Into<String>) -> Error {
    Error::Invalid(format!("block transfer: {}", what.into()))
}

/// Reads little-endian fields off the front of a payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(bad("a frame ends inside a field"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}
