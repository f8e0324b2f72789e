//! `auto`: counts, on the recipe and before reading anything, the container reads `faa`
//! and `opt` would make, and picks the cheaper.
use std::collections::BTreeSet;

use crate::format::container::ContainerId;
use crate::recipe::archival::Loc;

use super::{next_uses, CachePolicy};

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
