//! Belady's optimal container cache with full look-ahead: evict the container used
//! farthest in the future. The papers' yardstick, and one of `auto`'s two candidates.
use std::collections::{BTreeSet, HashMap};
use std::io::Write;

use crate::error::Result;
use crate::format::container::ContainerId;
use crate::recipe::archival::Loc;
use crate::store::Store;

use super::io::slice;
use super::{next_uses, out_err, write_zeros, CacheStats, Loader};

pub(super) fn run(
    store: &Store,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
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
            ld.read_ahead(locs, i, budget, |c, _| cache.contains_key(&c));
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
