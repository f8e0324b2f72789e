//! Reference counts of units, kept in blocks of [`REFS_BLOCK`] units.

use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_uvarint, seal_crc, Reader};

/// Reference counts of a unit: live recipes that reference it whole,
/// archival recipes that reference some of its chunks directly, and other
/// units of the same backup whose duplicate chunks link to its chunks (links
/// inside one unit count nowhere). A unit with all three at zero is
/// unreachable and is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refs {
    pub live: u32,
    pub arch: u32,
    pub links: u32,
}

impl Refs {
    pub fn is_zero(&self) -> bool {
        self.live == 0 && self.arch == 0 && self.links == 0
    }

    /// The per-unit form written before blocks (tests write it to check the
    /// migration to blocks).
    #[cfg(test)]
    pub(crate) fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.live.to_le_bytes());
        b[4..8].copy_from_slice(&self.arch.to_le_bytes());
        b[8..].copy_from_slice(&self.links.to_le_bytes());
        b
    }

    pub fn decode(id: u64, b: &[u8]) -> Result<Self> {
        // 8 bytes: written before links existed (none link to the unit).
        if b.len() != 12 && b.len() != 8 {
            return Err(corrupt_meta(
                format!("reference counts of unit {id}"),
                "bad length",
            ));
        }
        let n = |i: usize| {
            b.get(i..i + 4)
                .map_or(0, |f| u32::from_le_bytes(f.try_into().unwrap()))
        };
        Ok(Refs {
            live: n(0),
            arch: n(4),
            links: n(8),
        })
    }
}

/// Units per block of reference counts. A chunk-mode backup changes one
/// count per distinct chunk it references (12.7k for a kube version), mostly
/// runs of consecutive ids: kept per unit, that was 12.7k records in the
/// commit's reads and writes, in the log the next command replays and in the
/// tables it flushes; in blocks it is a few hundred.
pub const REFS_BLOCK: u64 = 64;

/// The reference counts of [`REFS_BLOCK`] consecutive units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefsBlock {
    slots: [Refs; REFS_BLOCK as usize],
}

impl Default for RefsBlock {
    fn default() -> Self {
        RefsBlock {
            slots: [Refs::default(); REFS_BLOCK as usize],
        }
    }
}

impl RefsBlock {
    pub fn get(&self, id: u64) -> Refs {
        self.slots[(id % REFS_BLOCK) as usize]
    }

    pub fn set(&mut self, id: u64, r: Refs) {
        self.slots[(id % REFS_BLOCK) as usize] = r;
    }

    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Refs::is_zero)
    }

    /// (unit id, counts) of the units of block `block` with any count.
    pub fn units(&self, block: u64) -> impl Iterator<Item = (u64, Refs)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_zero())
            .map(move |(i, r)| (block * REFS_BLOCK + i as u64, *r))
    }

    /// Each unit with a count: its slot (u8) and live, archival and link
    /// counts (uvarints), slots ascending; CRC32C-sealed.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, r) in self.slots.iter().enumerate().filter(|(_, r)| !r.is_zero()) {
            out.push(i as u8);
            put_uvarint(&mut out, u64::from(r.live));
            put_uvarint(&mut out, u64::from(r.arch));
            put_uvarint(&mut out, u64::from(r.links));
        }
        seal_crc(&mut out);
        out
    }

    pub fn decode(block: u64, b: &[u8]) -> Result<Self> {
        // Unit ids are u64: the last block is the one holding u64::MAX.
        if block > u64::MAX / REFS_BLOCK {
            return Err(corrupt_meta(
                "reference counts",
                format!("block {block} is past the largest unit id"),
            ));
        }
        let bad = |why: &str| {
            let lo = block * REFS_BLOCK;
            corrupt_meta(
                format!("reference counts of units {lo}..={}", lo + (REFS_BLOCK - 1)),
                why.to_string(),
            )
        };
        let body = open_crc(b).ok_or_else(|| bad("checksum mismatch"))?;
        let mut r = Reader::new(body);
        let mut out = RefsBlock::default();
        let mut next = 0usize;
        let count = |v: Option<u64>| v.and_then(|v| u32::try_from(v).ok());
        while !r.is_empty() {
            let slot = r.u8().ok_or_else(|| bad("truncated"))? as usize;
            if slot < next || slot >= REFS_BLOCK as usize {
                return Err(bad("slots out of order"));
            }
            let (live, arch, links) = (
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
                count(r.uvarint()).ok_or_else(|| bad("bad count"))?,
            );
            out.slots[slot] = Refs { live, arch, links };
            next = slot + 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_blocks_round_trip_and_detect_corruption() {
        let mut r = RefsBlock::default();
        let c = |live, arch, links| Refs { live, arch, links };
        r.set(128, c(1, 0, 0));
        r.set(130, c(0, 3, 0));
        r.set(191, c(u32::MAX, 7, 2));
        let b = r.encode();
        assert_eq!(RefsBlock::decode(2, &b).unwrap(), r);
        let units: Vec<(u64, Refs)> = r.units(2).collect();
        assert_eq!(
            units,
            vec![
                (128, c(1, 0, 0)),
                (130, c(0, 3, 0)),
                (191, c(u32::MAX, 7, 2))
            ]
        );
        for i in 0..b.len() {
            let mut bad = b.clone();
            bad[i] ^= 0x10;
            let e = RefsBlock::decode(2, &bad).unwrap_err().to_string();
            assert!(e.contains("units 128..=191"), "{e}");
        }
        assert!(RefsBlock::default().is_empty() && !r.is_empty());
    }

    #[test]
    fn refs_round_trip_and_read_counts_written_before_links() {
        let r = Refs {
            live: 3,
            arch: 1,
            links: 2,
        };
        assert_eq!(Refs::decode(1, &r.encode()).unwrap(), r);
        let old = Refs::decode(1, &r.encode()[..8]).unwrap();
        assert_eq!((old.live, old.arch, old.links), (3, 1, 0));
        assert!(Refs::decode(1, &r.encode()[..10]).is_err());
    }
}
