//! Small binary encoding helpers shared by the on-disk formats (unit records,
//! recipes, catalogs, container footers): LEB128 varints, zigzag, and a reader
//! that reports truncation instead of panicking.

/// Appends `v` as an unsigned LEB128 varint.
#[inline]
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub fn put_ivarint(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, zigzag(v));
}

pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uvarint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends a CRC32C of everything in `out` so far.
pub fn seal_crc(out: &mut Vec<u8>) {
    let c = crc32c::crc32c(out);
    out.extend_from_slice(&c.to_le_bytes());
}

/// Verifies and strips a trailing CRC32C written by [`seal_crc`].
pub fn open_crc(buf: &[u8]) -> Option<&[u8]> {
    if buf.len() < 4 {
        return None;
    }
    let (body, tail) = buf.split_at(buf.len() - 4);
    let want = u32::from_le_bytes(tail.try_into().ok()?);
    (crc32c::crc32c(body) == want).then_some(body)
}

/// A cursor over an encoded buffer. Every read returns `None` on truncation or
/// overflow so callers turn malformed input into a clear error.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    #[inline]
    pub fn uvarint(&mut self) -> Option<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
            shift += 7;
            if shift > 63 {
                return None;
            }
        }
    }

    pub fn ivarint(&mut self) -> Option<i64> {
        self.uvarint().map(unzigzag)
    }

    pub fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u32_le(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.uvarint()?).ok()?;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(vals in proptest::collection::vec(any::<u64>(), 0..50),
                              ivals in proptest::collection::vec(any::<i64>(), 0..50)) {
            let mut out = Vec::new();
            for v in &vals { put_uvarint(&mut out, *v); }
            for v in &ivals { put_ivarint(&mut out, *v); }
            let mut r = Reader::new(&out);
            for v in &vals { prop_assert_eq!(r.uvarint(), Some(*v)); }
            for v in &ivals { prop_assert_eq!(r.ivarint(), Some(*v)); }
            prop_assert!(r.is_empty());
        }
    }

    #[test]
    fn truncated_input_is_none_not_panic() {
        let mut out = Vec::new();
        put_uvarint(&mut out, u64::MAX);
        let mut r = Reader::new(&out[..out.len() - 1]);
        assert_eq!(r.uvarint(), None);
        let mut r = Reader::new(&[0xff; 11]);
        assert_eq!(r.uvarint(), None);
    }

    #[test]
    fn crc_detects_a_flipped_bit() {
        let mut v = b"recipe bytes".to_vec();
        seal_crc(&mut v);
        assert_eq!(open_crc(&v), Some(&b"recipe bytes"[..]));
        v[3] ^= 0x10;
        assert_eq!(open_crc(&v), None);
    }
}
