//! Rewrite selection on the inline path: which duplicates to store again so
//! the version being written reads from fewer containers later.
//!
//! A policy sees the version's dedup units in stream order — unique ones and
//! duplicates with the container their copy lives in — and returns, strictly
//! in stream order, whether each unit is *rewritten* (stored again next to the
//! new data) or referenced where it is. Policies may delay decisions (a
//! capping segment, CBR's stream context, LBW's window); the backup keeps the
//! undecided units' data until their decisions arrive, so memory is bounded by
//! the policy's window.
//!
//! Counts are in chunks (a segment unit counts as its chunks), as in the papers.
//!
//! - [`Capping`]: Lillibridge et al. via Cao et al. FAST '19 §2.2;
//! - [`Cbr`]: Kaczmarczyk et al. SYSTOR '12 §5;
//! - [`Fcrc`]: Cao et al. §3.2;
//! - [`Lbw`]: Cao et al. §4–5 with Algorithm 1.

mod capping;
mod cbr;
mod fcrc;
mod lbw;

pub use capping::Capping;
pub use cbr::Cbr;
pub use fcrc::Fcrc;
pub use lbw::Lbw;

// Re-exported: the settings are stored with a series (`config`), the policies they build are here.
pub use crate::config::RewriteSettings;
use crate::format::records::VersionHint;

/// Where a duplicate's current copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dup {
    pub container: u64,
    /// Offset of the copy in the container's data space.
    pub vaddr: u64,
    /// Bytes of the container's data space from `vaddr` to its end (the most
    /// a read starting at the copy can bring in).
    pub tail: u64,
}

/// One dedup unit, as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub bytes: u32,
    pub chunks: u32,
    pub dup: Option<Dup>,
}

impl Item {
    pub fn unique(bytes: u32, chunks: u32) -> Self {
        Item {
            bytes,
            chunks,
            dup: None,
        }
    }

    pub fn dup(bytes: u32, chunks: u32, container: u64, vaddr: u64, tail: u64) -> Self {
        Item {
            bytes,
            chunks,
            dup: Some(Dup {
                container,
                vaddr,
                tail,
            }),
        }
    }
}

pub trait Policy: Send {
    /// Takes the next unit; appends the decisions that became final (true =
    /// rewrite), for the oldest undecided units, in stream order.
    fn push(&mut self, item: Item, out: &mut Vec<bool>);
    /// Decides everything still pending.
    fn finish(&mut self, out: &mut Vec<bool>);
}

/// No rewriting: every duplicate is referenced where it is.
pub struct NoRewrite;

impl Policy for NoRewrite {
    fn push(&mut self, _item: Item, out: &mut Vec<bool>) {
        out.push(false);
    }

    fn finish(&mut self, _out: &mut Vec<bool>) {}
}

impl RewriteSettings {
    /// Builds the policy. `container_bytes` sizes segments and windows;
    /// `hint` describes the series' previous version for FCRC and LBW budgets.
    pub fn build(&self, container_bytes: u64, hint: VersionHint) -> Box<dyn Policy> {
        let mib = |m: f64| (m * (1u64 << 20) as f64) as u64;
        match *self {
            RewriteSettings::None => Box::new(NoRewrite),
            RewriteSettings::Capping { segment, level } => Box::new(Capping::new(
                u64::from(segment) * container_bytes,
                level as usize,
            )),
            RewriteSettings::Cbr {
                stream_context_mib,
                disk_context_mib,
                min_utility,
                limit,
            } => Box::new(Cbr::new(
                mib(stream_context_mib),
                mib(disk_context_mib),
                min_utility,
                limit,
            )),
            RewriteSettings::Fcrc { segment, loss, cap } => Box::new(Fcrc::new(
                u64::from(segment) * container_bytes,
                loss,
                cap,
                hint,
            )),
            RewriteSettings::Lbw { window, loss, cap } => {
                Box::new(Lbw::new(window as usize, container_bytes, loss, cap, hint))
            }
        }
    }
}

/// Chunks per old container (CNRC) over a set of items.
pub(crate) fn cnrc<'a>(
    items: impl Iterator<Item = &'a Item>,
) -> std::collections::HashMap<u64, u64> {
    let mut m = std::collections::HashMap::new();
    for it in items {
        if let Some(d) = it.dup {
            *m.entry(d.container).or_insert(0) += u64::from(it.chunks);
        }
    }
    m
}

/// The rewrite budget bound (Cao et al. §3.2): adding container reference
/// counts from low to high until their sum would pass `limit` chunks, the
/// threshold below which every container's duplicates can be rewritten.
pub(crate) fn rc_rw(mut counts: Vec<u64>, limit: f64) -> f64 {
    counts.sort_unstable();
    let mut sum = 0f64;
    for c in &counts {
        if sum + *c as f64 > limit {
            return *c as f64;
        }
        sum += *c as f64;
    }
    counts.last().map(|c| *c as f64 + 1.0).unwrap_or(0.0)
}

/// The container-read bound: ranking containers by reference count from high
/// to low, the count of the `allowed`-th one (0 when all fit).
pub(crate) fn rc_reads(mut counts: Vec<u64>, allowed: f64) -> f64 {
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let allowed = allowed.floor();
    if allowed < 1.0 {
        return counts.first().map(|c| *c as f64 + 1.0).unwrap_or(0.0);
    }
    match counts.get(allowed as usize) {
        Some(c) => *c as f64 + 1.0,
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_full_backup_does_not_size_the_next_budget() {
        let first = VersionHint {
            chunks: 1000,
            unique_chunks: 990,
            logical_bytes: 8 << 20,
        };
        let increment = VersionHint {
            chunks: 1000,
            unique_chunks: 30,
            logical_bytes: 8 << 20,
        };
        assert!(!first.estimates_an_increment());
        assert!(increment.estimates_an_increment());
        assert!(!VersionHint::default().estimates_an_increment());
    }

    #[test]
    fn bounds_follow_the_paper() {
        // Containers referenced 1, 2, 3, 10 and 20 times; may rewrite 6 chunks:
        // 1 + 2 + 3 fit, so containers below 10 are rewritable.
        assert_eq!(rc_rw(vec![20, 3, 10, 1, 2], 6.0), 10.0);
        assert_eq!(rc_rw(vec![20, 3, 10, 1, 2], 5.9), 3.0);
        assert_eq!(rc_rw(vec![1, 2], 100.0), 3.0);
        // At most 2 container reads: the third highest (3) and below must go.
        assert_eq!(rc_reads(vec![20, 3, 10, 1, 2], 2.0), 4.0);
        assert_eq!(rc_reads(vec![20, 3, 10, 1, 2], 9.0), 0.0);
    }

    #[test]
    fn settings_validate_and_round_trip() {
        for p in ["none", "capping", "cbr", "fcrc", "lbw"] {
            let s = RewriteSettings::default_for(p).unwrap();
            s.validate().unwrap();
            let j = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<RewriteSettings>(&j).unwrap(), s);
        }
        assert!(RewriteSettings::default_for("har").is_err());
        let bad = RewriteSettings::Fcrc {
            segment: 5,
            loss: 1.5,
            cap: 4,
        };
        assert!(bad.validate().unwrap_err().to_string().contains("fraction"));
    }
}
