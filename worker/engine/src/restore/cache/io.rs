//! What every cache engine shares: reading a container, the engines' counters, writing
//! out, and each chunk position's next use (for the look-ahead engines).
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::container::{ContainerFile, ContainerId};
use crate::recipe::archival::Loc;
use crate::store::Store;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CacheStats {
    pub reads: u64,
    pub bytes_read: u64,
    pub decoded: u64,
    pub peak: u64,
}

/// Reads and decodes whole containers, counting what it costs.
pub(crate) struct Loader<'s> {
    store: &'s Store,
    files: HashMap<ContainerId, Arc<ContainerFile>>,
    pub(crate) stats: CacheStats,
}

impl<'s> Loader<'s> {
    pub(crate) fn new(store: &'s Store) -> Self {
        Loader {
            store,
            files: HashMap::new(),
            stats: CacheStats::default(),
        }
    }

    pub(super) fn file(&mut self, id: ContainerId, with_units: bool) -> Result<Arc<ContainerFile>> {
        if let Some(f) = self.files.get(&id) {
            if !with_units || !f.footer.units.is_empty() || f.footer.blocks.is_empty() {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(self.store.open_container(id, with_units)?);
        if self.files.len() > 4096 {
            self.files.clear();
        }
        self.files.insert(id, f.clone());
        Ok(f)
    }

    /// Decoded size of a container (what caching it whole costs).
    pub(crate) fn size(&mut self, id: ContainerId) -> Result<u64> {
        Ok(self.file(id, false)?.footer.vbytes)
    }

    /// One container read: the whole data space, decoded.
    pub(crate) fn load(&mut self, id: ContainerId) -> Result<Vec<u8>> {
        let f = self.file(id, false)?;
        let data = f.read_all()?;
        self.stats.reads += 1;
        self.stats.bytes_read += f
            .footer
            .blocks
            .iter()
            .map(|b| u64::from(b.stored_len))
            .sum::<u64>();
        self.stats.decoded += f.footer.vbytes;
        Ok(data)
    }

    /// Reads and decodes the blocks holding `len` bytes at `vaddr`, without
    /// caching anything: (where the returned bytes start, the bytes). Counts
    /// the bytes, not a container read (the caller knows when a run starts).
    pub(crate) fn read_blocks(
        &mut self,
        id: ContainerId,
        vaddr: u64,
        len: u64,
    ) -> Result<(u64, Vec<u8>)> {
        let f = self.file(id, false)?;
        let blocks = &f.footer.blocks[f.footer.blocks_for(vaddr, len)];
        let (Some(first), Some(last)) = (blocks.first(), blocks.last()) else {
            return Err(Error::CorruptContainer {
                container: id.to_string(),
                detail: format!("chunk at {vaddr}+{len} is outside the container"),
            });
        };
        let start = first.vbase;
        let mut data = vec![0u8; (last.vbase + u64::from(last.vlen) - start) as usize];
        f.read_range(start, &mut data)?;
        for b in blocks {
            self.stats.bytes_read += u64::from(b.stored_len);
            self.stats.decoded += u64::from(b.vlen);
        }
        Ok((start, data))
    }
}

pub(crate) fn out_err(e: std::io::Error) -> Error {
    match e.downcast::<Error>() {
        Ok(inner) => inner,
        Err(e) => Error::Io {
            context: "writing restored data".into(),
            source: e,
        },
    }
}

pub(super) fn slice(data: &[u8], vaddr: u64, len: u32, id: ContainerId) -> Result<&[u8]> {
    data.get(vaddr as usize..vaddr as usize + len as usize)
        .ok_or_else(|| Error::CorruptContainer {
            container: id.to_string(),
            detail: format!("chunk at {vaddr}+{len} is outside the container"),
        })
}

pub(crate) fn write_zeros(out: &mut dyn Write, mut n: u64) -> Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k]).map_err(out_err)?;
        n -= k as u64;
    }
    Ok(())
}

/// next[i]: the next position after i using the same container
/// (`usize::MAX` when none does, and for zero chunks).
pub(crate) fn next_uses(locs: &[Loc]) -> Vec<usize> {
    let mut next = vec![usize::MAX; locs.len()];
    let mut last: rustc_hash::FxHashMap<ContainerId, usize> = Default::default();
    for (i, l) in locs.iter().enumerate().rev() {
        if let Loc::Stored { container, .. } = *l {
            if let Some(&n) = last.get(&container) {
                next[i] = n;
            }
            last.insert(container, i);
        }
    }
    next
}

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

pub(super) fn too_small(policy: &str, budget: u64, need: u64) -> Error {
    Error::Invalid(format!(
        "a {policy} restore needs at least {} MiB of cache for this version (one container), got {} MiB",
        need.div_ceil(1 << 20),
        budget >> 20
    ))
}
