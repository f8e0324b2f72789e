//! Least-recently-used caches: of whole decoded containers (`lru-container`), or of the
//! chunks of every container read (`lru-chunk`).
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::Write;

use crate::error::Result;
use crate::format::container::ContainerId;
use crate::recipe::archival::Loc;
use crate::store::Store;

use super::io::{slice, too_small};
use super::{out_err, write_zeros, CacheStats, Loader};

/// `lru-container`: whole decoded containers, least recently used out.
pub(super) fn container(
    store: &Store,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    let mut cache: HashMap<ContainerId, Vec<u8>> = HashMap::new();
    let mut order: VecDeque<ContainerId> = VecDeque::new();
    let mut held = 0u64;
    for (i, l) in locs.iter().enumerate() {
        match *l {
            Loc::Zero { len } => write_zeros(out, u64::from(len))?,
            Loc::Stored {
                container,
                vaddr,
                len,
            } => {
                if !cache.contains_key(&container) {
                    ld.read_ahead(locs, i, budget, |c, _| cache.contains_key(&c));
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

/// `lru-chunk`: the chunks of every container read, least recently used out.
pub(super) fn chunk(
    store: &Store,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    // (container, vaddr) → chunk bytes; recency by a counter.
    let mut cache: HashMap<(ContainerId, u64), (Vec<u8>, u64)> = HashMap::new();
    let mut recency: BTreeSet<(u64, ContainerId, u64)> = BTreeSet::new();
    let mut held = 0u64;
    let mut clock = 0u64;
    for (i, l) in locs.iter().enumerate() {
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
        ld.read_ahead(locs, i, budget, |c, v| cache.contains_key(&(c, v)));
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
