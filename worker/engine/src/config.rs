//! Store-wide settings fixed at `init`: chunking parameters (every series of a
//! store must chunk alike for global dedup to work), container size and
//! compression. Persisted in the metadata store as JSON.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeRange {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

impl SizeRange {
    fn validate(&self, what: &str) -> Result<()> {
        if !(self.min > 0 && self.min <= self.avg && self.avg <= self.max) {
            return Err(Error::Invalid(format!(
                "{what} sizes must satisfy 0 < min <= avg <= max (got {}/{}/{})",
                self.min, self.avg, self.max
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "codec", content = "level")]
pub enum Compression {
    None,
    Zstd(i32),
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd(l) => write!(f, "zstd:{l}"),
        }
    }
}

impl FromStr for Compression {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "compression {s:?}: expected `none`, `zstd` or `zstd:LEVEL` (1..=19)"
            ))
        };
        match s {
            "none" => Ok(Compression::None),
            "zstd" => Ok(Compression::Zstd(3)),
            _ => {
                let level = s.strip_prefix("zstd:").ok_or_else(bad)?;
                let level: i32 = level.parse().map_err(|_| bad())?;
                if !(1..=19).contains(&level) {
                    return Err(bad());
                }
                Ok(Compression::Zstd(level))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// On-disk format version of this store.
    pub format: u32,
    /// Content-defined chunks (FastCDC v2020, normalisation level 1).
    pub chunk: SizeRange,
    /// Segments: runs of chunks closed at a chunk whose fingerprint matches a
    /// wider mask (see `chunker::Segmenter`).
    pub segment: SizeRange,
    /// Uncompressed bytes of chunk data per container. Capacity is counted before
    /// compression so the speed factor (MiB restored per container read) is
    /// comparable with the papers, which do not compress.
    pub container_bytes: u64,
    /// Target uncompressed size of one compression block inside a container.
    pub block_bytes: u32,
    pub compression: Compression,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            format: 1,
            chunk: SizeRange {
                min: 2 * KIB as u32,
                avg: 8 * KIB as u32,
                max: 64 * KIB as u32,
            },
            segment: SizeRange {
                min: 256 * KIB as u32,
                avg: MIB as u32,
                max: 4 * MIB as u32,
            },
            container_bytes: 4 * MIB,
            block_bytes: 128 * KIB as u32,
            compression: Compression::Zstd(3),
        }
    }
}

impl StoreConfig {
    pub fn validate(&self) -> Result<()> {
        self.chunk.validate("chunk")?;
        self.segment.validate("segment")?;
        if self.chunk.min < 64 || self.chunk.max > 16 * MIB as u32 || self.chunk.avg < 256 {
            return Err(Error::Invalid(
                "chunk sizes must lie between 64 bytes (min), 256 bytes (avg) and 16 MiB (max)"
                    .into(),
            ));
        }
        if self.segment.avg < self.chunk.avg {
            return Err(Error::Invalid(
                "the average segment must be at least one average chunk".into(),
            ));
        }
        if self.container_bytes < MIB || self.container_bytes > 256 * MIB {
            return Err(Error::Invalid(
                "container size must be between 1 and 256 MiB".into(),
            ));
        }
        if self.block_bytes < 64 * KIB as u32 || u64::from(self.block_bytes) > self.container_bytes
        {
            return Err(Error::Invalid(
                "compression blocks must be at least 64 KiB and at most one container".into(),
            ));
        }
        Ok(())
    }
}

/// The dedup unit of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DedupUnit {
    /// RevDedup's inline step: whole segments (~1 MiB) are deduplicated.
    #[default]
    Segment,
    /// Conventional inline dedup of every chunk: the baseline.
    Chunk,
}

impl fmt::Display for DedupUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DedupUnit::Segment => "segment",
            DedupUnit::Chunk => "chunk",
        })
    }
}

impl FromStr for DedupUnit {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "segment" => Ok(DedupUnit::Segment),
            "chunk" => Ok(DedupUnit::Chunk),
            _ => Err(Error::Invalid(format!(
                "unit {s:?}: expected `segment` or `chunk`"
            ))),
        }
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_parses() {
        assert_eq!("none".parse::<Compression>().unwrap(), Compression::None);
        assert_eq!("zstd".parse::<Compression>().unwrap(), Compression::Zstd(3));
        assert_eq!(
            "zstd:7".parse::<Compression>().unwrap(),
            Compression::Zstd(7)
        );
        let e = "zstd:99".parse::<Compression>().unwrap_err().to_string();
        assert!(e.contains("zstd:LEVEL"), "{e}");
        assert!("gzip".parse::<Compression>().is_err());
    }

    #[test]
    fn defaults_are_valid_and_bad_sizes_rejected() {
        StoreConfig::default().validate().unwrap();
        let c = StoreConfig {
            container_bytes: 1000,
            ..Default::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("container size"));
        let mut c = StoreConfig::default();
        c.chunk.min = c.chunk.avg + 1;
        assert!(c.validate().is_err());
    }
}
