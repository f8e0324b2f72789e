//! Sliding look-back window (Cao et al. FAST '19 §4–5).
//!
//! The window covers the last S containers' worth of the stream, in slots of
//! one container size; it moves a slot at a time. Each arriving duplicate is
//! classified at once (step 1): if chunks of its old container already in the
//! window were kept (*non-rewrite*), so is it; otherwise it becomes a
//! *candidate*. Whenever a container's reference count in the window
//! (CNRC_lbw, duplicates counted) reaches the threshold T_dc, its candidates
//! become non-rewrite (step 3). (The paper states the rule as "more than" a
//! threshold; we use "at least" so T_dc and FCRC's T_cnrc mean the same thing
//! and the budget bounds computed for one apply to the other.) When a slot leaves the window, its remaining
//! candidates are rewritten (step 4) — if a container's *leading chunk* (its
//! first chunk in the window, the one that would trigger a container read) is
//! rewritten, the container's other candidates in the window are rewritten
//! too. Every S slots (one cycle), T_dc is adjusted by Algorithm 1 from the
//! rewrite-budget bound RC_rw, the container-read bound RC_reads (as in FCRC,
//! with credits carried over) and the change in referenced-chunk closeness L_c.

use std::collections::{HashMap, VecDeque};

use super::fcrc::adjust;
use super::{rc_reads, rc_rw, Item, Policy, VersionHint};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unique,
    Keep,
    Candidate,
    Rewrite,
}

struct Slot {
    /// Absolute sequence numbers of the slot's items.
    first: u64,
    len: usize,
    bytes: u64,
}

pub struct Lbw {
    slots_max: usize,
    slot_bytes: u64,
    items: VecDeque<(Item, State, bool)>,
    /// Sequence number of `items[0]`.
    base: u64,
    slots: VecDeque<Slot>,
    /// CNRC_lbw: chunks in the window referencing each old container.
    cnrc: HashMap<u64, u64>,
    /// Non-rewrite chunks in the window per container.
    kept: HashMap<u64, u64>,
    /// Candidate cache: candidates in the window per container.
    candidates: HashMap<u64, Vec<u64>>,
    t_dc: f64,
    fixed: bool,
    // Budgets (as FCRC), per cycle of S slots.
    h_rw: f64,
    cap: f64,
    cycles: u64,
    moves: u64,
    rewritten: f64,
    reads: f64,
    lc_prev: Option<f64>,
    seen_unique: u64,
    loss: f64,
    hint: VersionHint,
}

impl Lbw {
    pub fn new(
        window: usize,
        container_bytes: u64,
        loss: f64,
        cap: u32,
        hint: VersionHint,
    ) -> Self {
        let cycle_bytes = window as u64 * container_bytes;
        let h_rw = if hint.estimates_an_increment() {
            let total = hint.unique_chunks as f64 * loss / (1.0 - loss);
            total
                / (hint.logical_bytes as f64 / cycle_bytes as f64)
                    .ceil()
                    .max(1.0)
        } else {
            f64::NAN // estimated from this backup's own counts as it goes
        };
        Lbw {
            slots_max: window.max(1),
            slot_bytes: container_bytes.max(1),
            items: VecDeque::new(),
            base: 0,
            slots: VecDeque::new(),
            cnrc: HashMap::new(),
            kept: HashMap::new(),
            candidates: HashMap::new(),
            t_dc: f64::INFINITY,
            fixed: false,
            h_rw,
            cap: f64::from(cap) * window as f64,
            cycles: 0,
            moves: 0,
            rewritten: 0.0,
            reads: 0.0,
            lc_prev: None,
            seen_unique: 0,
            loss,
            hint,
        }
    }

    /// A window with a fixed threshold (no Algorithm 1), as in the paper's
    /// Figure 4 walk-through.
    #[cfg(test)]
    pub fn with_fixed_threshold(window: usize, slot_bytes: u64, t_dc: f64) -> Self {
        let mut l = Lbw::new(window, slot_bytes, 0.0, 1, VersionHint::default());
        l.t_dc = t_dc;
        l.fixed = true;
        l
    }

    fn item(&mut self, seq: u64) -> &mut (Item, State, bool) {
        &mut self.items[(seq - self.base) as usize]
    }

    /// Step 3 for one container: at or above the threshold, its candidates
    /// are kept (the same rule as FCRC: rewrite only below T).
    fn promote(&mut self, c: u64) {
        if (self.cnrc.get(&c).copied().unwrap_or(0) as f64) < self.t_dc {
            return;
        }
        if let Some(seqs) = self.candidates.remove(&c) {
            for s in seqs {
                let chunks = {
                    let e = self.item(s);
                    e.1 = State::Keep;
                    e.0.chunks
                };
                *self.kept.entry(c).or_default() += u64::from(chunks);
            }
        }
    }

    fn add(&mut self, item: Item) {
        let seq = self.base + self.items.len() as u64;
        let (state, leading) = match item.dup {
            None => {
                self.seen_unique += u64::from(item.chunks);
                (State::Unique, false)
            }
            Some(d) => {
                let c = d.container;
                let before = self.cnrc.get(&c).copied().unwrap_or(0);
                *self.cnrc.entry(c).or_default() += u64::from(item.chunks);
                if self.kept.get(&c).copied().unwrap_or(0) > 0 {
                    *self.kept.entry(c).or_default() += u64::from(item.chunks);
                    (State::Keep, before == 0)
                } else {
                    self.candidates.entry(c).or_default().push(seq);
                    (State::Candidate, before == 0)
                }
            }
        };
        self.items.push_back((item, state, leading));
        match self.slots.back_mut() {
            Some(s) if s.bytes < self.slot_bytes => {
                s.len += 1;
                s.bytes += u64::from(item.bytes);
            }
            _ => self.slots.push_back(Slot {
                first: seq,
                len: 1,
                bytes: u64::from(item.bytes),
            }),
        }
        if let Some(d) = item.dup {
            self.promote(d.container);
        }
    }

    /// L_c: for each leading chunk in the window, the mean distance (in
    /// chunks) to the other chunks of its container in the window, over the
    /// window's size in chunks; averaged over leading chunks.
    fn closeness(&self) -> f64 {
        let total: u64 = self.items.iter().map(|e| u64::from(e.0.chunks)).sum();
        if total == 0 {
            return 0.0;
        }
        let mut first: HashMap<u64, u64> = HashMap::new();
        let mut sum: HashMap<u64, (f64, u64)> = HashMap::new();
        let mut pos = 0u64;
        for e in &self.items {
            if let Some(d) = e.0.dup {
                match first.get(&d.container) {
                    None => {
                        first.insert(d.container, pos);
                    }
                    Some(&f) => {
                        let s = sum.entry(d.container).or_default();
                        s.0 += (pos - f) as f64;
                        s.1 += 1;
                    }
                }
            }
            pos += u64::from(e.0.chunks);
        }
        let per: Vec<f64> = sum
            .values()
            .map(|(d, n)| d / *n as f64 / total as f64)
            .collect();
        if per.is_empty() {
            0.0
        } else {
            per.iter().sum::<f64>() / per.len() as f64
        }
    }

    /// Step 5: end of a cycle of S slot moves.
    fn adjust_threshold(&mut self) {
        if self.fixed {
            return;
        }
        self.cycles += 1;
        let i = self.cycles as f64;
        let counts: Vec<u64> = self.cnrc.values().copied().filter(|c| *c > 0).collect();
        let h = if self.h_rw.is_finite() {
            self.h_rw
        } else {
            // No previous version: budget from what this backup has seen.
            let logical = self
                .hint
                .logical_bytes
                .max(self.slot_bytes * self.slots_max as u64 * self.cycles);
            let cycles = (logical as f64 / (self.slot_bytes * self.slots_max as u64) as f64)
                .ceil()
                .max(1.0);
            self.seen_unique.max(1) as f64 * self.loss / (1.0 - self.loss) / cycles
        };
        let rw = rc_rw(counts.clone(), (h * i - self.rewritten).max(0.0));
        let reads = rc_reads(counts, self.cap * i - self.reads);
        let lc = self.closeness();
        self.t_dc = algorithm1(
            self.t_dc.is_finite().then_some(self.t_dc),
            lc,
            self.lc_prev,
            rw,
            reads,
        );
        self.lc_prev = Some(lc);
    }

    /// Moves the oldest slot out: steps 3 and 4, then emits its decisions.
    fn evict(&mut self, out: &mut Vec<bool>) {
        if self.t_dc.is_infinite() && !self.fixed {
            // First move: set the threshold from the full window.
            self.adjust_threshold();
        }
        let conts: Vec<u64> = self.candidates.keys().copied().collect();
        for c in conts {
            self.promote(c);
        }
        let slot = self.slots.pop_front().expect("a slot to evict");
        for s in slot.first..slot.first + slot.len as u64 {
            let (item, state, leading) = *self.item(s);
            if state != State::Candidate {
                continue;
            }
            let c = item.dup.expect("candidates are duplicates").container;
            let rewrite_all = leading;
            let seqs = self.candidates.remove(&c).unwrap_or_default();
            for t in seqs {
                if t == s || rewrite_all {
                    self.item(t).1 = State::Rewrite;
                } else {
                    self.candidates.entry(c).or_default().push(t);
                }
            }
        }
        for _ in 0..slot.len {
            let (item, state, leading) = self.items.pop_front().expect("slot items are queued");
            self.base += 1;
            out.push(state == State::Rewrite);
            if let Some(d) = item.dup {
                let n = u64::from(item.chunks);
                if let Some(x) = self.cnrc.get_mut(&d.container) {
                    *x -= n;
                    if *x == 0 {
                        self.cnrc.remove(&d.container);
                    }
                }
                match state {
                    State::Keep => {
                        if let Some(x) = self.kept.get_mut(&d.container) {
                            *x -= n.min(*x);
                        }
                        if leading {
                            self.reads += 1.0;
                        }
                    }
                    State::Rewrite => self.rewritten += n as f64,
                    _ => {}
                }
            }
        }
        self.moves += 1;
        if self.moves.is_multiple_of(self.slots_max as u64) {
            self.adjust_threshold();
        }
    }
}

/// Algorithm 1 (Cao et al.): T_dc for the next cycle.
pub(crate) fn algorithm1(
    t: Option<f64>,
    lc: f64,
    lc_prev: Option<f64>,
    rw: f64,
    reads: f64,
) -> f64 {
    if rw < reads {
        return rw;
    }
    let start = adjust(t, rw, reads);
    match lc_prev {
        // Chunks got closer: one container read serves more, keep more.
        Some(p) if lc < p => start - 1.0,
        Some(_) => start + 1.0,
        None => start,
    }
}

impl Policy for Lbw {
    fn push(&mut self, item: Item, out: &mut Vec<bool>) {
        self.add(item);
        let full = self
            .slots
            .back()
            .is_some_and(|s| s.bytes >= self.slot_bytes);
        if full && self.slots.len() > self.slots_max {
            self.evict(out);
        }
    }

    fn finish(&mut self, out: &mut Vec<bool>) {
        while !self.slots.is_empty() {
            self.evict(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: u64) -> Item {
        Item::dup(1, 1, c, 0, 1 << 20)
    }

    #[test]
    fn the_figure_4_walk() {
        // A window of 4 containers of 3 chunks; a container with more than 4
        // chunks in the window is not rewritten (threshold T_dc = 5). At position 1
        // (slots 1-4) containers 1, 2 and 3 have 8, 2 and 2 chunks: container
        // 1's chunks are kept; 2's and 3's are candidates. At position 2 the
        // new slot brings container 2 to 5: its candidates are kept. At
        // position 3 container 3's two chunks reach the end of the window
        // still below the threshold: they are rewritten.
        let u = Item::unique(1, 1);
        let slots = [
            [d(1), d(1), d(2)],
            [d(1), d(1), d(2)],
            [d(3), d(1), d(3)],
            [d(1), d(1), d(1)],
            [d(2), d(2), d(2)],
            [u, u, u],
            [u, u, u],
        ];
        let mut p = Lbw::with_fixed_threshold(4, 3, 5.0);
        let mut out = Vec::new();
        let mut after = Vec::new();
        for s in &slots {
            for it in s {
                p.push(*it, &mut out);
            }
            after.push(out.len());
        }
        // Nothing is decided until the window is full and moves.
        assert_eq!(&after[..4], &[0, 0, 0, 0]);
        assert_eq!(after[4], 3, "position 2: slot 1 leaves the window");
        p.finish(&mut out);
        let want: Vec<bool> = slots
            .iter()
            .flatten()
            .map(|it| matches!(it.dup, Some(x) if x.container == 3))
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn a_rewritten_leading_chunk_takes_its_containers_candidates_along() {
        // Container 5's first chunk (leading) leaves the window while its two
        // later chunks are still inside: all three are rewritten.
        let u = Item::unique(1, 1);
        let stream = [d(5), u, u, u, d(5), d(5), u, u, u, u, u, u];
        let mut p = Lbw::with_fixed_threshold(2, 3, 5.0);
        let mut out = Vec::new();
        for it in &stream {
            p.push(*it, &mut out);
        }
        assert_eq!(&out[..3], &[true, false, false]);
        p.finish(&mut out);
        assert_eq!(
            out,
            [true, false, false, false, true, true, false, false, false, false, false, false]
        );
    }

    #[test]
    fn algorithm_1_table() {
        // rw < reads: the dedup-ratio budget wins.
        assert_eq!(algorithm1(Some(10.0), 0.2, Some(0.3), 5.0, 8.0), 5.0);
        // T inside [reads, rw]: kept, then nudged by closeness.
        assert_eq!(algorithm1(Some(10.0), 0.2, Some(0.3), 20.0, 4.0), 9.0);
        assert_eq!(algorithm1(Some(10.0), 0.4, Some(0.3), 20.0, 4.0), 11.0);
        // T outside: restart from the middle of the bounds.
        assert_eq!(algorithm1(Some(30.0), 0.4, Some(0.3), 20.0, 4.0), 13.0);
    }

    #[test]
    fn adjusted_threshold_keeps_rewrites_within_the_loss_budget() {
        // 64 old containers referenced one chunk each per slot, interleaved
        // with unique chunks; budget: 5% loss of 10_000 unique chunks.
        let hint = VersionHint {
            chunks: 200_000,
            unique_chunks: 10_000,
            logical_bytes: 200_000,
        };
        let mut p = Lbw::new(4, 1000, 0.05, 2, hint);
        let mut out = Vec::new();
        let mut n = 0u64;
        for i in 0..200_000u64 {
            let it = if i % 3 == 0 {
                Item::unique(1, 1)
            } else {
                d(i / 5 % 64)
            };
            p.push(it, &mut out);
            n += 1;
        }
        p.finish(&mut out);
        assert_eq!(out.len() as u64, n);
        let rewritten = out.iter().filter(|r| **r).count() as f64;
        let budget = 10_000.0 * 0.05 / 0.95;
        assert!(
            rewritten <= budget * 1.3,
            "{rewritten} rewrites against a budget of {budget}"
        );
    }
}
