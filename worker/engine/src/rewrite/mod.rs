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

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

/// A series' rewrite settings (stored with the series, chosen per backup).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "policy", rename_all = "lowercase")]
pub enum RewriteSettings {
    #[default]
    None,
    Capping {
        /// Segment size in containers.
        segment: u32,
        /// Containers a segment may read (the capping level T).
        level: u32,
    },
    Cbr {
        stream_context_mib: f64,
        disk_context_mib: f64,
        /// Minimal rewrite utility (0..1).
        min_utility: f64,
        /// Rewrite limit as a fraction of chunks seen so far.
        limit: f64,
    },
    Fcrc {
        segment: u32,
        /// Dedup-ratio loss budget (0..1).
        loss: f64,
        /// Old-container reads allowed per segment.
        cap: u32,
    },
    Lbw {
        /// Window size in containers.
        window: u32,
        loss: f64,
        cap: u32,
    },
}

impl RewriteSettings {
    pub fn name(&self) -> &'static str {
        match self {
            RewriteSettings::None => "none",
            RewriteSettings::Capping { .. } => "capping",
            RewriteSettings::Cbr { .. } => "cbr",
            RewriteSettings::Fcrc { .. } => "fcrc",
            RewriteSettings::Lbw { .. } => "lbw",
        }
    }

    /// The defaults of a policy by name.
    pub fn default_for(name: &str) -> Result<Self> {
        Ok(match name {
            "none" => RewriteSettings::None,
            "capping" => RewriteSettings::Capping {
                segment: 5,
                level: 4,
            },
            "cbr" => RewriteSettings::Cbr {
                stream_context_mib: 5.0,
                disk_context_mib: 2.0,
                min_utility: 0.7,
                limit: 0.05,
            },
            "fcrc" => RewriteSettings::Fcrc {
                segment: 5,
                loss: 0.07,
                cap: 4,
            },
            "lbw" => RewriteSettings::Lbw {
                window: 8,
                loss: 0.07,
                cap: 4,
            },
            other => {
                return Err(Error::Invalid(format!(
                    "rewrite policy {other:?}: expected none, capping, cbr, fcrc or lbw"
                )))
            }
        })
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Invalid(format!("{} rewrite: {m}", self.name())));
        match *self {
            RewriteSettings::None => Ok(()),
            RewriteSettings::Capping { segment, level } => {
                if segment == 0 || level == 0 {
                    return bad("segment and level must be at least 1");
                }
                Ok(())
            }
            RewriteSettings::Cbr {
                stream_context_mib,
                disk_context_mib,
                min_utility,
                limit,
            } => {
                if !(stream_context_mib > 0.0 && disk_context_mib > 0.0) {
                    return bad("contexts must be positive");
                }
                if !(0.0..=1.0).contains(&min_utility) || !(0.0..=1.0).contains(&limit) {
                    return bad("min utility and limit are fractions between 0 and 1");
                }
                Ok(())
            }
            RewriteSettings::Fcrc { segment, loss, cap }
            | RewriteSettings::Lbw {
                window: segment,
                loss,
                cap,
            } => {
                if segment == 0 || cap == 0 {
                    return bad("segment/window and cap must be at least 1");
                }
                if !(0.0..1.0).contains(&loss) {
                    return bad("the dedup-ratio loss is a fraction between 0 and 1");
                }
                Ok(())
            }
        }
    }

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

/// What the series' previous version looked like: FCRC and LBW size their
/// rewrite budgets from it (Cao et al. use the previous version's unique
/// chunks as the estimate for the current one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionHint {
    pub chunks: u64,
    pub unique_chunks: u64,
    pub logical_bytes: u64,
}

impl VersionHint {
    /// Whether the previous version's unique chunks estimate this one's, as
    /// FCRC's budget assumes. Not when most of it was new (a series' first
    /// backup, or a complete change): an incremental version after a first
    /// full backup would get a budget the size of the whole first version.
    /// The budget then comes from this backup's own running counts, the
    /// paper's estimate for streams without a previous version.
    pub fn estimates_an_increment(&self) -> bool {
        self.unique_chunks > 0 && self.logical_bytes > 0 && self.unique_chunks * 2 <= self.chunks
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
