//! Restore caches other than the forward assembly area (see `restore.rs`).
//! All of them read real containers and decode real blocks; they differ in
//! what they keep in memory between container reads, under one budget.
//!
//! - `lru-container`: whole decoded containers, least recently used out;
//! - `lru-chunk`: the chunks of every container read, least recently used out
//!   (one container's decode buffer is held while it is read);
//! - `dasm`: Tan et al.'s Dynamic Adaptive Forward Assembly Area: an
//!   assembly area and a container cache share the budget, re-split every
//!   round from the recipe ahead (see `dasm.rs`, which also says where we
//!   depart from the paper and why);
//! - `opt`: Belady's optimal container cache with full look-ahead (evict the
//!   container used farthest in the future): the papers' yardstick;
//! - `auto` (the default): counts, on the recipe and before reading anything,
//!   the container reads `faa` and `opt` would make and runs the cheaper one.
//!   Neither wins everywhere: `opt` reads 33% fewer containers than `faa` on
//!   the kube series' latest version, `faa` 5× fewer than `opt` on a synthetic
//!   series whose chunks are scattered over every version's containers
//!   (docs/benchmarks.md).
//!
//! Every engine reports the most memory it held (`peak_bytes`), which never
//! exceeds its budget.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::container::{ContainerFile, ContainerId};
use crate::recipe::archival::Loc;
use crate::store::Store;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Forward assembly area (parallel container reads per window).
    Faa,
    LruContainer,
    LruChunk,
    Dasm,
    /// Belady: a restore knows its whole recipe before it reads anything, so
    /// the optimal eviction is not hypothetical here.
    Opt,
    /// The default: `faa` or `opt`, whichever the recipe says reads fewer
    /// containers (see [`choose`]).
    #[default]
    Auto,
}

impl CachePolicy {
    /// The cache engines (what the benchmarks compare); `auto` runs one of them.
    pub const ALL: [CachePolicy; 5] = [
        CachePolicy::LruContainer,
        CachePolicy::LruChunk,
        CachePolicy::Faa,
        CachePolicy::Dasm,
        CachePolicy::Opt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Faa => "faa",
            CachePolicy::LruContainer => "lru-container",
            CachePolicy::LruChunk => "lru-chunk",
            CachePolicy::Dasm => "dasm",
            CachePolicy::Opt => "opt",
            CachePolicy::Auto => "auto",
        }
    }
}

impl std::fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CachePolicy::ALL
            .into_iter()
            .chain([CachePolicy::Auto])
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "cache {s:?}: expected auto, faa, lru-container, lru-chunk, dasm or opt"
                ))
            })
    }
}

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

    fn file(&mut self, id: ContainerId, with_units: bool) -> Result<Arc<ContainerFile>> {
        if let Some(f) = self.files.get(&id) {
            if !with_units || !f.footer.units.is_empty() || f.footer.blocks.is_empty() {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(ContainerFile::open(self.store.data_dir(), id, with_units)?);
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

fn slice(data: &[u8], vaddr: u64, len: u32, id: ContainerId) -> Result<&[u8]> {
    data.get(vaddr as usize..vaddr as usize + len as usize)
        .ok_or_else(|| Error::CorruptContainer {
            container: id.to_string(),
            detail: format!("chunk at {vaddr}+{len} is outside the container"),
        })
}

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

pub(crate) fn write_zeros(out: &mut dyn Write, mut n: u64) -> Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k]).map_err(out_err)?;
        n -= k as u64;
    }
    Ok(())
}

pub(crate) fn run(
    store: &Store,
    policy: CachePolicy,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    match policy {
        CachePolicy::LruContainer => lru_container(store, locs, budget, out),
        CachePolicy::LruChunk => lru_chunk(store, locs, budget, out),
        CachePolicy::Dasm => crate::dasm::run(store, locs, budget, out),
        CachePolicy::Opt => opt(store, locs, budget, out),
        CachePolicy::Faa | CachePolicy::Auto => Err(Error::Invalid(format!(
            "the {policy} cache is run by restore.rs"
        ))),
    }
}

fn too_small(policy: &str, budget: u64, need: u64) -> Error {
    Error::Invalid(format!(
        "a {policy} restore needs at least {} MiB of cache for this version (one container), got {} MiB",
        need.div_ceil(1 << 20),
        budget >> 20
    ))
}

fn lru_container(
    store: &Store,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    let mut cache: HashMap<ContainerId, Vec<u8>> = HashMap::new();
    let mut order: VecDeque<ContainerId> = VecDeque::new();
    let mut held = 0u64;
    for l in locs {
        match *l {
            Loc::Zero { len } => write_zeros(out, u64::from(len))?,
            Loc::Stored {
                container,
                vaddr,
                len,
            } => {
                if !cache.contains_key(&container) {
                    let need = ld.size(container)?;
                    if need > budget {
                        return Err(too_small("lru-container", budget, need));
                    }
                    while held + need > budget {
                        let victim = order.pop_front().expect("something to evict");
                        held -= cache.remove(&victim).map(|d| d.len() as u64).unwrap_or(0);
                    }
                    let data = ld.load(container)?;
                    held += data.len() as u64;
                    ld.stats.peak = ld.stats.peak.max(held);
                    cache.insert(container, data);
                } else if let Some(p) = order.iter().position(|c| *c == container) {
                    order.remove(p);
                }
                order.push_back(container);
                out.write_all(slice(&cache[&container], vaddr, len, container)?)
                    .map_err(out_err)?;
            }
        }
    }
    Ok(ld.stats)
}

fn lru_chunk(store: &Store, locs: &[Loc], budget: u64, out: &mut dyn Write) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    // (container, vaddr) → chunk bytes; recency by a counter.
    let mut cache: HashMap<(ContainerId, u64), (Vec<u8>, u64)> = HashMap::new();
    let mut recency: BTreeSet<(u64, ContainerId, u64)> = BTreeSet::new();
    let mut held = 0u64;
    let mut clock = 0u64;
    for l in locs {
        let Loc::Stored {
            container,
            vaddr,
            len,
        } = *l
        else {
            if let Loc::Zero { len } = *l {
                write_zeros(out, u64::from(len))?;
            }
            continue;
        };
        clock += 1;
        if let Some((data, t)) = cache.get_mut(&(container, vaddr)) {
            recency.remove(&(*t, container, vaddr));
            *t = clock;
            recency.insert((clock, container, vaddr));
            out.write_all(&data[..len as usize]).map_err(out_err)?;
            continue;
        }
        // Miss: read the container; its decode buffer is held meanwhile.
        let need = ld.size(container)?;
        if need > budget {
            return Err(too_small("lru-chunk", budget, need));
        }
        while held + need > budget {
            let (_, c, v) = recency.pop_first().expect("something to evict");
            held -= cache
                .remove(&(c, v))
                .map(|(d, _)| d.len() as u64)
                .unwrap_or(0);
        }
        let data = ld.load(container)?;
        ld.stats.peak = ld.stats.peak.max(held + data.len() as u64);
        out.write_all(slice(&data, vaddr, len, container)?)
            .map_err(out_err)?;
        // Cache every chunk of the container (chunk boundaries from its footer).
        let f = ld.file(container, true)?;
        let mut chunks = Vec::new();
        for u in &f.footer.units {
            let mut off = u.vbase;
            for c in &u.chunks {
                let n = c.stored_len();
                if n > 0 {
                    chunks.push((off, n as usize));
                }
                off += n;
            }
        }
        for (off, n) in chunks {
            if cache.contains_key(&(container, off)) || off as usize + n > data.len() {
                continue;
            }
            clock += 1;
            // Keep the decode buffer's worth free for the next miss.
            while held + n as u64 + need > budget {
                let Some((_, c, v)) = recency.pop_first() else {
                    break;
                };
                held -= cache
                    .remove(&(c, v))
                    .map(|(d, _)| d.len() as u64)
                    .unwrap_or(0);
            }
            if held + n as u64 + need > budget {
                break;
            }
            cache.insert(
                (container, off),
                (data[off as usize..off as usize + n].to_vec(), clock),
            );
            recency.insert((clock, container, off));
            held += n as u64;
        }
        ld.stats.peak = ld.stats.peak.max(held + data.len() as u64);
    }
    Ok(ld.stats)
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

fn opt(store: &Store, locs: &[Loc], budget: u64, out: &mut dyn Write) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    let next = next_uses(locs);
    let mut cache: HashMap<ContainerId, (Vec<u8>, usize)> = HashMap::new();
    let mut by_next: BTreeSet<(usize, ContainerId)> = BTreeSet::new();
    let mut held = 0u64;
    // Blocks of a container too large to cache, read for the chunks of the
    // current run (see below).
    let mut direct: Option<(ContainerId, u64, Vec<u8>)> = None;
    for (i, l) in locs.iter().enumerate() {
        let Loc::Stored {
            container,
            vaddr,
            len,
        } = *l
        else {
            // Zeros do not end a run: the chunks after them are often in
            // the blocks already read.
            if let Loc::Zero { len } = *l {
                write_zeros(out, u64::from(len))?;
            }
            continue;
        };
        if let Some((_, nu)) = cache.get(&container) {
            by_next.remove(&(*nu, container));
        } else {
            let need = ld.size(container)?;
            if need > budget {
                // Larger than the whole budget (the default restore must
                // work for any container size): serve its chunks from their
                // blocks; a run of chunks from it is one container read.
                let run = direct.as_ref().is_some_and(|d| d.0 == container);
                let held_here = direct.as_ref().and_then(|(c, start, d)| {
                    let off = vaddr.checked_sub(*start)? as usize;
                    (*c == container && off + len as usize <= d.len()).then_some(off)
                });
                let off = match held_here {
                    Some(off) => off,
                    None => {
                        direct.take(); // free the old blocks first
                        let (start, data) = ld.read_blocks(container, vaddr, u64::from(len))?;
                        while held + data.len() as u64 > budget {
                            let Some((_, victim)) = by_next.pop_last() else {
                                break;
                            };
                            held -= cache
                                .remove(&victim)
                                .map(|(d, _)| d.len() as u64)
                                .unwrap_or(0);
                        }
                        if !run {
                            ld.stats.reads += 1;
                        }
                        ld.stats.peak = ld.stats.peak.max(held + data.len() as u64);
                        direct = Some((container, start, data));
                        (vaddr - start) as usize
                    }
                };
                let d = &direct.as_ref().expect("just read").2;
                out.write_all(&d[off..off + len as usize])
                    .map_err(out_err)?;
                continue;
            }
            direct.take(); // free its blocks before loading
            while held + need > budget {
                // Belady: evict the container needed farthest in the future.
                let (_, victim) = by_next.pop_last().expect("something to evict");
                held -= cache
                    .remove(&victim)
                    .map(|(d, _)| d.len() as u64)
                    .unwrap_or(0);
            }
            let d = ld.load(container)?;
            held += d.len() as u64;
            ld.stats.peak = ld.stats.peak.max(held);
            cache.insert(container, (d, usize::MAX));
        }
        direct = None;
        out.write_all(slice(&cache[&container].0, vaddr, len, container)?)
            .map_err(out_err)?;
        let e = cache.get_mut(&container).expect("cached");
        e.1 = next[i];
        if next[i] == usize::MAX {
            // Never used again: free it now.
            held -= e.0.len() as u64;
            cache.remove(&container);
        } else {
            by_next.insert((next[i], container));
        }
    }
    Ok(ld.stats)
}

/// What `auto` runs: `faa` or `opt`, whichever reads fewer containers for
/// these positions under `budget`, and that count. Both are counted on the
/// recipe alone (no I/O), `opt` as if every container were `container_bytes`
/// (the store's largest; repacked ones are smaller, so its count errs high).
/// Ties go to `faa`, which reads only the blocks a window needs.
pub(crate) fn choose(locs: &[Loc], budget: u64, container_bytes: u64) -> (CachePolicy, u64) {
    let (faa, opt) = (
        faa_reads(locs, budget),
        opt_reads(locs, budget, container_bytes),
    );
    if faa <= opt {
        (CachePolicy::Faa, faa)
    } else {
        (CachePolicy::Opt, opt)
    }
}

/// Container reads of the forward assembly area: the distinct containers of
/// each `budget`-byte window of output.
fn faa_reads(locs: &[Loc], budget: u64) -> u64 {
    let window = budget.max(1 << 20);
    let mut reads = 0u64;
    let mut seen: rustc_hash::FxHashSet<ContainerId> = Default::default();
    let mut room = window;
    for l in locs {
        let (mut len, c) = match *l {
            Loc::Zero { len } => (u64::from(len), None),
            Loc::Stored { container, len, .. } => (u64::from(len), Some(container)),
        };
        // A piece that crosses a window boundary is read in both windows.
        while len > 0 {
            if let Some(c) = c {
                if seen.insert(c) {
                    reads += 1;
                }
            }
            let n = len.min(room);
            len -= n;
            room -= n;
            if room == 0 {
                seen.clear();
                room = window;
            }
        }
    }
    reads
}

/// Container reads of Belady's container cache holding `budget /
/// container_bytes` containers (a run of chunks from one container when
/// none fits).
fn opt_reads(locs: &[Loc], budget: u64, container_bytes: u64) -> u64 {
    let slots = (budget / container_bytes.max(1)) as usize;
    let stored = locs.iter().enumerate().filter_map(|(i, l)| match *l {
        Loc::Stored { container, .. } => Some((i, container)),
        Loc::Zero { .. } => None,
    });
    if slots == 0 {
        // One read per run of chunks from the same container.
        let mut prev = None;
        return stored.filter(|&(_, c)| prev.replace(c) != Some(c)).count() as u64;
    }
    let next = next_uses(locs);
    let mut cached: rustc_hash::FxHashMap<ContainerId, usize> = Default::default();
    let mut by_next: BTreeSet<(usize, ContainerId)> = BTreeSet::new();
    let mut reads = 0u64;
    // Within a run of chunks from one container nothing else touches the
    // cache: the run's last position stands for it (its next use is the
    // run's), which keeps `auto`'s counting cheap.
    let mut stored = stored.peekable();
    while let Some((i, c)) = stored.next() {
        if stored.peek().is_some_and(|&(_, n)| n == c) {
            continue;
        }
        match cached.get(&c) {
            Some(&nu) => {
                by_next.remove(&(nu, c));
            }
            None => {
                reads += 1;
                if cached.len() == slots {
                    let (_, victim) = by_next.pop_last().expect("a full cache has entries");
                    cached.remove(&victim);
                }
            }
        }
        cached.insert(c, next[i]);
        by_next.insert((next[i], c));
    }
    reads
}
