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

/// How many containers the read-ahead keeps asked for, and at most how many stored bytes
/// they may hold: enough that the round trips of a bucket's GETs overlap each other and the
/// decoding (a restore read from the bucket alone waited on one GET at a time), little
/// enough to be noise beside the cache.
pub(super) const READ_AHEAD: usize = 8;
pub(super) const READ_AHEAD_BYTES: u64 = 64 << 20;
/// How many positions past the current one the read-ahead looks for containers, and how
/// far the restore moves on before it looks again.
const READ_AHEAD_SCAN: usize = 1 << 16;
const READ_AHEAD_RESCAN: usize = 64;

/// Reads and decodes whole containers, counting what it costs.
pub(crate) struct Loader<'s> {
    store: &'s Store,
    files: HashMap<ContainerId, Arc<ContainerFile>>,
    /// Containers asked for ahead and not loaded yet, with the stored bytes asked.
    ahead: Vec<(ContainerId, u64)>,
    /// The position from which the read-ahead looks again.
    next_scan: usize,
    pub(crate) stats: CacheStats,
}

impl Drop for Loader<'_> {
    /// A restore that ends (done, failed or cancelled) withdraws what it asked for and did
    /// not read, so the tier holds no fetched container for nobody.
    fn drop(&mut self) {
        self.store
            .cancel_cold_prefetch(self.ahead.drain(..).map(|(c, _)| c));
    }
}

impl<'s> Loader<'s> {
    pub(crate) fn new(store: &'s Store) -> Self {
        Loader {
            store,
            files: HashMap::new(),
            ahead: Vec::new(),
            next_scan: 0,
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

    /// Asks for the whole containers the next loads will read, in the order `locs` uses them
    /// from position `from` on: those not `cached` (given a chunk's container and address),
    /// at most [`READ_AHEAD`] of them, and none (that is open) larger than `budget` (an
    /// engine reads those block by block). A bucket then fetches
    /// them in parallel in the background, a local disk starts reading them. Only a hint:
    /// a container that cannot be opened now is left for its load to report.
    pub(crate) fn read_ahead(
        &mut self,
        locs: &[Loc],
        from: usize,
        budget: u64,
        cached: impl Fn(ContainerId, u64) -> bool,
    ) {
        // Called for every chunk of a container read block by block: look again only
        // once the restore has moved on, or half of what was asked for has been read.
        if from < self.next_scan && self.ahead.len() >= READ_AHEAD / 2 {
            return;
        }
        self.next_scan = from + READ_AHEAD_RESCAN;
        let before = std::mem::take(&mut self.ahead);
        let mut bytes = 0u64;
        for l in locs.iter().skip(from).take(READ_AHEAD_SCAN) {
            if self.ahead.len() >= READ_AHEAD || bytes >= READ_AHEAD_BYTES {
                break;
            }
            let Loc::Stored {
                container, vaddr, ..
            } = *l
            else {
                continue;
            };
            if cached(container, vaddr) || self.ahead.iter().any(|(c, _)| *c == container) {
                continue;
            }
            // Asked for already (and still to come): kept, not asked again.
            if let Some(&(_, n)) = before.iter().find(|(c, _)| *c == container) {
                self.ahead.push((container, n));
                bytes += n;
                continue;
            }
            // Not open yet and not on local disk: the tier fetches it whole, so that
            // opening it costs no round trip of its own either.
            if !self.files.contains_key(&container) && !self.store.is_local(container) {
                if let Some(n) = self.store.prefetch_cold(container, budget) {
                    self.ahead.push((container, n));
                    bytes += n;
                }
                continue;
            }
            let Ok(f) = self.file(container, false) else {
                continue;
            };
            if f.footer.vbytes > budget {
                continue;
            }
            let n = f.prefetch(0, f.footer.vbytes);
            self.ahead.push((container, n));
            bytes += n;
        }
        // What was asked for and is no longer to come is withdrawn.
        let gone = before
            .into_iter()
            .map(|(c, _)| c)
            .filter(|c| !self.ahead.iter().any(|(a, _)| a == c));
        self.store.cancel_cold_prefetch(gone.collect::<Vec<_>>());
    }

    /// Asks for data-space bytes `[vaddr, vaddr+len)` of a container ahead of reading them
    /// (see [`ContainerFile::prefetch`]) and returns the stored bytes asked for; a container
    /// that cannot be opened now is left for its read to report.
    pub(crate) fn prefetch(&mut self, id: ContainerId, vaddr: u64, len: u64) -> u64 {
        self.file(id, false)
            .map(|f| f.prefetch(vaddr, len))
            .unwrap_or(0)
    }

    /// Decoded size of a container (what caching it whole costs).
    pub(crate) fn size(&mut self, id: ContainerId) -> Result<u64> {
        Ok(self.file(id, false)?.footer.vbytes)
    }

    /// One container read: the whole data space, decoded.
    pub(crate) fn load(&mut self, id: ContainerId) -> Result<Vec<u8>> {
        let f = self.file(id, false)?;
        self.ahead.retain(|(c, _)| *c != id);
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
