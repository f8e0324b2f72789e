//! The names of a store's objects under its prefix (docs/remote.md, "Layout").
//!
//! ```text
//! revault-remote.json            the descriptor: store id, wrapped data keys (plain JSON)
//! gens/GGGGGGGG                  a generation's claim: written once (If-None-Match) by `init`
//!                                and by every `recover`; the highest one owns the remote
//! heads/GGGGGGGG-SSSSSSSSSSSSSSSS  a published metadata checkpoint (sealed JSON, [`crate::head`])
//! meta/HASH                      a metadata file (RocksDB table, manifest, …), named by the
//!                                BLAKE3 of its content, sealed
//! data/CCCCCCCCCCCCCCCC          container C (its id in hex), sealed
//! ```
//!
//! Every object but the descriptor is sealed under its own name ([`crate::seal`]), so one
//! copied over another fails to open.

use revault_engine::ContainerId;

pub const DESCRIPTOR: &str = "revault-remote.json";
pub const GENS: &str = "gens/";
pub const HEADS: &str = "heads/";
pub const META: &str = "meta/";
pub const DATA: &str = "data/";

pub fn generation(g: u32) -> String {
    format!("{GENS}{g:08x}")
}

pub fn parse_generation(name: &str) -> Option<u32> {
    let hex = name.strip_prefix(GENS)?;
    (hex.len() == 8).then(|| u32::from_str_radix(hex, 16).ok())?
}

pub fn head(generation: u32, seq: u64) -> String {
    format!("{HEADS}{generation:08x}-{seq:016x}")
}

/// (generation, sequence) of a head's name.
pub fn parse_head(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(HEADS)?;
    let (g, s) = rest.split_once('-')?;
    if g.len() != 8 || s.len() != 16 {
        return None;
    }
    Some((
        u32::from_str_radix(g, 16).ok()?,
        u64::from_str_radix(s, 16).ok()?,
    ))
}

pub fn meta_file(hash: &blake3::Hash) -> String {
    format!("{META}{}", hash.to_hex())
}

pub fn container(id: ContainerId) -> String {
    format!("{DATA}{:016x}", id.0)
}

pub fn parse_container(name: &str) -> Option<ContainerId> {
    let hex = name.strip_prefix(DATA)?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok().map(ContainerId))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_order_as_their_numbers() {
        assert_eq!(parse_generation(&generation(7)), Some(7));
        assert_eq!(parse_head(&head(3, 42)), Some((3, 42)));
        assert!(head(1, 0xff) < head(1, 0x100) && head(1, u64::MAX) < head(2, 0));
        let c = ContainerId::new(5, 9);
        assert_eq!(parse_container(&container(c)), Some(c));
        for bad in ["gens/7", "heads/1-2", "data/xyz", "data/", "meta/abc"] {
            assert!(
                parse_generation(bad).is_none()
                    && parse_head(bad).is_none()
                    && parse_container(bad).is_none(),
                "{bad}"
            );
        }
    }
}
