//! Packs units into containers for one write session.
//!
//! The caller hands over each unit's chunks and gets its location at once (a
//! container and an offset in its uncompressed data space). Blocks of about
//! `block_bytes` are cut at chunk boundaries and sent to a writer thread, which
//! compresses batches of blocks in parallel and appends them to the container
//! file in order. A container is sealed (footer + fsync) when its data reaches
//! the store's container size; a unit never spans two containers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;

use crate::config::Compression;
use crate::error::{Error, Result};
use crate::format::container::{
    encode_block, ChunkEntry, ContainerId, ContainerWriter, SealedContainer, UnitEntry,
    CHUNK_ABSENT, CHUNK_LINK,
};
use crate::format::records::ContainerRecord;
use crate::format::unit::UnitRecord;
use crate::store::{ContainerAlloc, OnSealed};
use std::collections::BTreeSet;

enum Msg {
    Open(ContainerId),
    Block(Vec<u8>),
    Unit(UnitEntry),
    Seal,
}

/// A chunk handed to the packer: its bytes (ignored for zero chunks) and entry.
pub struct PackChunk<'a> {
    pub data: &'a [u8],
    pub entry: ChunkEntry,
}

#[derive(Clone, Copy, Debug, Default)]
struct Placed {
    units: u64,
    vbytes: u64,
}

pub struct PackWriter {
    alloc: ContainerAlloc,
    container_bytes: u64,
    block_bytes: usize,
    cur: Option<(ContainerId, u64)>,
    block: Vec<u8>,
    placed: HashMap<ContainerId, Placed>,
    tx: Option<Sender<Msg>>,
    handle: Option<JoinHandle<Result<Vec<Written>>>>,
}

/// A container the writer thread sealed, with its still-open file (synced
/// with the session before the commit).
type Written = (SealedContainer, std::fs::File);

impl PackWriter {
    /// A writer for `session`'s new containers, with the store's container
    /// size, block size and compression.
    pub(crate) fn for_session(
        store: &crate::store::Store,
        session: &crate::store::Session,
    ) -> Self {
        let cfg = store.config();
        PackWriter::new(
            session.allocator(),
            store.data_dir().to_path_buf(),
            cfg.container_bytes,
            cfg.block_bytes,
            cfg.compression,
            store.sealed_listener(),
        )
    }

    pub(crate) fn new(
        alloc: ContainerAlloc,
        data_dir: PathBuf,
        container_bytes: u64,
        block_bytes: u32,
        compression: Compression,
        on_sealed: Option<OnSealed>,
    ) -> Self {
        let (tx, rx) = bounded(32);
        let handle = std::thread::Builder::new()
            .name("revault-pack".into())
            .spawn(move || writer_thread(rx, data_dir, compression, on_sealed))
            .expect("spawn pack writer");
        PackWriter {
            alloc,
            container_bytes,
            block_bytes: block_bytes as usize,
            cur: None,
            block: Vec::with_capacity(block_bytes as usize * 2),
            placed: HashMap::new(),
            tx: Some(tx),
            handle: Some(handle),
        }
    }

    fn send(&mut self, m: Msg) -> Result<()> {
        let ok = self.tx.as_ref().map(|t| t.send(m).is_ok()).unwrap_or(false);
        if ok {
            Ok(())
        } else {
            // The writer thread stopped: its error explains why.
            Err(self.join_error())
        }
    }

    fn join_error(&mut self) -> Error {
        self.tx = None;
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(p)) => crate::error::panicked("container writer", p),
            _ => Error::Internal("the container writer stopped".into()),
        }
    }

    fn flush_block(&mut self) -> Result<()> {
        if !self.block.is_empty() {
            let b = std::mem::replace(&mut self.block, Vec::with_capacity(self.block_bytes * 2));
            self.send(Msg::Block(b))?;
        }
        Ok(())
    }

    fn seal(&mut self) -> Result<()> {
        if self.cur.take().is_some() {
            self.flush_block()?;
            self.send(Msg::Seal)?;
        }
        Ok(())
    }

    /// Stores a unit's chunks; returns where its data starts.
    pub fn add_unit(&mut self, unit: u64, chunks: &[PackChunk<'_>]) -> Result<(ContainerId, u64)> {
        let stored: u64 = chunks.iter().map(|c| c.entry.stored_len()).sum();
        // A unit joins the current container if at least half of it fits:
        // with MiB-sized segments, sealing whenever the next one does not fit
        // whole would leave containers a quarter empty on average; this way
        // they hold about the configured size, overshooting by at most half a
        // unit.
        if let Some((_, used)) = self.cur {
            if used > 0 && used + stored / 2 > self.container_bytes {
                self.seal()?;
            }
        }
        if self.cur.is_none() {
            let id = self.alloc.next();
            self.send(Msg::Open(id))?;
            self.cur = Some((id, 0));
        }
        let (id, vbase) = self.cur.unwrap();
        for c in chunks {
            if c.entry.stored_len() == 0 {
                continue; // zero and absent chunks take no space
            }
            debug_assert_eq!(c.data.len(), c.entry.len as usize);
            self.block.extend_from_slice(c.data);
            if self.block.len() >= self.block_bytes {
                self.flush_block()?;
            }
        }
        // Prefer block boundaries at unit boundaries: segments then decode alone.
        if self.block.len() >= self.block_bytes / 2 {
            self.flush_block()?;
        }
        self.send(Msg::Unit(UnitEntry {
            unit,
            vbase,
            chunks: chunks.iter().map(|c| c.entry.clone()).collect(),
        }))?;
        let p = self.placed.entry(id).or_default();
        p.units += 1;
        p.vbytes += stored;
        let used = vbase + stored;
        self.cur = Some((id, used));
        if used >= self.container_bytes {
            self.seal()?;
        }
        Ok((id, vbase))
    }

    /// Seals the last container and waits for every container to be durable.
    /// Returns the container records (live counts filled from what was placed).
    pub fn finish(mut self) -> Result<Vec<(ContainerId, ContainerRecord)>> {
        self.seal()?;
        self.tx = None;
        let sealed = match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r?,
            Some(Err(p)) => return Err(crate::error::panicked("container writer", p)),
            None => return Err(Error::Internal("the container writer stopped".into())),
        };
        // Writeback started when each container was sealed; wait for all of
        // it now, before anything can commit (one fdatasync per container).
        for (s, file) in &sealed {
            file.sync_data().map_err(|e| Error::Io {
                context: format!("syncing container {}", s.id),
                source: e,
            })?;
        }
        Ok(sealed
            .into_iter()
            .map(|(s, _)| {
                let p = self.placed.get(&s.id).copied().unwrap_or_default();
                (
                    s.id,
                    ContainerRecord {
                        file_bytes: s.file_bytes,
                        vbytes: s.vbytes,
                        live_vbytes: p.vbytes,
                        live_units: p.units,
                        owner: None,
                    },
                )
            })
            .collect())
    }
}

impl Drop for PackWriter {
    fn drop(&mut self) {
        // Abandoned (error or cancel): stop the writer; the session removes files.
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn writer_thread(
    rx: Receiver<Msg>,
    data_dir: PathBuf,
    compression: Compression,
    on_sealed: Option<OnSealed>,
) -> Result<Vec<Written>> {
    let mut sealed = Vec::new();
    let mut cur: Option<ContainerWriter> = None;
    let mut pending: Vec<Vec<u8>> = Vec::new();

    fn write_pending(
        cur: &mut Option<ContainerWriter>,
        pending: &mut Vec<Vec<u8>>,
        compression: Compression,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let encoded: Vec<(u8, Vec<u8>, u32)> = pending
            .par_iter()
            .map(|b| {
                let (flags, data) = encode_block(b, compression);
                (flags, data, b.len() as u32)
            })
            .collect();
        pending.clear();
        let w = cur
            .as_mut()
            .expect("a container is open while blocks arrive");
        for (flags, data, vlen) in encoded {
            w.write_block(flags, &data, vlen)?;
        }
        Ok(())
    }

    let result = (|| -> Result<()> {
        while let Ok(m) = rx.recv() {
            match m {
                Msg::Open(id) => cur = Some(ContainerWriter::create(&data_dir, id)?),
                Msg::Block(b) => {
                    pending.push(b);
                    // Compress in parallel batches; do not sit on blocks when idle.
                    if pending.len() >= 8 || rx.is_empty() {
                        write_pending(&mut cur, &mut pending, compression)?;
                    }
                }
                Msg::Unit(u) => cur
                    .as_mut()
                    .expect("a container is open while units arrive")
                    .add_unit(u),
                Msg::Seal => {
                    write_pending(&mut cur, &mut pending, compression)?;
                    let w = cur.take().expect("a container is open when sealed");
                    let done = w.finish_unsynced()?;
                    if let Some(f) = &on_sealed {
                        f(done.0.id);
                    }
                    sealed.push(done);
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        if let Some(w) = cur.take() {
            w.discard();
        }
        return Err(e);
    }
    Ok(sealed)
}

/// Writes a unit's chunks (all stored ones, or only `keep`) to `pack`; returns
/// its new record. Chunks not kept become absent.
pub(crate) fn repack(
    id: u64,
    old: &UnitRecord,
    keep: Option<&BTreeSet<u32>>,
    data: &[u8],
    fills: &HashMap<u32, Vec<u8>>,
    pack: &mut PackWriter,
) -> Result<UnitRecord> {
    // Every chunk entry goes to the footer (absent ones flagged); only kept,
    // stored chunks carry bytes.
    let mut chunks: Vec<PackChunk<'_>> = Vec::with_capacity(old.chunks.len());
    let mut off = old.vbase as usize;
    let mut trimmed = old.trimmed;
    // Chunks of this unit that hold bytes after the repack, by fingerprint.
    let mut held: HashMap<crate::format::fp::Fp, u32> = HashMap::new();
    for (i, c) in old.chunks.iter().enumerate() {
        let len = c.stored_len() as usize;
        let src = data
            .get(off..off + len)
            .ok_or_else(|| Error::CorruptContainer {
                container: old.container.to_string(),
                detail: format!("unit {id} extends past the container's data"),
            })?;
        off += len;
        let mut entry = c.clone();
        // Chunks not kept become absent: stored ones free their bytes, links
        // release their targets (the commit counts the difference).
        let holds = len > 0 || entry.link_target().is_some();
        if holds && keep.is_some_and(|k| !k.contains(&(i as u32))) {
            entry.flags |= CHUNK_ABSENT;
            trimmed = true;
        }
        let mut bytes = if entry.stored_len() > 0 { src } else { &[][..] };
        // A kept link this repack must resolve: one into a trimmed unit
        // (`fills` has its bytes), or one into this unit whose target the
        // repack drops (slides and gc keep a linked chunk whenever they keep
        // its linker; this holds whatever the keep set).
        let resolved = match entry.link_target() {
            Some(_) if fills.contains_key(&(i as u32)) => Some(&fills[&(i as u32)][..]),
            Some((t, j))
                if t == id
                    && chunks
                        .get(j as usize)
                        .is_none_or(|p| p.entry.flags & CHUNK_ABSENT != 0) =>
            {
                let at = old.chunk_vaddr(j as usize) as usize;
                Some(data.get(at..at + entry.len as usize).ok_or_else(|| {
                    Error::CorruptContainer {
                        container: old.container.to_string(),
                        detail: format!("unit {id} chunk {i}: links past the container's data"),
                    }
                })?)
            }
            _ => None,
        };
        if let Some(b) = resolved {
            if b.len() != entry.len as usize {
                return Err(Error::CorruptContainer {
                    container: old.container.to_string(),
                    detail: format!(
                        "unit {id} chunk {i}: link resolved to {} bytes, expected {}",
                        b.len(),
                        entry.len
                    ),
                });
            }
            // It links to the unit's own copy when the unit holds one (two
            // chunks of a segment that linked to one copy elsewhere must not
            // both take its bytes); otherwise it becomes a stored chunk.
            match held.get(&entry.fp) {
                Some(&k) => entry.link = Some((id, k)),
                None => {
                    entry.flags &= !CHUNK_LINK;
                    entry.link = None;
                    bytes = b;
                }
            }
        }
        if entry.stored_len() > 0 {
            held.entry(entry.fp).or_insert(i as u32);
        }
        chunks.push(PackChunk { data: bytes, entry });
    }
    let (container, vbase) = pack.add_unit(id, &chunks)?;
    let entries = chunks.into_iter().map(|c| c.entry).collect();
    Ok(UnitRecord {
        kind: old.kind,
        fp: old.fp,
        container,
        vbase,
        trimmed,
        domain: old.domain,
        chunks: entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::container::ChunkEntry;
    use crate::format::fp::Fp;
    use crate::store::{InitOptions, OpenMode, Store};

    /// Writes one unit and returns its record and its container's data.
    fn written(store: &Store, id: u64, chunks: &[PackChunk<'_>]) -> (UnitRecord, Vec<u8>) {
        let session = store.begin_session("test").unwrap();
        let mut pack = PackWriter::for_session(store, &session);
        let (container, vbase) = pack.add_unit(id, chunks).unwrap();
        pack.finish().unwrap();
        let u = UnitRecord {
            kind: crate::config::DedupUnit::Segment,
            fp: Fp::of(b"unit"),
            container,
            vbase,
            trimmed: false,
            domain: 0,
            chunks: chunks.iter().map(|c| c.entry.clone()).collect(),
        };
        let data = store
            .open_container(container, false)
            .unwrap()
            .read_all()
            .unwrap();
        (u, data)
    }

    #[test]
    fn a_kept_link_inside_the_unit_takes_the_bytes_of_a_dropped_target() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let store = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        let (a, b) = (vec![7u8; 3000], vec![9u8; 2000]);
        let entry = |d: &[u8]| ChunkEntry::new(0, d.len() as u32, Fp::of(d));
        let mut repeat = entry(&a);
        repeat.flags |= CHUNK_LINK;
        repeat.link = Some((42, 0));
        let chunks = [
            PackChunk {
                data: &a,
                entry: entry(&a),
            },
            PackChunk {
                data: &b,
                entry: entry(&b),
            },
            PackChunk {
                data: &[],
                entry: repeat,
            },
        ];
        let (old, data) = written(&store, 42, &chunks);

        // Keep the second and third chunks only: the third's target goes.
        let session = store.begin_session("test").unwrap();
        let mut pack = PackWriter::for_session(&store, &session);
        let keep = BTreeSet::from([1, 2]);
        let new = repack(42, &old, Some(&keep), &data, &HashMap::new(), &mut pack).unwrap();
        pack.finish().unwrap();
        assert!(new.trimmed);
        assert_ne!(new.chunks[0].flags & CHUNK_ABSENT, 0);
        assert_eq!(new.chunks[2].link_target(), None);
        assert_eq!(new.chunks[2].stored_len(), a.len() as u64);
        let moved = store
            .open_container(new.container, false)
            .unwrap()
            .read_all()
            .unwrap();
        let at = new.chunk_vaddr(2) as usize;
        assert_eq!(&moved[at..at + a.len()], &a[..]);

        // With its target kept, the link stays a link.
        let mut pack = PackWriter::for_session(&store, &session);
        let all = BTreeSet::from([0, 1, 2]);
        let same = repack(42, &old, Some(&all), &data, &HashMap::new(), &mut pack).unwrap();
        pack.finish().unwrap();
        assert_eq!(same.chunks[2].link_target(), Some((42, 0)));
    }
}
