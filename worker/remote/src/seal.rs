//! Sealed objects: everything that leaves the node is encrypted and authenticated here.
//!
//! An object is a header and its plaintext cut into frames, each frame sealed on its own
//! with AES-256-GCM, so a ranged GET of a few frames can be opened without the rest of the
//! object (the restore reads containers by ranges):
//!
//! ```text
//! 0..8    magic "RVLTSEA1"
//! 8       format = 1
//! 9       log2 of the frame size (16: 64 KiB of plaintext per frame)
//! 10..12  zero
//! 12..16  data key id (u32 LE): which data key of the remote sealed the object
//! 16..48  salt: 32 random bytes, new for every upload
//! 48..56  plaintext length (u64 LE)
//! 56..    frames: frame i is AES-256-GCM(plaintext[i*F..], 16-byte tag appended)
//! ```
//!
//! **Keys and nonces.** Each upload draws a fresh salt and seals under its own key,
//! `BLAKE3-derive_key("revault remote object key v1", data key ‖ salt)`; the nonce of frame
//! `i` is `i` (u64 BE) followed by 1 for the last frame and 0 otherwise. A nonce is therefore
//! never used twice under one key: within an object the frame index differs, and two objects
//! (or two uploads of one object) have different keys unless 256-bit salts collide.
//!
//! **What is authenticated.** Every frame's associated data is the header and the object's
//! name in the bucket. A changed byte, a frame moved, dropped or appended, a truncated
//! object, a header edited (length, frame size, salt) or an object copied under another
//! name all fail to open, and the error names the object.

use std::ops::Range;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{RemoteError, Result};

pub const MAGIC: &[u8; 8] = b"RVLTSEA1";
pub const HEADER_LEN: usize = 56;
pub const TAG_LEN: usize = 16;
/// 64 KiB of plaintext per frame: a ranged read of a few blocks of a container fetches at
/// most one frame too many at each end, and the tags cost 0.02%.
pub const DEFAULT_FRAME_LOG2: u8 = 16;
const KEY_CONTEXT: &str = "revault remote object key v1";
/// The largest plaintext an object may claim (1 PiB): far beyond any container or table, and
/// small enough that every offset computed from it fits in 64 bits.
const MAX_PLAIN: u64 = 1 << 50;
/// The smallest frames a header may declare (`2^10` bytes).
const MIN_FRAME_LOG2: u8 = 10;

/// The most bytes an object sealing `plain_len` bytes can have, whatever frame size its
/// header declares: how much of an object a reader that knows the plaintext's length need
/// ever fetch (one that says it is longer is not that object).
pub fn sealed_len_at_most(plain_len: u64) -> u64 {
    let frames = plain_len.div_ceil(1 << MIN_FRAME_LOG2).max(1);
    HEADER_LEN as u64 + plain_len + frames * TAG_LEN as u64
}

/// A data key: what seals and opens objects. Never leaves the node unwrapped.
#[derive(Clone)]
pub struct DataKey {
    pub id: u32,
    bytes: [u8; 32],
}

impl DataKey {
    pub fn new(id: u32, bytes: [u8; 32]) -> Self {
        DataKey { id, bytes }
    }

    pub fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    fn object_key(&self, salt: &[u8; 32]) -> LessSafeKey {
        let mut material = [0u8; 64];
        material[..32].copy_from_slice(&self.bytes);
        material[32..].copy_from_slice(salt);
        let k = blake3::derive_key(KEY_CONTEXT, &material);
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("a 32-byte AES-256 key"))
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DataKey({})", self.id)
    }
}

/// An object's header, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub frame_log2: u8,
    pub key_id: u32,
    pub salt: [u8; 32],
    pub plain_len: u64,
    raw: [u8; HEADER_LEN],
}

impl Header {
    fn new(frame_log2: u8, key_id: u32, salt: [u8; 32], plain_len: u64) -> Self {
        let mut raw = [0u8; HEADER_LEN];
        raw[..8].copy_from_slice(MAGIC);
        raw[8] = 1;
        raw[9] = frame_log2;
        raw[12..16].copy_from_slice(&key_id.to_le_bytes());
        raw[16..48].copy_from_slice(&salt);
        raw[48..56].copy_from_slice(&plain_len.to_le_bytes());
        Header {
            frame_log2,
            key_id,
            salt,
            plain_len,
            raw,
        }
    }

    /// Decodes the first [`HEADER_LEN`] bytes of object `name`.
    pub fn decode(name: &str, b: &[u8]) -> Result<Header> {
        let bad = |d: &str| RemoteError::tampered(name, d);
        if b.len() < HEADER_LEN {
            return Err(bad("shorter than a sealed object's header"));
        }
        if &b[..8] != MAGIC {
            return Err(bad("not a sealed object (bad magic)"));
        }
        if b[8] != 1 {
            return Err(bad(&format!("unknown sealed format {}", b[8])));
        }
        let frame_log2 = b[9];
        if !(MIN_FRAME_LOG2..=24).contains(&frame_log2) || b[10..12] != [0, 0] {
            return Err(bad("malformed header"));
        }
        let key_id = u32::from_le_bytes(b[12..16].try_into().unwrap());
        let salt: [u8; 32] = b[16..48].try_into().unwrap();
        let plain_len = u64::from_le_bytes(b[48..56].try_into().unwrap());
        // A length whose sealed size does not fit in 64 bits is no object's (every other
        // figure derives from it, unchecked).
        if plain_len > MAX_PLAIN {
            return Err(bad(&format!("a length of {plain_len} bytes")));
        }
        Ok(Header::new(frame_log2, key_id, salt, plain_len))
    }

    pub fn frame_size(&self) -> u64 {
        1u64 << self.frame_log2
    }

    pub fn frames(&self) -> u64 {
        self.plain_len.div_ceil(self.frame_size()).max(1)
    }

    /// The sealed object's length.
    pub fn sealed_len(&self) -> u64 {
        HEADER_LEN as u64 + self.plain_len + self.frames() * TAG_LEN as u64
    }

    /// Where frame `i` starts in the sealed object.
    fn frame_offset(&self, i: u64) -> u64 {
        HEADER_LEN as u64 + i * (self.frame_size() + TAG_LEN as u64)
    }

    /// Plaintext length of frame `i`.
    fn frame_plain_len(&self, i: u64) -> u64 {
        let start = i * self.frame_size();
        self.plain_len.saturating_sub(start).min(self.frame_size())
    }

    /// The sealed byte range holding plaintext `range`, and the plaintext offset where it
    /// starts (a frame boundary).
    pub fn sealed_range(&self, range: &Range<u64>) -> (Range<u64>, u64) {
        let f = self.frame_size();
        let first = range.start / f;
        let last = range.end.saturating_sub(1).max(range.start) / f;
        let last = last.min(self.frames() - 1);
        let end = self.frame_offset(last) + self.frame_plain_len(last) + TAG_LEN as u64;
        (self.frame_offset(first)..end, first * f)
    }

    fn aad(&self, name: &str) -> Vec<u8> {
        let mut a = Vec::with_capacity(HEADER_LEN + name.len());
        a.extend_from_slice(&self.raw);
        a.extend_from_slice(name.as_bytes());
        a
    }
}

fn nonce(i: u64, last: bool) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&i.to_be_bytes());
    n[8] = last as u8;
    Nonce::assume_unique_for_key(n)
}

/// Seals `plain` as object `name` under `key` with frames of `2^frame_log2` bytes.
pub fn seal(key: &DataKey, name: &str, plain: &[u8], frame_log2: u8) -> Vec<u8> {
    let mut salt = [0u8; 32];
    SystemRandom::new()
        .fill(&mut salt)
        .expect("the system's random source works");
    seal_with_salt(key, name, plain, frame_log2, salt)
}

fn seal_with_salt(
    key: &DataKey,
    name: &str,
    plain: &[u8],
    frame_log2: u8,
    salt: [u8; 32],
) -> Vec<u8> {
    let h = Header::new(frame_log2, key.id, salt, plain.len() as u64);
    let k = key.object_key(&salt);
    let aad = h.aad(name);
    let mut out = Vec::with_capacity(h.sealed_len() as usize);
    out.extend_from_slice(&h.raw);
    let frames = h.frames();
    let f = h.frame_size() as usize;
    for i in 0..frames {
        let start = i as usize * f;
        let end = (start + f).min(plain.len());
        let at = out.len();
        out.extend_from_slice(&plain[start..end]);
        let tag = k
            .seal_in_place_separate_tag(
                nonce(i, i + 1 == frames),
                Aad::from(&aad[..]),
                &mut out[at..],
            )
            .expect("AES-GCM seals any frame under 64 GiB");
        out.extend_from_slice(tag.as_ref());
    }
    out
}

/// Opens a whole sealed object `name`.
pub fn open(key: &DataKey, name: &str, sealed: &[u8]) -> Result<Vec<u8>> {
    let h = Header::decode(name, sealed)?;
    if h.sealed_len() != sealed.len() as u64 {
        return Err(RemoteError::tampered(
            name,
            &format!(
                "{} bytes where its header says {} (truncated or extended)",
                sealed.len(),
                h.sealed_len()
            ),
        ));
    }
    let body = &sealed[HEADER_LEN..];
    open_frames(key, name, &h, 0, body)
}

/// Opens sealed bytes `body` that start at frame `first` of object `name` (as fetched by a
/// ranged GET of [`Header::sealed_range`]): its frames' plaintext, in order.
pub fn open_frames(
    key: &DataKey,
    name: &str,
    h: &Header,
    first: u64,
    body: &[u8],
) -> Result<Vec<u8>> {
    if h.key_id != key.id {
        return Err(RemoteError::tampered(
            name,
            &format!(
                "sealed by data key {}, this remote's key is {}",
                h.key_id, key.id
            ),
        ));
    }
    let k = key.object_key(&h.salt);
    let aad = h.aad(name);
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    let mut i = first;
    let frames = h.frames();
    while !rest.is_empty() {
        if i >= frames {
            return Err(RemoteError::tampered(
                name,
                "more frames than its length allows",
            ));
        }
        let n = h.frame_plain_len(i) as usize + TAG_LEN;
        if rest.len() < n {
            return Err(RemoteError::tampered(
                name,
                &format!("frame {i} is truncated"),
            ));
        }
        let at = out.len();
        out.extend_from_slice(&rest[..n]);
        let opened = k
            .open_in_place(nonce(i, i + 1 == frames), Aad::from(&aad[..]), &mut out[at..])
            .map_err(|_| {
                RemoteError::tampered(
                    name,
                    &format!("frame {i} fails authentication (changed, moved or sealed under another key or name)"),
                )
            })?
            .len();
        out.truncate(at + opened);
        rest = &rest[n..];
        i += 1;
    }
    Ok(out)
}

/// Random bytes from the system's source.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random source works");
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> DataKey {
        DataKey::new(1, [7u8; 32])
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn no_object_is_longer_than_its_bound() {
        for n in [0usize, 1, 1023, 1024, 1025, 70_000, 1 << 20] {
            for log2 in [MIN_FRAME_LOG2, 12, DEFAULT_FRAME_LOG2, 20] {
                let sealed = seal(&key(), "c", &data(n), log2);
                assert!(
                    sealed.len() as u64 <= sealed_len_at_most(n as u64),
                    "{n} bytes in frames of 2^{log2}"
                );
            }
        }
        let smallest = seal(&key(), "c", &data(5000), MIN_FRAME_LOG2);
        assert_eq!(
            smallest.len() as u64,
            sealed_len_at_most(5000),
            "the bound is tight"
        );
    }

    #[test]
    fn round_trips_at_frame_edges() {
        for n in [0, 1, 1023, 1024, 1025, 4096, 5000] {
            let p = data(n);
            let s = seal(&key(), "data/1", &p, 10);
            assert_eq!(
                s.len() as u64,
                Header::decode("x", &s).unwrap().sealed_len()
            );
            assert_eq!(open(&key(), "data/1", &s).unwrap(), p, "{n} bytes");
        }
    }

    #[test]
    fn every_kind_of_tampering_is_caught_and_names_the_object() {
        let p = data(5000);
        let s = seal(&key(), "data/00000001", &p, 10);
        let expect_fail = |bytes: &[u8], name: &str, why: &str| {
            let e = open(&key(), name, bytes).unwrap_err();
            assert!(matches!(e, RemoteError::Tampered { .. }), "{why}: {e}");
            assert!(e.to_string().contains(name), "{why}: {e}");
        };
        for at in [0, 9, 20, 50, HEADER_LEN, HEADER_LEN + 700, s.len() - 1] {
            let mut t = s.clone();
            t[at] ^= 1;
            expect_fail(&t, "data/00000001", &format!("byte {at} flipped"));
        }
        expect_fail(&s, "data/00000002", "copied under another name");
        expect_fail(&s[..s.len() - 1], "data/00000001", "truncated");
        let mut longer = s.clone();
        longer.extend_from_slice(&[0; 40]);
        expect_fail(&longer, "data/00000001", "extended");
        // Frames swapped: both are whole frames of the same object, in the wrong places.
        let f = 1024 + TAG_LEN;
        let mut swapped = s.clone();
        let (a, b) = (HEADER_LEN, HEADER_LEN + f);
        let first: Vec<u8> = s[a..a + f].to_vec();
        swapped.copy_within(b..b + f, a);
        swapped[b..b + f].copy_from_slice(&first);
        expect_fail(&swapped, "data/00000001", "frames swapped");
        // Another key.
        let e = open(&DataKey::new(1, [8u8; 32]), "data/00000001", &s).unwrap_err();
        assert!(matches!(e, RemoteError::Tampered { .. }), "{e}");
    }

    #[test]
    fn the_last_frame_cannot_be_dropped_even_at_a_frame_boundary() {
        // 2048 bytes = two full frames: drop the second and claim one in the header.
        let p = data(2048);
        let s = seal(&key(), "o", &p, 10);
        let mut t = s[..HEADER_LEN + 1024 + TAG_LEN].to_vec();
        t[48..56].copy_from_slice(&1024u64.to_le_bytes());
        assert!(open(&key(), "o", &t).is_err());
    }

    /// Found by the fuzz target: a header claiming an enormous length overflowed the sealed
    /// size (a panic with overflow checks on).
    #[test]
    fn an_impossible_length_is_refused_not_computed() {
        let s = seal(&key(), "o", &data(100), 10);
        let mut t = s.clone();
        t[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = open(&key(), "o", &t).unwrap_err();
        assert!(e.to_string().contains("a length of"), "{e}");
    }

    #[test]
    fn two_seals_of_the_same_bytes_differ() {
        let p = data(3000);
        let a = seal(&key(), "o", &p, 10);
        let b = seal(&key(), "o", &p, 10);
        assert_ne!(a[16..48], b[16..48], "salts");
        assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..], "ciphertexts");
    }

    proptest! {
        #[test]
        fn any_range_opens_from_its_frames(n in 0usize..6000, a in 0u64..6000, len in 1u64..3000) {
            let p = data(n);
            let s = seal(&key(), "o", &p, 10);
            let h = Header::decode("o", &s).unwrap();
            let start = a.min(n as u64);
            let end = (start + len).min(n as u64);
            prop_assume!(start < end);
            let (sr, base) = h.sealed_range(&(start..end));
            let plain = open_frames(&key(), "o", &h, base / h.frame_size(), &s[sr.start as usize..sr.end as usize]).unwrap();
            let off = (start - base) as usize;
            prop_assert_eq!(&plain[off..off + (end - start) as usize], &p[start as usize..end as usize]);
        }

        #[test]
        fn garbage_never_opens(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert!(open(&key(), "o", &bytes).is_err());
        }
    }
}
