//! Flexible Container Referenced Count (Cao et al. FAST '19 §3.2). Segments as
//! in capping, but the threshold is a reference count T: duplicates from old
//! containers referenced fewer than T times in the segment are rewritten. T
//! lies between two bounds computed per segment with credits carried forward:
//!
//! - RC_rw from the dedup-ratio loss budget x%: the version may rewrite
//!   N_unique·x/(1-x) chunks, H_rw per segment; segment i may rewrite up to
//!   H_rw·i minus what earlier segments rewrote;
//! - RC_reads from the container-read cap: segment i may read up to Cap·i minus
//!   what earlier segments read.
//!
//! If the bounds conflict, the loss budget wins (T = RC_rw); otherwise T keeps
//! the previous segment's value if it lies between them, or takes their mean.

use super::{cnrc, rc_reads, rc_rw, Item, Policy, VersionHint};

pub struct Fcrc {
    segment_bytes: u64,
    cap: f64,
    /// Chunks each segment may rewrite (H_rw); `None` until estimated.
    h_rw: Option<f64>,
    loss: f64,
    hint: VersionHint,
    buf: Vec<Item>,
    bytes: u64,
    segments: u64,
    rewritten: f64,
    reads: f64,
    t_prev: Option<f64>,
    /// Running counts, for the budget estimate when there is no previous version.
    seen_chunks: u64,
    seen_unique: u64,
}

impl Fcrc {
    pub fn new(segment_bytes: u64, loss: f64, cap: u32, hint: VersionHint) -> Self {
        let mut f = Fcrc {
            segment_bytes: segment_bytes.max(1),
            cap: f64::from(cap),
            h_rw: None,
            loss,
            hint,
            buf: Vec::new(),
            bytes: 0,
            segments: 0,
            rewritten: 0.0,
            reads: 0.0,
            t_prev: None,
            seen_chunks: 0,
            seen_unique: 0,
        };
        if hint.estimates_an_increment() {
            f.h_rw = Some(per_segment_budget(
                hint.unique_chunks as f64,
                loss,
                hint.logical_bytes,
                f.segment_bytes,
            ));
        }
        f
    }

    /// The threshold for one segment, given its containers' reference counts.
    pub(crate) fn threshold(&mut self, counts: Vec<u64>) -> f64 {
        self.segments += 1;
        let i = self.segments as f64;
        let h = match self.h_rw {
            Some(h) => h,
            // No previous version: estimate from what this backup has seen.
            None => {
                let est_unique = self.seen_unique.max(1) as f64;
                per_segment_budget(
                    est_unique,
                    self.loss,
                    self.hint
                        .logical_bytes
                        .max(self.segment_bytes * self.segments),
                    self.segment_bytes,
                )
            }
        };
        // Earlier segments never overspend (the limit is never negative), so
        // this is at least H_rw: unused budget is a credit for later segments.
        let rw = rc_rw(counts.clone(), (h * i - self.rewritten).max(0.0));
        let reads = rc_reads(counts, self.cap * i - self.reads);
        let t = adjust(self.t_prev, rw, reads);
        self.t_prev = Some(t);
        t
    }

    fn decide(&mut self, out: &mut Vec<bool>) {
        if self.buf.is_empty() {
            return;
        }
        let counts = cnrc(self.buf.iter());
        let t = self.threshold(counts.values().copied().collect());
        for n in counts.values() {
            if (*n as f64) < t {
                self.rewritten += *n as f64;
            } else {
                self.reads += 1.0;
            }
        }
        for it in self.buf.drain(..) {
            out.push(it.dup.is_some_and(|d| (counts[&d.container] as f64) < t));
        }
        self.bytes = 0;
    }
}

/// H_rw: N_rw_total = N_unique·x/(1-x), spread over the version's segments.
fn per_segment_budget(unique: f64, loss: f64, logical: u64, segment_bytes: u64) -> f64 {
    let total = unique * loss / (1.0 - loss);
    let segments = (logical as f64 / segment_bytes as f64).ceil().max(1.0);
    total / segments
}

/// T for the next segment (or LBW cycle): Cao et al. §3.2; LBW's Algorithm 1
/// refines it with chunk closeness.
pub(crate) fn adjust(prev: Option<f64>, rw: f64, reads: f64) -> f64 {
    if rw < reads {
        return rw;
    }
    match prev {
        Some(t) if reads <= t && t <= rw => t,
        _ => (rw + reads) / 2.0,
    }
}

impl Policy for Fcrc {
    fn push(&mut self, item: Item, out: &mut Vec<bool>) {
        self.seen_chunks += u64::from(item.chunks);
        if item.dup.is_none() {
            self.seen_unique += u64::from(item.chunks);
        }
        self.bytes += u64::from(item.bytes);
        self.buf.push(item);
        if self.bytes >= self.segment_bytes {
            self.decide(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<bool>) {
        self.decide(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_respects_the_loss_budget_first() {
        // Budget: 100 unique chunks at x = 50% → 100 rewrites over 10 segments,
        // 10 per segment. Cap 1 read per segment.
        let hint = VersionHint {
            chunks: 1000,
            unique_chunks: 100,
            logical_bytes: 10,
        };
        let mut f = Fcrc::new(1, 0.5, 1, hint);
        // Containers referenced 2, 3, 6 and 30 times: 2+3 fit the 10-chunk budget,
        // 6 more would not: RC_rw = 6. One read allowed: RC_reads = 7 (rewrite
        // everything but the 30). The budget wins: T = 6.
        assert_eq!(f.threshold(vec![2, 3, 6, 30]), 6.0);
        // Next segment: credit carried (5 unused chunks → limit 15): 2 + 3 + 6
        // = 11 fit → RC_rw = 30; one read used of two → RC_reads = 7; the
        // previous T (6) is not between 7 and 30, so T is their mean.
        f.rewritten = 5.0;
        f.reads = 1.0;
        assert_eq!(f.threshold(vec![2, 3, 6, 30]), (30.0 + 7.0) / 2.0);
        // A third segment with the reads all spent: everything must go, but
        // the loss budget wins.
        f.reads = 4.0;
        f.rewritten = 20.0;
        assert_eq!(f.threshold(vec![2, 3, 6, 30]), 6.0);
    }

    #[test]
    fn rewrites_only_low_count_containers() {
        let hint = VersionHint {
            chunks: 100,
            unique_chunks: 50,
            logical_bytes: 20,
        };
        let mut f = Fcrc::new(20, 0.2, 2, hint);
        let mut out = Vec::new();
        let stream: Vec<u64> = vec![1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 4, 1, 1, 2, 2];
        for c in &stream {
            f.push(Item::dup(1, 1, *c, 0, 10), &mut out);
        }
        f.finish(&mut out);
        // Budget 50·0.2/0.8 = 12.5 chunks for the one segment; reads cap 2:
        // containers 3 and 4 (one chunk each) are rewritten, 1 and 2 are not.
        let want: Vec<bool> = stream.iter().map(|c| *c >= 3).collect();
        assert_eq!(out, want);
    }
}
