//! A stored unit's record: which container holds its chunks, at what offsets.

use rustc_hash::FxHashSet;

use crate::config::DedupUnit;
use crate::error::{corrupt_meta, Result};
use crate::format::codec::{open_crc, put_uvarint, seal_crc, Reader};
use crate::format::container::{ChunkEntry, ContainerId};
use crate::format::fp::Fp;

/// A stored unit: a run of chunks in one container's data space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitRecord {
    pub kind: DedupUnit,
    /// The fingerprint new backups dedup against (segment or chunk fp).
    pub fp: Fp,
    pub container: ContainerId,
    pub vbase: u64,
    /// Set when chunks were removed (reverse dedup, compaction): an incomplete
    /// unit is no longer a dedup target.
    pub trimmed: bool,
    /// The dedup domain it was written for (`store::domain`): a hash of the writer's
    /// namespace, or 0 when written with domains off. Only a backup of that domain
    /// (or of a series that references the unit) dedups against it.
    pub domain: u64,
    pub chunks: Vec<ChunkEntry>,
}

impl UnitRecord {
    pub fn stored_vbytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.stored_len()).sum()
    }

    pub fn logical_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| u64::from(c.len)).sum()
    }

    /// Where chunk `idx` starts in its container's data space.
    pub fn chunk_vaddr(&self, idx: usize) -> u64 {
        self.vbase
            + self.chunks[..idx]
                .iter()
                .map(|c| c.stored_len())
                .sum::<u64>()
    }

    /// The distinct other units this unit's (`id`'s) live links point into: the units
    /// whose `links` counts it holds. A link to an earlier chunk of the same unit
    /// (a chunk repeated inside one segment) counts nowhere: the unit cannot
    /// outlive itself.
    pub fn link_targets(&self, id: u64) -> FxHashSet<u64> {
        self.chunks
            .iter()
            .filter_map(|c| c.link_target().map(|l| l.0))
            .filter(|t| *t != id)
            .collect()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(72 + self.chunks.len() * 36);
        // Format 1 has no domain: a store without domains keeps writing what every
        // earlier release reads.
        v.push(if self.domain == 0 { 1 } else { 2 });
        v.push(match self.kind {
            DedupUnit::Segment => 0,
            DedupUnit::Chunk => 1,
        });
        v.push(u8::from(self.trimmed));
        v.extend_from_slice(&self.fp.0);
        if self.domain != 0 {
            v.extend_from_slice(&self.domain.to_le_bytes());
        }
        put_uvarint(&mut v, self.container.0);
        put_uvarint(&mut v, self.vbase);
        put_uvarint(&mut v, self.chunks.len() as u64);
        for c in &self.chunks {
            c.encode_into(&mut v);
        }
        seal_crc(&mut v);
        v
    }

    /// The fingerprint the index lists this unit under ([`Fp::in_domain`]).
    pub fn index_fp(&self) -> Fp {
        self.fp.in_domain(self.domain)
    }

    /// What the index needs of a stored record, without its chunk list: its kind, whether
    /// it is trimmed, and the fingerprint it is indexed under. The checksum is verified all
    /// the same.
    pub fn decode_key(id: u64, b: &[u8]) -> Result<(DedupUnit, bool, Fp)> {
        let mut r = Reader::new(open_crc(b).ok_or_else(|| bad_unit(id))?);
        let h = read_head(&mut r).ok_or_else(|| bad_unit(id))?;
        Ok((h.kind, h.trimmed, h.fp.in_domain(h.domain)))
    }

    pub fn decode(id: u64, b: &[u8]) -> Result<Self> {
        let bad = || bad_unit(id);
        let body = open_crc(b).ok_or_else(bad)?;
        let mut r = Reader::new(body);
        let Head {
            kind,
            trimmed,
            fp,
            domain,
        } = read_head(&mut r).ok_or_else(bad)?;
        let container = ContainerId(r.uvarint().ok_or_else(bad)?);
        let vbase = r.uvarint().ok_or_else(bad)?;
        let n = r.uvarint().ok_or_else(bad)? as usize;
        let mut chunks = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            chunks.push(ChunkEntry::decode_from(&mut r).ok_or_else(bad)?);
        }
        if !r.is_empty() {
            return Err(bad());
        }
        Ok(UnitRecord {
            kind,
            fp,
            container,
            vbase,
            trimmed,
            domain,
            chunks,
        })
    }
}

fn bad_unit(id: u64) -> crate::error::Error {
    corrupt_meta(format!("unit {id}"), "checksum or format mismatch")
}

/// A record's head: kind, trimmed flag, fingerprint and (format 2) dedup domain.
struct Head {
    kind: DedupUnit,
    trimmed: bool,
    fp: Fp,
    domain: u64,
}

fn read_head(r: &mut Reader<'_>) -> Option<Head> {
    let format = r.u8()?;
    if format != 1 && format != 2 {
        return None;
    }
    let kind = match r.u8()? {
        0 => DedupUnit::Segment,
        1 => DedupUnit::Chunk,
        _ => return None,
    };
    let trimmed = r.u8()? != 0;
    let fp = Fp(r.array()?);
    let domain = match format {
        1 => 0,
        _ => u64::from_le_bytes(r.array()?),
    };
    // Format 2 exists for a nonzero domain: a zero there is no record this code wrote.
    if format == 2 && domain == 0 {
        return None;
    }
    Some(Head {
        kind,
        trimmed,
        fp,
        domain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_record_round_trips_and_detects_corruption() {
        let u = UnitRecord {
            kind: DedupUnit::Segment,
            fp: Fp::of(b"seg"),
            container: ContainerId::new(3, 9),
            vbase: 123_456,
            trimmed: false,
            domain: 0,
            chunks: vec![
                ChunkEntry::new(0, 8000, Fp::of(b"a")),
                ChunkEntry::new(
                    crate::format::container::CHUNK_ZERO,
                    65536,
                    Fp::of(&[0; 65536]),
                ),
                ChunkEntry {
                    flags: crate::format::container::CHUNK_LINK,
                    len: 100,
                    fp: Fp::of(b"l"),
                    link: Some((7, 3)),
                },
            ],
        };
        let mut b = u.encode();
        assert_eq!(UnitRecord::decode(1, &b).unwrap(), u);
        assert_eq!(u.stored_vbytes(), 8000);
        b[10] ^= 4;
        let e = UnitRecord::decode(1, &b).unwrap_err().to_string();
        assert!(e.contains("unit 1"), "{e}");
    }

    #[test]
    fn a_domain_is_written_only_when_set_and_reads_back() {
        let plain = UnitRecord {
            kind: DedupUnit::Chunk,
            fp: Fp::of(b"c"),
            container: ContainerId::new(1, 2),
            vbase: 0,
            trimmed: true,
            domain: 0,
            chunks: vec![ChunkEntry::new(0, 10, Fp::of(b"c"))],
        };
        let b = plain.encode();
        assert_eq!(b[0], 1, "a record without a domain keeps format 1");
        let tagged = UnitRecord {
            domain: 0xfeed_beef,
            ..plain.clone()
        };
        let t = tagged.encode();
        assert_eq!((t[0], t.len()), (2, b.len() + 8));
        assert_eq!(UnitRecord::decode(4, &t).unwrap(), tagged);
        assert_eq!(
            UnitRecord::decode_key(4, &t).unwrap(),
            (DedupUnit::Chunk, true, Fp::of(b"c").in_domain(0xfeed_beef))
        );
        assert_eq!(UnitRecord::decode_key(4, &b).unwrap().2, Fp::of(b"c"));
        assert_ne!(Fp::of(b"c").in_domain(1), Fp::of(b"c").in_domain(2));
        // Format 2 with a zero domain is no record the encoder writes.
        let mut z = plain.encode();
        z.truncate(z.len() - 4);
        z[0] = 2;
        z.splice(35..35, [0u8; 8]);
        seal_crc(&mut z);
        assert!(UnitRecord::decode(4, &z).is_err());
    }
}
