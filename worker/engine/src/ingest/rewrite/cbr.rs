//! Context-based rewriting (Kaczmarczyk et al., SYSTOR '12, §5).
//!
//! For each duplicate (the *decision block*) two contexts are compared: its
//! *stream context* — the next 5 MiB written after it in this backup — and its
//! *disk context* — the data following its copy in its container (what a
//! read of it brings in, 2 MiB by default). The *rewrite utility* is the share
//! of the disk context that the stream context does not use. A block is
//! rewritten when its utility is at least the minimal utility (70%) and at
//! least the current threshold — the utility of the worst of the best 5% of
//! duplicates seen so far, tracked in utility buckets — and while rewrites stay
//! within 5% of the chunks seen so far. Otherwise every block in the context
//! intersection is kept as a duplicate and skips its own decision (keeping the
//! decision block means its read brings them in anyway).

use std::collections::VecDeque;

use super::{Item, Policy};

const BUCKETS: usize = 10_000;

pub struct Cbr {
    stream_ctx: u64,
    disk_ctx: u64,
    min_utility: f64,
    limit: f64,
    /// Undecided items (the decision block first), with a "keep" mark.
    queue: VecDeque<(Item, bool)>,
    queued_bytes: u64,
    buckets: Vec<u64>,
    dups_seen: u64,
    chunks_seen: u64,
    chunks_rewritten: u64,
}

impl Cbr {
    pub fn new(stream_ctx: u64, disk_ctx: u64, min_utility: f64, limit: f64) -> Self {
        Cbr {
            stream_ctx: stream_ctx.max(1),
            disk_ctx: disk_ctx.max(1),
            min_utility,
            limit,
            queue: VecDeque::new(),
            queued_bytes: 0,
            buckets: vec![0; BUCKETS],
            dups_seen: 0,
            chunks_seen: 0,
            chunks_rewritten: 0,
        }
    }

    /// Utility of rewriting the front block, and the queue positions of the
    /// blocks in its context intersection.
    fn utility(&self) -> (f64, Vec<usize>) {
        let (block, _) = self.queue[0];
        let d = block.dup.expect("only duplicates are decided");
        let ctx = self.disk_ctx.min(d.tail).max(u64::from(block.bytes));
        let lo = d.vaddr;
        let hi = d.vaddr + ctx;
        let mut used = u64::from(block.bytes);
        let mut inter = Vec::new();
        let mut bytes = 0u64;
        for (i, (it, _)) in self.queue.iter().enumerate().skip(1) {
            if bytes >= self.stream_ctx {
                break;
            }
            bytes += u64::from(it.bytes);
            if let Some(o) = it.dup {
                if o.container == d.container && o.vaddr > lo && o.vaddr < hi {
                    used += u64::from(it.bytes).min(hi - o.vaddr);
                    inter.push(i);
                }
            }
        }
        (1.0 - (used.min(ctx) as f64 / ctx as f64), inter)
    }

    /// The utility of the worst of the best 5% of duplicates seen so far.
    fn threshold(&self) -> f64 {
        let want = ((self.dups_seen as f64) * 0.05).ceil() as u64;
        if want == 0 {
            return self.min_utility;
        }
        let mut n = 0u64;
        for b in (0..BUCKETS).rev() {
            n += self.buckets[b];
            if n >= want {
                return b as f64 / BUCKETS as f64;
            }
        }
        0.0
    }

    /// Decides the front item and pops it.
    fn decide_front(&mut self, out: &mut Vec<bool>) {
        let (item, keep) = self.queue[0];
        let rewrite = match item.dup {
            None => false,
            Some(_) => {
                let (u, inter) = self.utility();
                self.dups_seen += 1;
                let b = ((u * BUCKETS as f64) as usize).min(BUCKETS - 1);
                self.buckets[b] += 1;
                let within_limit = (self.chunks_rewritten + u64::from(item.chunks)) as f64
                    <= self.limit * self.chunks_seen as f64;
                // (A utility exactly at the threshold counts: compare with a
                // tolerance so 1 - 0.3 equals 0.7.)
                if !keep && u + 1e-9 >= self.min_utility.max(self.threshold()) && within_limit {
                    self.chunks_rewritten += u64::from(item.chunks);
                    true
                } else {
                    for i in inter {
                        self.queue[i].1 = true;
                    }
                    false
                }
            }
        };
        out.push(rewrite);
        let (it, _) = self.queue.pop_front().expect("front exists");
        self.queued_bytes -= u64::from(it.bytes);
    }

    #[cfg(test)]
    pub fn rewritten_chunks(&self) -> u64 {
        self.chunks_rewritten
    }
}

impl Policy for Cbr {
    fn push(&mut self, item: Item, out: &mut Vec<bool>) {
        self.chunks_seen += u64::from(item.chunks);
        self.queued_bytes += u64::from(item.bytes);
        self.queue.push_back((item, false));
        // The front block's stream context is complete once the data behind it
        // reaches the context size.
        while let Some((front, _)) = self.queue.front() {
            if self.queued_bytes - u64::from(front.bytes) < self.stream_ctx {
                break;
            }
            self.decide_front(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<bool>) {
        while !self.queue.is_empty() {
            self.decide_front(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_duplicate_in_a_foreign_container_is_rewritten() {
        // 100 unique 1-KiB chunks, then one duplicate whose container holds
        // nothing else the stream needs: utility 1 - 1/64 for a 64 KiB disk
        // context. 101 chunks seen, limit 5% → 5 rewrites allowed.
        let mut p = Cbr::new(16 << 10, 64 << 10, 0.7, 0.05);
        let mut out = Vec::new();
        for _ in 0..100 {
            p.push(Item::unique(1024, 1), &mut out);
        }
        p.push(Item::dup(1024, 1, 7, 0, 4 << 20), &mut out);
        p.finish(&mut out);
        assert_eq!(out.len(), 101);
        assert!(out[100], "the fragmented duplicate is rewritten");
    }

    #[test]
    fn a_duplicate_whose_disk_context_the_stream_uses_is_kept_with_its_intersection() {
        // A run of 32 duplicates laid out back to back in container 3: the
        // first block's disk context (32 KiB) is entirely in its stream context
        // (utility 0), so it is kept and so are the other 31 (marked).
        let mut p = Cbr::new(64 << 10, 32 << 10, 0.7, 0.05);
        let mut out = Vec::new();
        for _ in 0..200 {
            p.push(Item::unique(1024, 1), &mut out);
        }
        for i in 0..32u64 {
            p.push(Item::dup(1024, 1, 3, i * 1024, 4 << 20), &mut out);
        }
        p.finish(&mut out);
        assert!(out.iter().all(|r| !r));
    }

    #[test]
    fn utility_case_from_the_paper() {
        // Utility 70% means 30% of the disk context appears in the stream
        // context: a 10 KiB disk context whose first 3 KiB (the block and two
        // neighbours) are used. Exactly at the minimal utility: rewritten.
        let mut p = Cbr::new(64 << 10, 10 << 10, 0.7, 1.0);
        let mut out = Vec::new();
        p.push(Item::dup(1024, 1, 9, 0, 1 << 20), &mut out);
        p.push(Item::dup(1024, 1, 9, 1024, 1 << 20), &mut out);
        p.push(Item::dup(1024, 1, 9, 2048, 1 << 20), &mut out);
        let (u, inter) = p.utility();
        assert!((u - 0.7).abs() < 1e-9, "utility {u}");
        assert_eq!(inter, vec![1, 2]);
        p.finish(&mut out);
        // The block is rewritten at exactly the minimal utility. Rewriting it
        // marks nothing, and each neighbour then sees less of its own disk
        // context used (80%, then 90% unused), so they are rewritten too.
        assert_eq!(out, [true, true, true]);
    }

    #[test]
    fn never_rewrites_more_than_the_limit() {
        // Every block is a lone duplicate from its own container.
        let mut p = Cbr::new(8 << 10, 64 << 10, 0.7, 0.05);
        let mut out = Vec::new();
        for i in 0..2000u64 {
            p.push(Item::dup(1024, 1, i, 0, 4 << 20), &mut out);
            let done = out.len() as u64;
            assert!(
                p.rewritten_chunks() as f64 <= 0.05 * (i + 1) as f64,
                "after {done} decisions"
            );
        }
        p.finish(&mut out);
        let n = out.iter().filter(|r| **r).count();
        assert!(
            (90..=100).contains(&n),
            "{n} rewrites of 2000 at a 5% limit"
        );
    }
}
