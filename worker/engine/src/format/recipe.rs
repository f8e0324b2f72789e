//! Recipes: the ordered references that rebuild a version.
//!
//! A recipe is a sequence of *chunk positions*: every chunk of the version,
//! zero chunks included, occupies one position. Entries cover runs of positions:
//!
//! - `Units { first, count }` — live form: whole units `first..first+count`
//!   (consecutive ids), each contributing all of its chunks;
//! - `Zero { len, count }` — `count` all-zero chunks of `len` bytes, never stored;
//! - `Direct { unit, first, count }` — archival form: chunks `first..first+count`
//!   of one unit;
//! - `Indirect { version, first, count }` — archival form: positions
//!   `first..first+count` of a newer version of the same series.
//!
//! Encoded as tagged varints (unit ids as deltas), merged into runs, and split
//! into parts of at most [`PART_BYTES`], each sealed with a CRC32C.

use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_ivarint, put_uvarint, seal_crc, Reader};

pub const PART_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Units {
        first: u64,
        count: u64,
    },
    Zero {
        len: u32,
        count: u64,
    },
    Direct {
        unit: u64,
        first: u32,
        count: u32,
    },
    Indirect {
        version: u32,
        first: u64,
        count: u64,
    },
}

impl Entry {
    /// Chunk positions the entry covers at least (a unit holds one chunk or more).
    pub fn min_positions(&self) -> u64 {
        match *self {
            Entry::Units { count, .. } | Entry::Zero { count, .. } => count,
            Entry::Direct { count, .. } => u64::from(count),
            Entry::Indirect { count, .. } => count,
        }
    }
}

/// The largest unit id a recipe holds: ids are encoded as i64 deltas.
const MAX_UNIT: u64 = i64::MAX as u64;

const TAG_UNITS: u8 = 1;
const TAG_ZERO: u8 = 2;
const TAG_DIRECT: u8 = 3;
const TAG_INDIRECT: u8 = 4;

/// Builds a recipe, merging adjacent entries into runs as they arrive.
#[derive(Default)]
pub struct RecipeBuilder {
    pending: Option<Entry>,
    parts: Vec<Vec<u8>>,
    cur: Vec<u8>,
    last_unit: u64,
    entries: u64,
}

impl RecipeBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push_unit(&mut self, unit: u64) {
        self.push(Entry::Units {
            first: unit,
            count: 1,
        });
    }

    pub fn push_zero(&mut self, len: u32) {
        self.push(Entry::Zero { len, count: 1 });
    }

    pub fn push(&mut self, e: Entry) {
        if let Some(p) = self.pending.as_mut() {
            if merge(p, &e) {
                return;
            }
        }
        if let Some(p) = self.pending.replace(e) {
            self.emit(p);
        }
    }

    fn emit(&mut self, e: Entry) {
        self.entries += 1;
        let out = &mut self.cur;
        match e {
            Entry::Units { first, count } => {
                out.push(TAG_UNITS);
                put_ivarint(out, first as i64 - self.last_unit as i64);
                put_uvarint(out, count);
                self.last_unit = first + count - 1;
            }
            Entry::Zero { len, count } => {
                out.push(TAG_ZERO);
                put_uvarint(out, u64::from(len));
                put_uvarint(out, count);
            }
            Entry::Direct { unit, first, count } => {
                out.push(TAG_DIRECT);
                put_ivarint(out, unit as i64 - self.last_unit as i64);
                put_uvarint(out, u64::from(first));
                put_uvarint(out, u64::from(count));
                self.last_unit = unit;
            }
            Entry::Indirect {
                version,
                first,
                count,
            } => {
                out.push(TAG_INDIRECT);
                put_uvarint(out, u64::from(version));
                put_uvarint(out, first);
                put_uvarint(out, count);
            }
        }
        if self.cur.len() >= PART_BYTES - 64 {
            self.cut_part();
        }
    }

    fn cut_part(&mut self) {
        let mut p = std::mem::take(&mut self.cur);
        seal_crc(&mut p);
        self.parts.push(p);
        // Deltas restart in each part so parts decode independently.
        self.last_unit = 0;
    }

    /// Finishes the recipe: its sealed parts (at least one).
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        if let Some(p) = self.pending.take() {
            self.emit(p);
        }
        if !self.cur.is_empty() || self.parts.is_empty() {
            self.cut_part();
        }
        self.parts
    }
}

fn merge(p: &mut Entry, e: &Entry) -> bool {
    match (p, e) {
        (
            Entry::Units { first, count },
            Entry::Units {
                first: f2,
                count: c2,
            },
        ) if *first + *count == *f2 => {
            *count += c2;
            true
        }
        // Zero runs are not contiguous ranges: their sum may not fit in a count.
        (Entry::Zero { len, count }, Entry::Zero { len: l2, count: c2 })
            if len == l2 && count.checked_add(*c2).is_some() =>
        {
            *count += c2;
            true
        }
        (
            Entry::Direct { unit, first, count },
            Entry::Direct {
                unit: u2,
                first: f2,
                count: c2,
            },
        ) if unit == u2 && *first + *count == *f2 => {
            *count += c2;
            true
        }
        (
            Entry::Indirect {
                version,
                first,
                count,
            },
            Entry::Indirect {
                version: v2,
                first: f2,
                count: c2,
            },
        ) if version == v2 && *first + *count == *f2 => {
            *count += c2;
            true
        }
        _ => false,
    }
}

/// Decodes one sealed part. `what` names the version in errors.
pub fn decode_part(what: &str, part: &[u8]) -> Result<Vec<Entry>> {
    let bad = |d: &str| corrupt_meta(format!("recipe of {what}"), d.to_string());
    let body = open_crc(part).ok_or_else(|| bad("checksum mismatch"))?;
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    let mut last_unit: u64 = 0;
    let trunc = || bad("truncated entry");
    while !r.is_empty() {
        let e = match r.u8().ok_or_else(trunc)? {
            TAG_UNITS => {
                let first = last_unit
                    .checked_add_signed(r.ivarint().ok_or_else(trunc)?)
                    .ok_or_else(|| bad("unit id out of range"))?;
                let count = r.uvarint().ok_or_else(trunc)?;
                if count == 0 {
                    return Err(bad("empty run"));
                }
                // Unit ids are below 2^63: ids are deltas of i64 (and counted from 0).
                let end = first
                    .checked_add(count)
                    .filter(|&end| end <= MAX_UNIT + 1)
                    .ok_or_else(|| bad("a run of units out of range"))?;
                last_unit = end - 1;
                Entry::Units { first, count }
            }
            TAG_ZERO => {
                let len = u32::try_from(r.uvarint().ok_or_else(trunc)?)
                    .map_err(|_| bad("zero length"))?;
                let count = r.uvarint().ok_or_else(trunc)?;
                Entry::Zero { len, count }
            }
            TAG_DIRECT => {
                let unit = last_unit
                    .checked_add_signed(r.ivarint().ok_or_else(trunc)?)
                    .ok_or_else(|| bad("unit id out of range"))?;
                let first = u32::try_from(r.uvarint().ok_or_else(trunc)?)
                    .map_err(|_| bad("chunk index"))?;
                let count = u32::try_from(r.uvarint().ok_or_else(trunc)?)
                    .map_err(|_| bad("chunk count"))?;
                if unit > MAX_UNIT {
                    return Err(bad("unit id out of range"));
                }
                // Chunk indices are u32: the run ends at the largest one at most.
                first
                    .checked_add(count)
                    .ok_or_else(|| bad("a run of chunks out of range"))?;
                last_unit = unit;
                Entry::Direct { unit, first, count }
            }
            TAG_INDIRECT => {
                let version =
                    u32::try_from(r.uvarint().ok_or_else(trunc)?).map_err(|_| bad("version"))?;
                let first = r.uvarint().ok_or_else(trunc)?;
                let count = r.uvarint().ok_or_else(trunc)?;
                first
                    .checked_add(count)
                    .ok_or_else(|| bad("a run of positions out of range"))?;
                Entry::Indirect {
                    version,
                    first,
                    count,
                }
            }
            t => return Err(bad(&format!("unknown entry tag {t}"))),
        };
        out.push(e);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            (0u64..1000, 1u64..5).prop_map(|(first, count)| Entry::Units { first, count }),
            (1u32..70_000, 1u64..3).prop_map(|(len, count)| Entry::Zero { len, count }),
            (0u64..1000, 0u32..100, 1u32..9).prop_map(|(unit, first, count)| Entry::Direct {
                unit,
                first,
                count
            }),
            (1u32..9, 0u64..10_000, 1u64..9).prop_map(|(version, first, count)| Entry::Indirect {
                version,
                first,
                count
            }),
        ]
    }

    /// Expands entries to single positions so merged and unmerged forms compare.
    fn expand(es: &[Entry]) -> Vec<Entry> {
        let mut out = Vec::new();
        for e in es {
            match *e {
                Entry::Units { first, count } => (0..count).for_each(|i| {
                    out.push(Entry::Units {
                        first: first + i,
                        count: 1,
                    })
                }),
                Entry::Zero { len, count } => {
                    (0..count).for_each(|_| out.push(Entry::Zero { len, count: 1 }))
                }
                Entry::Direct { unit, first, count } => (0..count).for_each(|i| {
                    out.push(Entry::Direct {
                        unit,
                        first: first + i,
                        count: 1,
                    })
                }),
                Entry::Indirect {
                    version,
                    first,
                    count,
                } => (0..count).for_each(|i| {
                    out.push(Entry::Indirect {
                        version,
                        first: first + i,
                        count: 1,
                    })
                }),
            }
        }
        out
    }

    proptest! {
        #[test]
        fn recipes_round_trip(es in proptest::collection::vec(entry(), 0..400)) {
            let mut b = RecipeBuilder::new();
            for e in &es { b.push(*e); }
            let parts = b.finish();
            let mut back = Vec::new();
            for p in &parts { back.extend(decode_part("t", p).unwrap()); }
            prop_assert_eq!(expand(&back), expand(&es));
        }
    }

    #[test]
    fn consecutive_units_merge_into_one_run() {
        let mut b = RecipeBuilder::new();
        for u in 100..200 {
            b.push_unit(u);
        }
        let parts = b.finish();
        assert_eq!(parts.len(), 1);
        assert!(parts[0].len() < 12, "{} bytes for one run", parts[0].len());
        assert_eq!(
            decode_part("t", &parts[0]).unwrap(),
            vec![Entry::Units {
                first: 100,
                count: 100
            }]
        );
    }

    #[test]
    fn large_recipes_split_into_parts_that_decode_alone() {
        let mut b = RecipeBuilder::new();
        let n = 600_000u64;
        for i in 0..n {
            b.push_unit(i * 7919 % 1_000_003);
        }
        let parts = b.finish();
        assert!(parts.len() > 1);
        let total: usize = parts
            .iter()
            .map(|p| decode_part("t", p).unwrap().len())
            .sum();
        assert_eq!(total as u64, n);
    }

    #[test]
    fn zero_runs_too_long_for_one_count_stay_apart() {
        let half = (1u64 << 63) + 1;
        let mut b = RecipeBuilder::new();
        b.push(Entry::Zero {
            len: 4096,
            count: half,
        });
        b.push(Entry::Zero {
            len: 4096,
            count: half,
        });
        let back = decode_part("t", &b.finish()[0]).unwrap();
        let total: u128 = back
            .iter()
            .map(|e| match e {
                Entry::Zero { count, .. } => u128::from(*count),
                _ => 0,
            })
            .sum();
        assert_eq!(total, 2 * u128::from(half), "{back:?}");
    }

    #[test]
    fn runs_past_the_largest_id_are_refused() {
        let sealed = |body: &[u8]| {
            let mut p = body.to_vec();
            seal_crc(&mut p);
            p
        };
        // Units i64::MAX.. (count 2^63 + 5): the run's last id is past u64::MAX.
        let mut units = vec![TAG_UNITS];
        put_ivarint(&mut units, i64::MAX);
        put_uvarint(&mut units, (1 << 63) + 5);
        // Chunks u32::MAX - 1.. (count 3) of unit 1: past the largest chunk index.
        let mut direct = vec![TAG_DIRECT];
        put_ivarint(&mut direct, 1);
        put_uvarint(&mut direct, u64::from(u32::MAX - 1));
        put_uvarint(&mut direct, 3);
        // Positions u64::MAX.. of version 2.
        let mut indirect = vec![TAG_INDIRECT];
        put_uvarint(&mut indirect, 2);
        put_uvarint(&mut indirect, u64::MAX);
        put_uvarint(&mut indirect, 2);
        for body in [units, direct, indirect] {
            let e = decode_part("default/db version 3", &sealed(&body))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("default/db version 3") && e.contains("range"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_flipped_byte_names_the_version() {
        let mut b = RecipeBuilder::new();
        b.push_unit(5);
        let mut parts = b.finish();
        parts[0][1] ^= 1;
        let e = decode_part("default/db version 3", &parts[0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("default/db version 3") && e.contains("checksum"),
            "{e}"
        );
    }
}
