//! Reuse: chunks a restore needs more than once, kept in memory between uses.
//!
//! A version that repeats a chunk far from its first occurrence (chunk-mode
//! series dedup every repeat inside a version; segment-mode series link
//! repeats) sends a container engine back to a container it left long ago:
//! one whole container read for a few KiB. The recipe says before anything is
//! read which positions repeat a chunk, so a small chunk cache with full
//! look-ahead (Belady: on overflow drop the chunk needed farthest ahead) can
//! serve those positions instead. This is the chunk-caching half of ALACC
//! (Cao et al., FAST '18, cited by the LBW paper) in front of whichever
//! container engine runs; the engine restores the remaining positions under
//! the rest of the memory budget.
//!
//! [`plan`] decides, on the resolved positions alone, which occurrences are
//! served from memory; [`ReuseWriter`] sits between the engine and the
//! output, keeps the planned chunks as the engine's bytes pass through it and
//! writes them again where the plan says. The restore weighs plans for a few
//! budgets, so [`next_uses`] is computed once for all of them.

use std::collections::BTreeSet;
use std::io::Write;

use rustc_hash::FxHashMap as HashMap;

use crate::error::{Error, Result};
use crate::format::container::ContainerId;
use crate::recipe::archival::Loc;

/// What the writer does at an offset of the engine's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// The next `len` bytes from the engine are a chunk to keep in `slot`.
    Keep { slot: u32, len: u32 },
    /// Write the chunk kept in `slot` here; `last` frees it afterwards.
    Insert { slot: u32, last: bool },
    /// Forget the chunk in `slot` (the plan dropped it to make room).
    Release { slot: u32 },
}

/// Which positions of a restore are served from memory.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Positions served from memory, ascending.
    served: Vec<usize>,
    /// (offset in the engine's output, event), in order.
    events: Vec<(u64, Event)>,
    /// Bytes served from memory.
    pub served_bytes: u64,
    /// The most chunk bytes held at once (never more than the plan's budget).
    pub peak_bytes: u64,
}

type Key = (ContainerId, u64, u32);

/// The share of a restore's memory budget reuse may hold when a cache is
/// named: an eighth. `auto` also weighs no reuse, a sixteenth and a quarter
/// (a quarter reads fewer containers at small budgets: 107 against 113 for
/// an eighth on the kube series in 2 KiB chunk mode at 16 MiB).
pub(crate) const DEFAULT_SHARE: u64 = 8;
pub(crate) const AUTO_SHARES: [u64; 3] = [16, 8, 4];

/// Bytes reuse may hold: `1/share` of the restore budget, and never so much
/// that the engine gets less than the 1 MiB it needs.
pub(crate) fn budget_of(restore_budget: u64, share: u64) -> u64 {
    (restore_budget / share).min(restore_budget.saturating_sub(crate::config::MIB))
}

fn key(l: &Loc) -> Option<Key> {
    match *l {
        Loc::Stored {
            container,
            vaddr,
            len,
        } => Some((container, vaddr, len)),
        Loc::Zero { .. } => None,
    }
}

/// next[i]: the next position holding the same chunk as position i
/// (`usize::MAX` when none does, and for zeros). Computed once for all the
/// budgets a restore weighs.
pub(crate) fn next_uses(locs: &[Loc]) -> Vec<usize> {
    let mut next = vec![usize::MAX; locs.len()];
    let mut last: HashMap<Key, usize> = HashMap::default();
    for (i, l) in locs.iter().enumerate().rev() {
        if let Some(k) = key(l) {
            if let Some(&n) = last.get(&k) {
                next[i] = n;
            }
            last.insert(k, i);
        }
    }
    next
}

/// Plans chunk reuse for `locs` (whose [`next_uses`] are `next`) with at
/// most `budget` bytes of chunks held.
pub(crate) fn plan(locs: &[Loc], next: &[usize], budget: u64) -> Plan {
    let mut p = Plan::default();
    if budget == 0 || next.iter().all(|&n| n == usize::MAX) {
        return p; // no room, or nothing repeats
    }
    // Held chunks: key -> (slot, next use); `by_next` orders them for
    // eviction; slots are numbered in the order chunks are kept.
    let mut held: HashMap<Key, (u32, usize)> = HashMap::default();
    let mut by_next: BTreeSet<(usize, u32)> = BTreeSet::new();
    let mut slot_key: Vec<Key> = Vec::new();
    let mut bytes = 0u64;
    let mut at = 0u64; // offset in the engine's output
    for (i, l) in locs.iter().enumerate() {
        let Some(k) = key(l) else {
            if let Loc::Zero { len } = *l {
                at += u64::from(len);
            }
            continue;
        };
        let len = u64::from(k.2);
        if let Some((slot, n)) = held.get(&k).copied() {
            // Served from memory.
            by_next.remove(&(n, slot));
            let last = next[i] == usize::MAX;
            if last {
                held.remove(&k);
                bytes -= len;
            } else {
                held.insert(k, (slot, next[i]));
                by_next.insert((next[i], slot));
            }
            p.events.push((at, Event::Insert { slot, last }));
            p.served.push(i);
            p.served_bytes += len;
            continue;
        }
        if next[i] != usize::MAX && len <= budget {
            // Make room by dropping chunks needed later than this one.
            while bytes + len > budget {
                let Some(&(far, victim)) = by_next.last() else {
                    break;
                };
                if far < next[i] {
                    break;
                }
                by_next.remove(&(far, victim));
                let vk = slot_key[victim as usize];
                held.remove(&vk);
                bytes -= u64::from(vk.2);
                p.events.push((at, Event::Release { slot: victim }));
            }
            if bytes + len <= budget {
                let slot = slot_key.len() as u32;
                slot_key.push(k);
                held.insert(k, (slot, next[i]));
                by_next.insert((next[i], slot));
                bytes += len;
                p.peak_bytes = p.peak_bytes.max(bytes);
                p.events.push((at, Event::Keep { slot, len: k.2 }));
            }
        }
        at += len;
    }
    p
}

impl Plan {
    /// True when nothing is served from memory (the writer is not needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.served.is_empty()
    }

    /// The positions of `locs` the container engine restores: all but the
    /// served ones, in order.
    pub(crate) fn engine_locs(&self, locs: &[Loc]) -> Vec<Loc> {
        let mut served = self.served.iter().copied().peekable();
        locs.iter()
            .enumerate()
            .filter(|&(i, _)| served.next_if_eq(&i).is_none())
            .map(|(_, l)| *l)
            .collect()
    }
}

/// Writes the engine's output and the planned repeats, in recipe order.
pub(crate) struct ReuseWriter<'a> {
    out: &'a mut dyn Write,
    events: std::slice::Iter<'a, (u64, Event)>,
    pending: Option<(u64, Event)>,
    /// Offset in the engine's output.
    at: u64,
    held: HashMap<u32, Vec<u8>>,
    /// The chunk being kept as it passes: (slot, bytes still to come).
    keeping: Option<(u32, usize)>,
}

impl<'a> ReuseWriter<'a> {
    pub(crate) fn new(out: &'a mut dyn Write, plan: &'a Plan) -> Self {
        let mut events = plan.events.iter();
        let pending = events.next().copied();
        ReuseWriter {
            out,
            events,
            pending,
            at: 0,
            held: HashMap::default(),
            keeping: None,
        }
    }

    /// Applies the events due at the current offset.
    fn due(&mut self) -> std::io::Result<()> {
        while let Some((at, ev)) = self.pending {
            if at != self.at {
                break;
            }
            match ev {
                Event::Keep { slot, len } => {
                    self.held.insert(slot, Vec::with_capacity(len as usize));
                    self.keeping = Some((slot, len as usize));
                }
                Event::Insert { slot, last } => {
                    let bytes = self.held.get(&slot).ok_or_else(|| {
                        std::io::Error::other(format!("restore reuse: chunk {slot} was not kept"))
                    })?;
                    self.out.write_all(bytes)?;
                    if last {
                        self.held.remove(&slot);
                    }
                }
                Event::Release { slot } => {
                    self.held.remove(&slot);
                }
            }
            self.pending = self.events.next().copied();
        }
        Ok(())
    }

    /// Writes the repeats planned after the engine's last byte and checks
    /// that the engine produced what the plan expected.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.due().map_err(|e| Error::Invalid(e.to_string()))?;
        if self.pending.is_some() || self.keeping.is_some() {
            return Err(Error::Invalid(format!(
                "restore reuse: the engine's output ended at byte {} before the plan did",
                self.at
            )));
        }
        Ok(())
    }
}

impl Write for ReuseWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.due()?;
        let mut n = buf.len();
        if let Some((at, _)) = self.pending {
            // Stop at the next event; `at > self.at` after `due`.
            n = n.min((at - self.at) as usize);
        }
        if let Some((slot, left)) = self.keeping {
            n = n.min(left);
            let kept = self.held.get_mut(&slot).expect("kept slot");
            kept.extend_from_slice(&buf[..n]);
            self.keeping = (left > n).then_some((slot, left - n));
        }
        self.out.write_all(&buf[..n])?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stored(c: u64, vaddr: u64, len: u32) -> Loc {
        Loc::Stored {
            container: ContainerId(c),
            vaddr,
            len,
        }
    }

    /// The bytes a position stands for: a pattern of its container and offset.
    fn bytes_of(l: &Loc) -> Vec<u8> {
        match *l {
            Loc::Stored {
                container,
                vaddr,
                len,
            } => (0..u64::from(len))
                .map(|i| (container.0 * 31 + vaddr + i) as u8)
                .collect(),
            Loc::Zero { len } => vec![0; len as usize],
        }
    }

    fn expand(locs: &[Loc]) -> Vec<u8> {
        locs.iter().flat_map(bytes_of).collect()
    }

    /// Runs a plan the way a restore does: the engine writes its positions
    /// in pieces of `step` bytes through the reuse writer.
    fn replay(locs: &[Loc], budget: u64, step: usize) -> (Vec<u8>, Plan) {
        let p = plan(locs, &next_uses(locs), budget);
        let engine = expand(&p.engine_locs(locs));
        let mut out = Vec::new();
        let mut w = ReuseWriter::new(&mut out, &p);
        for piece in engine.chunks(step.max(1)) {
            w.write_all(piece).unwrap();
        }
        w.finish().unwrap();
        (out, p)
    }

    #[test]
    fn a_repeated_chunk_is_served_from_memory() {
        let (a, b, c) = (stored(1, 0, 100), stored(2, 0, 50), stored(3, 0, 70));
        let locs = [a, b, a, c, a];
        let (out, p) = replay(&locs, 1000, 7);
        assert_eq!(out, expand(&locs));
        assert_eq!(p.engine_locs(&locs), vec![a, b, c]);
        assert_eq!(
            (p.served.len() as u64, p.served_bytes, p.peak_bytes),
            (2, 200, 100)
        );
    }

    #[test]
    fn nothing_is_kept_beyond_the_budget() {
        let (a, b) = (stored(1, 0, 100), stored(2, 0, 50));
        let locs = [a, b, a, b];
        // Room for b only: a is read twice.
        let (out, p) = replay(&locs, 60, 3);
        assert_eq!(out, expand(&locs));
        assert_eq!(p.engine_locs(&locs), vec![a, b, a]);
        assert_eq!((p.served.len() as u64, p.peak_bytes), (1, 50));
        let (_, none) = replay(&locs, 0, 3);
        assert_eq!(none.engine_locs(&locs), locs.to_vec());
        assert!(none.is_empty());
    }

    #[test]
    fn the_chunk_needed_farthest_ahead_makes_room() {
        let (a, b, c) = (stored(1, 0, 100), stored(1, 100, 100), stored(2, 0, 100));
        // Room for one chunk: a (next needed at 4) gives way to b (at 2).
        let locs = [a, b, b, c, a];
        let (out, p) = replay(&locs, 100, 64);
        assert_eq!(out, expand(&locs));
        assert_eq!(p.engine_locs(&locs), vec![a, b, c, a]);
        assert_eq!(p.served.len() as u64, 1);
    }

    fn loc() -> impl Strategy<Value = Loc> {
        prop_oneof![
            4 => (0u64..4, 0u64..6, 1u32..300).prop_map(|(c, i, len)| stored(c, i * 1000, len)),
            1 => (1u32..200).prop_map(|len| Loc::Zero { len }),
        ]
    }

    proptest! {
        /// Whatever the positions, budget and write sizes: the output is the
        /// version, held bytes stay within the budget, and every position is
        /// either restored by the engine or served from memory.
        #[test]
        fn reuse_reproduces_the_version(
            locs in proptest::collection::vec(loc(), 0..80),
            budget in 0u64..2000,
            step in 1usize..500,
        ) {
            let (out, p) = replay(&locs, budget, step);
            prop_assert_eq!(out, expand(&locs));
            prop_assert!(p.peak_bytes <= budget);
            prop_assert_eq!(p.engine_locs(&locs).len() as u64 + p.served.len() as u64, locs.len() as u64);
        }
    }
}
