//! The forward assembly area (FAA, Lillibridge et al.; the restore side of Cao et al.'s
//! LBW paper): the version is restored window by window; each window's chunks are read
//! container by container, in parallel, into their places in one buffer, which is then
//! written out in order. Also the container reads every cache engine shares.

use crate::restore::MetaRead;
use crate::restore::RestoreOptions;
use crate::restore::RestoreReport;
use crate::restore::MIB;
use crate::store::ReadView;
use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::format::container::{decode_block, BlockInfo, ContainerFile, ContainerId};
use crate::recipe::{Extent, Extents};
use crate::store::Store;

/// Open containers shared by the restore threads.
#[derive(Default)]
pub(crate) struct ContainerCache {
    map: Mutex<HashMap<ContainerId, Arc<ContainerFile>>>,
}

impl ContainerCache {
    pub fn get(&self, store: &Store, id: ContainerId) -> Result<Arc<ContainerFile>> {
        if let Some(c) = self.map.lock().get(&id) {
            return Ok(c.clone());
        }
        let c = Arc::new(store.open_container(id, false)?);
        let mut m = self.map.lock();
        if m.len() >= 1024 {
            m.clear();
        }
        m.insert(id, c.clone());
        Ok(c)
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub bytes_read: AtomicU64,
    pub decoded: AtomicU64,
}

/// A piece of the FAA to fill from a container: (destination, data-space address).
pub(crate) type Piece<'a> = (&'a mut [u8], u64);

/// The blocks of `cf` holding `[vaddr, vaddr+len)`; an error naming the
/// container when the range lies outside its data.
pub(crate) fn blocks_of(cf: &ContainerFile, vaddr: u64, len: u64) -> Result<Range<usize>> {
    let blocks = &cf.footer.blocks;
    let r = cf.footer.blocks_for(vaddr, len);
    if r.is_empty()
        || r.end > blocks.len()
        || blocks[r.end - 1].vbase + u64::from(blocks[r.end - 1].vlen) < vaddr + len
    {
        return Err(Error::CorruptContainer {
            container: cf.id.to_string(),
            detail: format!("data range {vaddr}+{len} is outside the container"),
        });
    }
    Ok(r)
}

/// Fills the pieces from one container with a single read.
fn fill_from_container(cf: &ContainerFile, pieces: Vec<Piece<'_>>, c: &Counters) -> Result<()> {
    let mut lo = usize::MAX;
    let mut hi = 0;
    for (dst, vaddr) in &pieces {
        let r = blocks_of(cf, *vaddr, dst.len() as u64)?;
        lo = lo.min(r.start);
        hi = hi.max(r.end);
    }
    let mut stored = Vec::new();
    let n = cf.read_blocks(lo..hi, &mut stored)?;
    c.reads.fetch_add(1, Ordering::Relaxed);
    c.bytes_read.fetch_add(n, Ordering::Relaxed);
    let base = cf.footer.blocks[lo].offset;
    let blocks: Vec<(&BlockInfo, &[u8])> = cf.footer.blocks[lo..hi]
        .iter()
        .map(|b| {
            let s = (b.offset - base) as usize;
            (b, &stored[s..s + b.stored_len as usize])
        })
        .collect();
    fill_pieces(cf.id, &blocks, pieces, &c.decoded)
}

/// Decodes (checksum first) the blocks the pieces overlap and copies each
/// piece out of them. `blocks` are (block, its stored bytes) in data-space
/// order; blocks no piece overlaps are skipped. A piece not wholly covered
/// by the blocks is an error naming the container, never a hole.
pub(crate) fn fill_pieces(
    id: ContainerId,
    blocks: &[(&BlockInfo, &[u8])],
    mut pieces: Vec<Piece<'_>>,
    decoded: &AtomicU64,
) -> Result<()> {
    pieces.sort_unstable_by_key(|p| p.1);
    let want: u64 = pieces.iter().map(|p| p.0.len() as u64).sum();
    let mut copied = 0u64;
    let mut plain = Vec::new();
    let mut first_piece = 0;
    for &(b, stored) in blocks {
        let bend = b.vbase + u64::from(b.vlen);
        // Skip pieces that end before this block.
        while first_piece < pieces.len()
            && pieces[first_piece].1 + pieces[first_piece].0.len() as u64 <= b.vbase
        {
            first_piece += 1;
        }
        let needed = pieces[first_piece..]
            .iter()
            .take_while(|p| p.1 < bend)
            .any(|p| p.1 + p.0.len() as u64 > b.vbase);
        if !needed {
            continue;
        }
        plain.resize(b.vlen as usize, 0);
        decode_block(id, b, stored, &mut plain)?;
        decoded.fetch_add(u64::from(b.vlen), Ordering::Relaxed);
        for (dst, vaddr) in pieces[first_piece..].iter_mut() {
            if *vaddr >= bend {
                break;
            }
            let pend = *vaddr + dst.len() as u64;
            if pend <= b.vbase {
                continue;
            }
            let from = (*vaddr).max(b.vbase);
            let to = pend.min(bend);
            dst[(from - *vaddr) as usize..(to - *vaddr) as usize]
                .copy_from_slice(&plain[(from - b.vbase) as usize..(to - b.vbase) as usize]);
            copied += to - from;
        }
    }
    if copied != want {
        return Err(Error::CorruptContainer {
            container: id.to_string(),
            detail: format!(
                "{} of {want} bytes asked of it are not in its blocks",
                want - copied
            ),
        });
    }
    Ok(())
}

/// Asks the kernel to start reading what a window will need.
pub(crate) fn prefetch(store: &Store, cache: &ContainerCache, window: &[Extent]) {
    let mut spans: HashMap<ContainerId, (u64, u64)> = HashMap::new();
    for e in window {
        if let Extent::Stored {
            container,
            vaddr,
            len,
        } = *e
        {
            let s = spans.entry(container).or_insert((u64::MAX, 0));
            s.0 = s.0.min(vaddr);
            s.1 = s.1.max(vaddr + len);
        }
    }
    for (id, (lo, hi)) in spans {
        if let Ok(cf) = cache.get(store, id) {
            cf.prefetch(lo, hi - lo);
        }
    }
}

/// Pulls the next window (at most `cap` bytes) of extents, splitting the last.
pub(crate) fn take_window(
    r: &impl MetaRead,
    ex: &mut Extents,
    carry: &mut Option<Extent>,
    cap: u64,
) -> Result<Vec<Extent>> {
    let mut w = Vec::new();
    let mut used = 0u64;
    while used < cap {
        let e = match carry.take() {
            Some(e) => e,
            None => match ex.next(r)? {
                Some(e) => e,
                None => break,
            },
        };
        let room = cap - used;
        if e.len() <= room {
            used += e.len();
            w.push(e);
        } else {
            let (a, b) = match e {
                Extent::Zero { len } => {
                    (Extent::Zero { len: room }, Extent::Zero { len: len - room })
                }
                Extent::Stored {
                    container,
                    vaddr,
                    len,
                } => (
                    Extent::Stored {
                        container,
                        vaddr,
                        len: room,
                    },
                    Extent::Stored {
                        container,
                        vaddr: vaddr + room,
                        len: len - room,
                    },
                ),
            };
            used += room;
            w.push(a);
            *carry = Some(b);
        }
    }
    Ok(w)
}

/// Streams a version's bytes through the FAA into `out`.
pub(crate) fn run_faa(
    view: &ReadView<'_>,
    mut ex: Extents,
    opts: &RestoreOptions,
    out: &mut dyn Write,
    rep: &mut RestoreReport,
) -> Result<()> {
    let store = view.store();
    let cap = opts.cache_bytes.max(MIB);
    let cache = ContainerCache::default();
    let counters = Counters::default();
    let mut carry = None;
    let mut faa: Vec<u8> = Vec::new();
    let mut next = take_window(view, &mut ex, &mut carry, cap)?;
    // The first window too: for containers read back from a bucket, every range of a window is
    // requested at once instead of two at a time by the threads that assemble it.
    prefetch(store, &cache, &next);
    let mut written = 0u64;
    while !next.is_empty() {
        let window = std::mem::take(&mut next);
        next = take_window(view, &mut ex, &mut carry, cap)?;
        prefetch(store, &cache, &next);
        if let Some(c) = &opts.cancel {
            if c.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
        }
        let total: u64 = window.iter().map(|e| e.len()).sum();
        if faa.len() < total as usize {
            faa.resize(total as usize, 0);
        }
        let area = &mut faa[..total as usize];
        // Cut the area into one slice per extent and group them by container.
        let mut groups: HashMap<ContainerId, Vec<Piece<'_>>> = HashMap::new();
        let mut rest: &mut [u8] = area;
        for e in &window {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(e.len() as usize);
            rest = tail;
            match *e {
                Extent::Zero { .. } => head.fill(0),
                Extent::Stored {
                    container, vaddr, ..
                } => groups.entry(container).or_default().push((head, vaddr)),
            }
        }
        groups.into_par_iter().try_for_each(|(id, pieces)| {
            fill_from_container(cache.get(store, id)?.as_ref(), pieces, &counters)
        })?;
        out.write_all(&faa[..total as usize])
            .map_err(|e| match e.downcast::<Error>() {
                Ok(inner) => inner,
                Err(e) => Error::Io {
                    context: "writing restored data".into(),
                    source: e,
                },
            })?;
        written += total;
    }
    debug_assert_eq!(written, rep.logical_bytes);
    rep.peak_cache_bytes = faa.len() as u64;
    rep.container_reads = counters.reads.load(Ordering::Relaxed);
    rep.bytes_read = counters.bytes_read.load(Ordering::Relaxed);
    rep.bytes_decoded = counters.decoded.load(Ordering::Relaxed);
    Ok(())
}
