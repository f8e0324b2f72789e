//! Entry points of the durable tier's fuzz target (`worker/fuzz`, `hack/fuzz.sh remote`): what
//! comes back from a bucket is hostile input, and opening it must fail cleanly or return
//! exactly what was sealed, never panic.

use crate::seal::{self, DataKey, Header};

/// The first byte picks the case, the rest is its input:
/// 0: the bytes as a whole sealed object — never opens (nobody without the key forges one);
/// 1: a sealed object of the input, with bytes flipped where the input says — opens to the
///    input exactly when nothing changed, fails otherwise;
/// 2: the bytes as a header, frames and a range — ranged planning and opening do not panic;
/// 3: the bytes as an evicted container's stub.
pub fn sealed(data: &[u8]) {
    let key = DataKey::new(1, [9; 32]);
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    match op % 4 {
        0 => assert!(seal::open(&key, "o", rest).is_err()),
        1 => flipped(&key, rest),
        2 => ranged(&key, rest),
        _ => crate::tier::fuzz_stub(rest),
    }
}

fn flipped(key: &DataKey, rest: &[u8]) {
    let n = usize::from(*rest.first().unwrap_or(&0)) * 16;
    let plain = &rest[..n.min(rest.len())];
    let flips = &rest[plain.len()..];
    let original = seal::seal(key, "o", plain, 10);
    let mut s = original.clone();
    for f in flips.chunks(3) {
        if let [a, b, bit] = *f {
            let i = usize::from(u16::from_le_bytes([a, b])) % s.len();
            s[i] ^= bit;
        }
    }
    match seal::open(key, "o", &s) {
        Ok(p) => assert!(s == original && p == plain, "a changed object opened"),
        Err(_) => assert!(s != original, "an unchanged object failed to open"),
    }
}

fn ranged(key: &DataKey, rest: &[u8]) {
    let Ok(h) = Header::decode("o", rest) else {
        return;
    };
    let body = &rest[seal::HEADER_LEN..];
    let first = u64::from(*body.first().unwrap_or(&0));
    let _ = seal::open_frames(key, "o", &h, first, body);
    if h.plain_len > 0 {
        let a = first % h.plain_len;
        let b = (a + u64::from(*body.get(1).unwrap_or(&1)) + 1).min(h.plain_len);
        let (range, base) = h.sealed_range(&(a..b));
        assert!(base <= a && range.start <= range.end && range.end <= h.sealed_len());
    }
}
