//! DASM (Tan et al., "DASM: A Dynamic Adaptive Forward Assembly Area Method
//! to Accelerate Restore Speed for Deduplication-Based Backup Systems"): a
//! forward assembly area (ASM) and a container cache (CC) share one memory
//! budget, and the split is decided again every round from the recipe ahead.
//!
//! What we keep from the paper: rounds of ASM restoration (the area is
//! filled container by container and written out); a container cache beside
//! the area, |ASM| + |CC| ≤ budget; *Dynamic Orthotics*, which resizes both
//! every round from the fragmentation of the positions ahead (a
//! first-backup-like stretch gets a one-window area and no cache, a
//! stretch that keeps returning to the same containers gets a small area and
//! a large cache); and look-ahead eviction (a container stays cached only if
//! it is needed again soon).
//!
//! Where we differ, and why. In the paper every container of a round is
//! resident at once (|ASM| + Cₙ·CS ≤ budget). On a fragmented version that
//! makes a round as small as the few containers that fit, so DASM re-reads
//! far more than plain ASM, which needs only one container at a time (on our
//! synthetic series, 8 times more at 32 MiB). Here a container that the cache
//! will not keep passes through one read buffer, as in ASM, and is not
//! counted in the budget, exactly as the `faa` engine does not count its
//! read buffers. Only containers kept for later rounds use budget. With no
//! cache this is ASM with the whole budget as its area, the `faa` engine's
//! windows (which also hold zero runs; here zeros are written directly).
//!
//! Dynamic Orthotics here: the cache reserve is a whole number of the
//! largest containers (up to 8 choices spread from none to the most that
//! leaves 1 MiB of area). At the start and then once every half budget of
//! bytes, the planner simulates, for every reserve, the rounds covering the
//! next two budgets' worth of bytes (reads counted on the recipe, no I/O)
//! and picks the reserve with the fewest reads per byte; ties go to the
//! larger area (a receding horizon). A horizon cannot see every long-range reuse,
//! so the plan is compared, on the whole recipe, with keeping each reserve
//! throughout, and the fewest reads win: DASM never reads more containers
//! than an assembly area of the whole budget. Within a reserve the cache keeps the containers whose next
//! use comes soonest (Belady's rule, the paper's "near-optimal" policy
//! extended past the next round), and never one that is not used again.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use super::io::{READ_AHEAD, READ_AHEAD_BYTES};
use super::{out_err, write_zeros, CacheStats, Loader};
use crate::config::MIB;
use crate::error::{Error, Result};
use crate::format::container::ContainerId;
use crate::recipe::archival::Loc;
use crate::store::Store;

/// Smallest assembly area a cache reserve may leave.
const MIN_AREA: u64 = MIB;
/// Most cache reserves Dynamic Orthotics compares.
const RESERVES: u64 = 8;

/// A place in the restore: byte `.1` of position `.0`. Rounds end exactly
/// when their area is full, splitting a chunk between two rounds if need be,
/// as the `faa` engine's windows do.
type Cursor = (usize, u32);

/// One round of the plan: assemble the bytes from `start` to `end`.
#[derive(Debug)]
struct Round {
    start: Cursor,
    end: Cursor,
    /// Cached containers kept into this round (the rest are dropped first).
    cache_in: HashSet<ContainerId>,
    /// Containers cached when the round ends.
    cache_out: HashSet<ContainerId>,
    /// Bytes of area this round uses (its stored bytes).
    area: u64,
    /// Containers this round reads.
    reads: u64,
}

/// What a round's simulation yields.
struct Step {
    end: Cursor,
    reads: u64,
    bytes: u64,
    cache_in: Vec<(ContainerId, usize)>,
    cache_out: Vec<(ContainerId, usize)>,
}

/// Plans rounds on the recipe alone: positions, next uses and container sizes.
struct Planner<'a> {
    locs: &'a [Loc],
    /// next[i]: the next position after i using the same container.
    next: Vec<usize>,
    sizes: HashMap<ContainerId, u64>,
    budget: u64,
    /// Cache reserves to choose from: 0, 1, 2, … largest containers.
    reserves: Vec<u64>,
}

impl<'a> Planner<'a> {
    fn new(locs: &'a [Loc], sizes: HashMap<ContainerId, u64>, budget: u64) -> Self {
        let largest = sizes.values().copied().max().unwrap_or(0).max(1);
        // Up to RESERVES whole-container reserves, spread evenly from none
        // to the most that leaves MIN_AREA (the planning cost grows with
        // their number; 32 MiB of memory with 4 MiB containers has 8).
        let most = budget.saturating_sub(MIN_AREA) / largest;
        let steps = most.min(RESERVES - 1);
        let mut reserves: Vec<u64> = (0..=steps)
            .map(|i| (i * most).checked_div(steps).unwrap_or(0) * largest)
            .collect();
        reserves.dedup();
        Planner {
            locs,
            next: super::next_uses(locs),
            sizes,
            budget,
            reserves,
        }
    }

    fn size(&self, c: ContainerId) -> u64 {
        self.sizes.get(&c).copied().unwrap_or(0)
    }

    /// The containers, soonest next use first, that fit in `reserve` bytes
    /// (never one that is not used again).
    fn fill(
        &self,
        mut cands: Vec<(ContainerId, usize)>,
        reserve: u64,
    ) -> Vec<(ContainerId, usize)> {
        cands.sort_unstable_by_key(|&(c, n)| (n, c));
        let mut held = 0;
        let mut kept = Vec::new();
        for (c, n) in cands {
            if n == usize::MAX {
                break;
            }
            let s = self.size(c);
            if held + s <= reserve {
                held += s;
                kept.push((c, n));
            }
        }
        kept
    }

    /// One round from `start` with the cache `cache` (container, next use)
    /// and `reserve` bytes of it.
    fn step(&self, start: Cursor, cache: &[(ContainerId, usize)], reserve: u64) -> Step {
        let cache_in = self.fill(cache.to_vec(), reserve);
        let area = self.budget - reserve;
        let (mut j, mut end_off) = (start.0, 0u32);
        let mut bytes = 0u64;
        // The next use after this round of each container in it.
        let mut next: HashMap<ContainerId, usize> = HashMap::new();
        while j < self.locs.len() {
            if let Loc::Stored { container, len, .. } = self.locs[j] {
                let from = if j == start.0 { start.1 } else { 0 };
                let rest = u64::from(len - from);
                if bytes + rest > area {
                    // Fill the area with the head of this chunk; the rest
                    // is the next round's first need of the container.
                    let part = area - bytes;
                    if part > 0 {
                        bytes += part;
                        end_off = from + part as u32;
                        next.insert(container, j);
                    }
                    break;
                }
                bytes += rest;
                next.insert(container, self.next[j]);
            }
            j += 1;
        }
        let cached: HashSet<ContainerId> = cache_in.iter().map(|&(c, _)| c).collect();
        let reads = next.keys().filter(|c| !cached.contains(c)).count() as u64;
        let mut cands: Vec<(ContainerId, usize)> = next.iter().map(|(&c, &n)| (c, n)).collect();
        cands.extend(cache_in.iter().filter(|(c, _)| !next.contains_key(c)));
        Step {
            end: (j, end_off),
            reads,
            bytes,
            cache_out: self.fill(cands, reserve),
            cache_in,
        }
    }

    /// Reads per byte over the next two budgets' worth of bytes if every
    /// round kept `reserve` bytes of cache.
    fn cost(&self, start: Cursor, cache: &[(ContainerId, usize)], reserve: u64) -> f64 {
        let horizon = 2 * self.budget;
        let (mut pos, mut reads, mut bytes) = (start, 0u64, 0u64);
        let mut cache = cache.to_vec();
        while pos.0 < self.locs.len() && bytes < horizon {
            let s = self.step(pos, &cache, reserve);
            pos = s.end;
            reads += s.reads;
            bytes += s.bytes;
            cache = s.cache_out;
        }
        if bytes == 0 {
            0.0
        } else {
            reads as f64 / bytes as f64
        }
    }

    /// The whole restore, round by round: the receding-horizon plan, unless
    /// keeping one split throughout reads fewer containers (the horizon
    /// cannot see every long-range reuse); with no cache that split is
    /// the plain assembly area, so DASM never reads more than `faa`.
    fn plan(&self) -> Vec<Round> {
        // The split is chosen again once every half budget of bytes (every
        // round when rounds are large): planning costs reserves × horizon
        // per decision.
        let mut decided: Option<(u64, u64)> = None; // (reserve, at bytes)
        let mut best = self.plan_by(|at, cache, done| {
            if let Some((r, when)) = decided {
                if done < when + self.budget / 2 {
                    return r;
                }
            }
            let mut best = (f64::INFINITY, 0u64);
            for &r in &self.reserves {
                let c = self.cost(at, cache, r);
                if c < best.0 {
                    best = (c, r);
                }
            }
            decided = Some((best.1, done));
            best.1
        });
        for &r in &self.reserves {
            let fixed = self.plan_by(|_, _, _| r);
            if total_reads(&fixed) < total_reads(&best) {
                best = fixed;
            }
        }
        best
    }

    /// Rounds with the cache reserve `reserve(start, cache, bytes planned
    /// so far)` picks.
    fn plan_by(
        &self,
        mut reserve: impl FnMut(Cursor, &[(ContainerId, usize)], u64) -> u64,
    ) -> Vec<Round> {
        let mut rounds = Vec::new();
        let mut cache: Vec<(ContainerId, usize)> = Vec::new();
        let mut at: Cursor = (0, 0);
        let mut done = 0u64;
        while at.0 < self.locs.len() {
            let s = self.step(at, &cache, reserve(at, &cache, done));
            rounds.push(Round {
                start: at,
                end: s.end,
                cache_in: s.cache_in.iter().map(|&(c, _)| c).collect(),
                cache_out: s.cache_out.iter().map(|&(c, _)| c).collect(),
                area: s.bytes,
                reads: s.reads,
            });
            done += s.bytes;
            at = s.end;
            cache = s.cache_out;
        }
        rounds
    }
}

fn total_reads(plan: &[Round]) -> u64 {
    plan.iter().map(|r| r.reads).sum()
}

/// A round's pieces in output order: (position, byte range within it).
fn pieces<'a>(locs: &'a [Loc], r: &Round) -> impl Iterator<Item = (Loc, u32, u32)> + 'a {
    let last = if r.end.1 > 0 { r.end.0 + 1 } else { r.end.0 };
    let (start, end) = (r.start, r.end);
    (start.0..last).map(move |k| {
        let len = match locs[k] {
            Loc::Stored { len, .. } | Loc::Zero { len } => len,
        };
        let lo = if k == start.0 { start.1 } else { 0 };
        let hi = if k == end.0 { end.1 } else { len };
        (locs[k], lo, hi)
    })
}

/// The data-space span `[lo, hi)` of one container's pieces (none is empty).
fn span(ps: &[(usize, u64, u32)]) -> (u64, u64) {
    let lo = ps.iter().map(|p| p.1).min().unwrap_or(0);
    let hi = ps.iter().map(|p| p.1 + u64::from(p.2)).max().unwrap_or(lo);
    (lo, hi)
}

pub(super) fn run(
    store: &Store,
    locs: &[Loc],
    budget: u64,
    out: &mut dyn Write,
) -> Result<CacheStats> {
    let mut ld = Loader::new(store);
    let mut sizes = HashMap::new();
    for l in locs {
        if let Loc::Stored { container, .. } = *l {
            if let std::collections::hash_map::Entry::Vacant(e) = sizes.entry(container) {
                e.insert(ld.size(container)?);
            }
        }
    }
    let plan = Planner::new(locs, sizes, budget).plan();
    let mut cache: HashMap<ContainerId, Vec<u8>> = HashMap::new();
    let mut area: Vec<u8> = Vec::new();
    for round in &plan {
        // Where each stored piece goes in the area (offset, data-space
        // address, length), grouped by container in order of first use.
        let mut order: Vec<ContainerId> = Vec::new();
        let mut by_container: HashMap<ContainerId, Vec<(usize, u64, u32)>> = HashMap::new();
        let mut at = 0usize;
        for (l, lo, hi) in pieces(locs, round) {
            if let Loc::Stored {
                container, vaddr, ..
            } = l
            {
                by_container
                    .entry(container)
                    .or_insert_with(|| {
                        order.push(container);
                        Vec::new()
                    })
                    .push((at, vaddr + u64::from(lo), hi - lo));
                at += (hi - lo) as usize;
            }
        }
        debug_assert_eq!(at as u64, round.area);
        // Keep what the plan keeps into this round, and of that only what
        // the round uses or keeps after it, before anything is admitted.
        cache.retain(|c, _| {
            round.cache_in.contains(c)
                && (by_container.contains_key(c) || round.cache_out.contains(c))
        });
        area.clear();
        area.resize(at, 0);
        // The round's first reads are asked for at once (as many as the read-ahead of the
        // other caches): read back from a bucket, their GETs overlap instead of waiting
        // one by one.
        let mut asked = (0usize, 0u64);
        for c in order.iter().filter(|c| !cache.contains_key(*c)) {
            if asked.0 >= READ_AHEAD || asked.1 >= READ_AHEAD_BYTES {
                break;
            }
            let (lo, hi) = if round.cache_out.contains(c) {
                (0, u64::MAX)
            } else {
                span(&by_container[c])
            };
            asked = (asked.0 + 1, asked.1 + ld.prefetch(*c, lo, hi - lo));
        }
        // Cached containers first, dropping the ones this round is their
        // last use of: the cache then holds only what it keeps, and room is
        // there for the containers this round admits.
        order.sort_by_key(|c| !cache.contains_key(c));
        for c in order {
            let ps = &by_container[&c];
            if let Some(data) = cache.get(&c) {
                copy_pieces(&mut area, ps, data, 0, c)?;
                if !round.cache_out.contains(&c) {
                    cache.remove(&c);
                }
            } else if round.cache_out.contains(&c) {
                let data = ld.load(c)?;
                copy_pieces(&mut area, ps, &data, 0, c)?;
                cache.insert(c, data);
            } else {
                // Read through: only the blocks these pieces need.
                let (lo, hi) = span(ps);
                let (base, data) = ld.read_blocks(c, lo, hi - lo)?;
                ld.stats.reads += 1;
                copy_pieces(&mut area, ps, &data, base, c)?;
            }
            let held: u64 = cache.values().map(|d| d.len() as u64).sum();
            ld.stats.peak = ld.stats.peak.max(held + area.len() as u64);
        }
        // Write the round: stored bytes from the area, zeros as they come.
        let mut from = 0usize;
        for (l, lo, hi) in pieces(locs, round) {
            let n = (hi - lo) as usize;
            match l {
                Loc::Stored { .. } => {
                    out.write_all(&area[from..from + n]).map_err(out_err)?;
                    from += n;
                }
                Loc::Zero { .. } => write_zeros(out, n as u64)?,
            }
        }
    }
    Ok(ld.stats)
}

/// Copies each piece (area offset, data-space address, length) out of
/// `data`, which holds the container's data space from `base`.
fn copy_pieces(
    area: &mut [u8],
    pieces: &[(usize, u64, u32)],
    data: &[u8],
    base: u64,
    c: ContainerId,
) -> Result<()> {
    for &(at, vaddr, len) in pieces {
        let src = vaddr
            .checked_sub(base)
            .and_then(|o| data.get(o as usize..o as usize + len as usize))
            .ok_or_else(|| Error::CorruptContainer {
                container: c.to_string(),
                detail: format!("chunk at {vaddr}+{len} is outside the container"),
            })?;
        area[at..at + len as usize].copy_from_slice(src);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(c: u64, n: u64) -> Loc {
        Loc::Stored {
            container: ContainerId(c),
            vaddr: n * MIB,
            len: MIB as u32,
        }
    }

    fn planner(locs: &[Loc], budget_mib: u64) -> Planner<'_> {
        let sizes = locs
            .iter()
            .filter_map(|l| match *l {
                Loc::Stored { container, .. } => Some((container, 4 * MIB)),
                Loc::Zero { .. } => None,
            })
            .collect();
        Planner::new(locs, sizes, budget_mib * MIB)
    }

    /// `n` 1 MiB positions in container `c`, from its `first` MiB on.
    fn run_of(c: u64, first: u64, n: u64) -> Vec<Loc> {
        (first..first + n).map(|k| stored(c, k)).collect()
    }

    #[test]
    fn a_sequential_version_gets_the_whole_budget_as_area() {
        // Containers used once each, in order: caching can save nothing.
        let locs: Vec<Loc> = (0..16).flat_map(|c| run_of(c, 0, 4)).collect();
        let plan = planner(&locs, 16).plan();
        assert!(plan
            .iter()
            .all(|r| r.cache_in.is_empty() && r.cache_out.is_empty()));
        assert_eq!(plan.len(), 4, "64 MiB in 16 MiB rounds: {plan:?}");
        assert_eq!(total_reads(&plan), 16);
    }

    #[test]
    fn containers_the_version_returns_to_are_kept_through_a_stretch_of_others() {
        // A (containers 0, 1), then 16 MiB of B (10..13), then A again, with
        // 16 MiB of memory. An assembly area of 16 MiB reads A twice (8
        // reads); keeping A's two containers (8 MiB) and assembling 8 MiB at
        // a time reads each container once, while B's pass through.
        let mut locs = [run_of(0, 0, 4), run_of(1, 0, 4)].concat();
        for c in 10..14 {
            locs.extend(run_of(c, 0, 4));
        }
        locs.extend([run_of(0, 0, 4), run_of(1, 0, 4)].concat());
        let plan = planner(&locs, 16).plan();
        assert_eq!(total_reads(&plan), 6, "{plan:?}");
        let ids = |v: &[u64]| v.iter().map(|&c| ContainerId(c)).collect::<HashSet<_>>();
        // B is never cached: it is not used again.
        assert!(plan.iter().all(|r| r.cache_out.is_subset(&ids(&[0, 1]))));
        // Memory: every round's area plus its cache fits the budget.
        for r in &plan {
            let cache = r.cache_in.len().max(r.cache_out.len()) as u64 * 4 * MIB;
            assert!(r.area + cache <= 16 * MIB, "{r:?}");
        }
    }

    #[test]
    fn a_large_budget_compares_eight_reserves_from_none_to_the_most() {
        let locs = run_of(0, 0, 4);
        let r = planner(&locs, 128).reserves;
        let ks: Vec<u64> = r.iter().map(|r| r / (4 * MIB)).collect();
        // 128 MiB leaves room for at most 31 containers beside 1 MiB of area.
        assert_eq!(ks, vec![0, 4, 8, 13, 17, 22, 26, 31]);
        // 32 MiB: every whole number of containers, 0..=7.
        let r = planner(&locs, 32).reserves;
        assert_eq!(r, (0..8).map(|k| k * 4 * MIB).collect::<Vec<_>>());
    }

    #[test]
    fn a_budget_too_small_for_any_cache_is_a_plain_assembly_area() {
        let locs: Vec<Loc> = (0..8).flat_map(|c| run_of(c % 2, c, 1)).collect();
        let p = planner(&locs, 4);
        assert_eq!(
            p.reserves,
            vec![0],
            "4 MiB cannot hold a 4 MiB container and an area"
        );
        let plan = p.plan();
        assert_eq!(plan.len(), 2);
        assert_eq!(total_reads(&plan), 4);
    }
}
