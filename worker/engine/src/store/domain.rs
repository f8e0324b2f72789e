//! Dedup domains: which stored units a backup may deduplicate against.
//!
//! A store shared by several tenants deduplicates across all of them by default
//! ([`DedupDomain::Store`]): the most space saved, but a backup's `newBytes` then tells
//! its tenant whether content it sends is stored already, possibly by someone else.
//! With [`DedupDomain::Namespace`] a series (named `NAMESPACE/NAME` by the server) only
//! deduplicates against units written by series of its own namespace, plus the units
//! its own latest version references (its own data, whoever wrote the copy), so what a
//! backup stores and reports does not depend on other namespaces' data.
//!
//! Each unit records the domain it was written for ([`UnitRecord::domain`]): a hash of
//! the namespace, or 0 for units written with domains off. Switching the setting is
//! therefore safe at any time and takes effect with the next backup; units written
//! before namespace domains were on serve only the series that reference them.
//!
//! [`UnitRecord::domain`]: crate::format::unit::UnitRecord::domain

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::format::unit::UnitRecord;

/// The store-wide dedup setting (`revault serve --dedup-domain`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DedupDomain {
    /// Every series deduplicates against everything stored.
    #[default]
    Store,
    /// A series deduplicates only within its namespace (and against its own data).
    Namespace,
}

impl fmt::Display for DedupDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DedupDomain::Store => "store",
            DedupDomain::Namespace => "namespace",
        })
    }
}

impl FromStr for DedupDomain {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "store" => Ok(DedupDomain::Store),
            "namespace" => Ok(DedupDomain::Namespace),
            _ => Err(Error::Invalid(format!(
                "dedup domain {s:?}: expected `store` or `namespace`"
            ))),
        }
    }
}

/// The domain tag of a series' namespace: the part of its name before the first `/`
/// (the whole name is the namespace of a name without one, as the CLI's usually are).
/// Never 0, which marks units written with domains off.
pub fn domain_tag(series: &str) -> u64 {
    let ns = series.split_once('/').map_or(series, |(ns, _)| ns);
    let h = blake3::derive_key("revault dedup domain v1", ns.as_bytes());
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes")).max(1)
}

/// What one backup may deduplicate against, and the tag its new units carry.
#[derive(Clone, Debug, Default)]
pub(crate) enum DedupScope {
    /// Anything stored; new units are tagged 0.
    #[default]
    Any,
    /// Units of this tag, or ids in `own` (sorted, disjoint ranges: the units the
    /// series' latest version references; built by `ingest::scope`).
    Domain { tag: u64, own: Vec<Range<u64>> },
}

impl DedupScope {
    /// The tag new units of this backup carry.
    pub(crate) fn tag(&self) -> u64 {
        match self {
            DedupScope::Any => 0,
            DedupScope::Domain { tag, .. } => *tag,
        }
    }

    /// With a domain whose series references units already (its latest version): whether an
    /// id is one of them.
    pub(crate) fn own_ids(&self) -> Option<impl Fn(u64) -> bool + '_> {
        match self {
            DedupScope::Domain { own, .. } if !own.is_empty() => Some(move |id: u64| {
                let i = own.partition_point(|r| r.end <= id);
                own.get(i).is_some_and(|r| r.contains(&id))
            }),
            _ => None,
        }
    }

    /// Whether unit `id` (its record `u`) may serve as a copy.
    pub(crate) fn admits(&self, id: u64, u: &UnitRecord) -> bool {
        match self {
            DedupScope::Any => true,
            DedupScope::Domain { tag, .. } => {
                u.domain == *tag || self.own_ids().is_some_and(|own| own(id))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_has_one_nonzero_tag_whatever_the_series() {
        assert_eq!(domain_tag("team-a/db"), domain_tag("team-a/web"));
        assert_ne!(domain_tag("team-a/db"), domain_tag("team-b/db"));
        assert_eq!(domain_tag("solo"), domain_tag("solo/x"));
        assert_ne!(domain_tag(""), 0);
    }

    #[test]
    fn the_setting_parses_and_prints_its_two_values() {
        for d in [DedupDomain::Store, DedupDomain::Namespace] {
            assert_eq!(d.to_string().parse::<DedupDomain>().unwrap(), d);
        }
        let e = "tenant".parse::<DedupDomain>().unwrap_err().to_string();
        assert!(e.contains("`store` or `namespace`"), "{e}");
    }
}
