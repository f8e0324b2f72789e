//! One-pass content-defined chunking with segment boundaries.
//!
//! Chunk boundaries come from FastCDC v2020 (gear hash, normalisation level 1,
//! two bytes per step), via the `fastcdc` crate's `cut` function so we keep
//! our own buffering across reads and files.
//!
//! Segment boundaries are a subset of chunk boundaries: a segment closes after
//! a chunk whose BLAKE3 fingerprint matches a wider mask (`k` more bits, where
//! `2^k` ~ average chunks per segment), once the segment has reached its minimum
//! size; it is forced closed before it would exceed its maximum. We test the
//! chunk's fingerprint rather than the gear hash at the cut because the gear
//! hash is not defined for chunks cut at a file's end below the minimum size
//! (fastcdc reports 0 there, which would make every small file a segment), while
//! the fingerprint is uniform for every chunk and is computed anyway: the data is
//! still scanned once and hashed once.

use fastcdc::v2020;

use crate::config::SizeRange;
use crate::format::fp::Fp;

#[derive(Clone, Debug)]
pub struct Chunker {
    min: usize,
    avg: usize,
    max: usize,
    mask_s: u64,
    mask_l: u64,
}

impl Chunker {
    pub fn new(r: SizeRange) -> Self {
        let (mask_s, mask_l) = v2020::select_masks(r.avg as usize, v2020::Normalization::Level1);
        Chunker {
            min: r.min as usize,
            avg: r.avg as usize,
            max: r.max as usize,
            mask_s,
            mask_l,
        }
    }

    pub fn max_size(&self) -> usize {
        self.max
    }

    /// The most chunks `bytes` of one piece can hold (each at least `min`,
    /// but for the piece's last).
    pub fn most_chunks(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.min.max(1)) + 1
    }

    /// Length of the first chunk of `data`.
    ///
    /// The result depends only on the first `max` bytes, so callers must pass at
    /// least `max` bytes unless `data` runs to the end of a file or stream; then
    /// the whole remainder (possibly shorter than `min`) may become the last chunk.
    #[inline]
    pub fn cut(&self, data: &[u8]) -> usize {
        if data.is_empty() {
            return 0;
        }
        let (_hash, n) = v2020::cut(
            data,
            self.min,
            self.avg,
            self.max,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        n.max(1)
    }

    /// Whether cutting `data` (which starts where a chunk starts) gives a first
    /// chunk of exactly `len` bytes, *given* that no cut point lies before
    /// `len` in the context where those bytes were first chunked. That holds
    /// when `data[..len]` has the content of a chunk some earlier chunking
    /// produced; [`crate::ingest::predict`] checks the content, this checks the rest
    /// without scanning the chunk: the cut test at `len` (which also reads the
    /// byte after the chunk), and at `len - 1` for an odd `len` (a chunk that
    /// ended a piece of odd length was never tested there). `last`: `data`
    /// runs to the end of its piece.
    pub fn cuts_at(&self, data: &[u8], len: usize, last: bool) -> bool {
        let avail = data.len();
        if len == 0 || len > avail || len > self.max {
            return false;
        }
        if last && len == avail {
            // The piece ends here: cut whatever came before.
            return true;
        }
        if len == self.max {
            // No cut point before the maximum: cut at it.
            return true;
        }
        // `fastcdc::v2020::cut_gear` tests the positions from `min` on, in
        // pairs, up to the piece's end or the maximum (a piece shorter than
        // the average also narrows the strict-mask region to itself, which
        // changes no tested position's mask).
        let rem = if last { avail.min(self.max) } else { self.max };
        let tested = |x: usize| x >= self.min && (x & !1) < 2 * (rem / 2);
        if !tested(len) || !self.natural_cut(data, len) {
            return false;
        }
        !(len % 2 == 1 && tested(len - 1) && self.natural_cut(data, len - 1))
    }

    /// The gear test FastCDC v2020 makes for a cut after `x` bytes (it reads
    /// byte `x` too, two bytes per step: an even `x` is tested with the
    /// left-shifted hash and mask). The hash is a 64-bit shift register, so
    /// only the last 64 bytes count.
    fn natural_cut(&self, data: &[u8], x: usize) -> bool {
        let (gear, _) = v2020::get_gear_with_seed(0);
        let mut h: u64 = 0;
        for &b in &data[self.min.max(x.saturating_sub(63))..=x] {
            h = (h << 1).wrapping_add(gear[b as usize]);
        }
        let mask = if (x & !1) < self.avg {
            self.mask_s
        } else {
            self.mask_l
        };
        if x.is_multiple_of(2) {
            (h << 1) & (mask << 1) == 0
        } else {
            h & mask == 0
        }
    }

    /// Whether the chunk starting at `pos` can be cut now: unless `last` (the
    /// data runs to the end of its piece), the final `max` bytes may belong to
    /// a chunk that continues in the next read.
    #[inline]
    pub(crate) fn can_cut(&self, data: &[u8], pos: usize, last: bool) -> bool {
        pos < data.len() && (last || data.len() - pos >= self.max)
    }

    /// All chunk lengths of a complete piece of data (a file or a whole stream).
    pub fn chunk_all(&self, mut data: &[u8]) -> Vec<usize> {
        let mut out = Vec::with_capacity(data.len() / self.avg + 1);
        while !data.is_empty() {
            let n = self.cut(data);
            out.push(n);
            data = &data[n..];
        }
        out
    }
}

/// Decides where segments end, given the chunk sequence.
#[derive(Clone, Debug)]
pub struct Segmenter {
    min: u64,
    max: u64,
    mask: u64,
}

impl Segmenter {
    pub fn new(seg: SizeRange, chunk: SizeRange) -> Self {
        // Expected segment = min + E[chunk] * 2^k; aim the mask at avg - min.
        let span = f64::from(seg.avg.saturating_sub(seg.min).max(chunk.avg)) / f64::from(chunk.avg);
        let bits = span.log2().round().clamp(0.0, 40.0) as u32;
        Segmenter {
            min: u64::from(seg.min),
            max: u64::from(seg.max),
            mask: (1u64 << bits) - 1,
        }
    }

    /// Should the current segment (of `cur` bytes) close before a chunk of `len`
    /// bytes is added? Enforces the maximum segment size.
    #[inline]
    pub fn closes_before(&self, cur: u64, len: u64) -> bool {
        cur > 0 && cur + len > self.max
    }

    /// Should the segment close after a chunk with fingerprint `fp` brought it
    /// to `cur` bytes?
    #[inline]
    pub fn closes_after(&self, cur: u64, fp: &Fp) -> bool {
        cur >= self.max || (cur >= self.min && fp.prefix_u64() & self.mask == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(n: usize, seed: u64) -> Vec<u8> {
        let mut v = vec![0u8; n];
        ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
        v
    }

    fn boundaries(lens: &[usize]) -> Vec<usize> {
        lens.iter()
            .scan(0, |acc, &l| {
                *acc += l;
                Some(*acc)
            })
            .collect()
    }

    #[test]
    fn sizes_stay_within_bounds_and_cover_the_input() {
        let cfg = StoreConfig::default();
        let c = Chunker::new(cfg.chunk);
        let data = random(8 << 20, 1);
        let lens = c.chunk_all(&data);
        assert_eq!(lens.iter().sum::<usize>(), data.len());
        for (i, &l) in lens.iter().enumerate() {
            assert!(l <= cfg.chunk.max as usize);
            if i + 1 < lens.len() {
                assert!(l >= cfg.chunk.min as usize, "chunk {i} is {l} bytes");
            }
        }
        let mean = data.len() / lens.len();
        assert!(
            (6 * 1024..=14 * 1024).contains(&mean),
            "mean chunk {mean} bytes is far from the 8 KiB target"
        );
    }

    #[test]
    fn an_insertion_moves_only_nearby_boundaries() {
        let c = Chunker::new(StoreConfig::default().chunk);
        let data = random(4 << 20, 2);
        let mut edited = data.clone();
        let at = 2 << 20;
        edited.splice(at..at, b"an insertion of some bytes".iter().copied());
        let a = boundaries(&c.chunk_all(&data));
        let b = boundaries(&c.chunk_all(&edited));
        let shift = 26usize;
        // Boundaries before the edit are identical.
        let before_a: Vec<_> = a.iter().filter(|&&x| x < at).collect();
        let before_b: Vec<_> = b.iter().filter(|&&x| x < at).collect();
        assert_eq!(before_a, before_b);
        // Boundaries well after the edit are the same, shifted by the insertion.
        let after_a: Vec<_> = a
            .iter()
            .filter(|&&x| x > at + 256 * 1024)
            .copied()
            .collect();
        let after_b: Vec<_> = b
            .iter()
            .filter(|&&x| x > at + 256 * 1024 + shift)
            .map(|x| x - shift)
            .collect();
        assert_eq!(after_a, after_b);
        // And few boundaries differ in all.
        let sa: std::collections::HashSet<_> = a.iter().copied().collect();
        let moved = b
            .iter()
            .filter(|&&x| {
                let orig = if x > at { x - shift } else { x };
                !sa.contains(&orig)
            })
            .count();
        assert!(
            moved <= 3,
            "{moved} boundaries moved for one small insertion"
        );
    }

    #[test]
    fn cut_depends_only_on_the_first_max_bytes() {
        let c = Chunker::new(StoreConfig::default().chunk);
        let data = random(1 << 20, 3);
        let max = c.max_size();
        for start in [0usize, 1000, 77_777, 500_000] {
            let full = c.cut(&data[start..]);
            let window = c.cut(&data[start..start + max]);
            assert_eq!(full, window);
        }
    }

    #[test]
    fn segments_are_runs_of_chunks_within_bounds() {
        let cfg = StoreConfig::default();
        let c = Chunker::new(cfg.chunk);
        let s = Segmenter::new(cfg.segment, cfg.chunk);
        let data = random(48 << 20, 4);
        let lens = c.chunk_all(&data);
        let mut segs = Vec::new();
        let mut cur = 0u64;
        let mut pos = 0usize;
        for &l in &lens {
            let chunk = &data[pos..pos + l];
            pos += l;
            if s.closes_before(cur, l as u64) {
                segs.push(cur);
                cur = 0;
            }
            cur += l as u64;
            if s.closes_after(cur, &Fp::of(chunk)) {
                segs.push(cur);
                cur = 0;
            }
        }
        if cur > 0 {
            segs.push(cur);
        }
        assert_eq!(segs.iter().sum::<u64>(), data.len() as u64);
        for &seg in &segs[..segs.len() - 1] {
            assert!(seg >= u64::from(cfg.segment.min) && seg <= u64::from(cfg.segment.max));
        }
        let mean = data.len() as u64 / segs.len() as u64;
        assert!(
            (512 << 10..=2 << 20).contains(&mean),
            "mean segment {mean} bytes is far from the 1 MiB target"
        );
    }

    /// `cuts_at` must say yes at the length the chunker cuts and no at every
    /// shorter one, mid-stream and at a piece's end: prediction relies on it
    /// to keep exactly the chunks a full scan would cut.
    #[test]
    fn cuts_at_agrees_with_the_chunker() {
        let small = SizeRange {
            min: 64,
            avg: 256,
            max: 1024,
        };
        let mut pattern = random(1 << 16, 7);
        for (i, b) in pattern.iter_mut().enumerate().skip(1 << 15) {
            *b = (i % 7) as u8; // no cut points: maximum-size chunks
        }
        let cases = [
            (StoreConfig::default().chunk, random(1 << 20, 3)),
            (small, random(1 << 18, 4)),
            (small, pattern),
            (small, vec![0u8; 5000]),
        ];
        for (range, data) in cases {
            let c = Chunker::new(range);
            for end in [data.len(), data.len() - 1, data.len() - 333] {
                let piece = &data[..end];
                let mut pos = 0;
                let mut checked = 0;
                while pos < piece.len() {
                    let rest = &piece[pos..];
                    let n = c.cut(rest);
                    assert!(c.cuts_at(rest, n, true), "at {pos}: the piece's cut {n}");
                    for l in 1..n {
                        assert!(!c.cuts_at(rest, l, true), "at {pos}: {l} < cut {n}");
                    }
                    if rest.len() >= c.max_size() {
                        // Mid-stream: the same cut whatever follows the window.
                        let window = &rest[..c.max_size().min(rest.len())];
                        let w = if window.len() > n { window } else { rest };
                        assert!(c.cuts_at(w, n, false), "at {pos}: mid-stream cut {n}");
                        for l in (1..n).step_by(7) {
                            assert!(!c.cuts_at(w, l, false), "at {pos}: {l} < cut {n}");
                        }
                    }
                    pos += n;
                    checked += 1;
                }
                assert!(checked > 3);
            }
        }
    }

    /// A chunk that ended its piece (no cut point there) may go on in the
    /// next version: `cuts_at` must then answer for the new context, reading
    /// the bytes that follow, exactly as the chunker would cut.
    #[test]
    fn cuts_at_judges_a_chunk_in_its_new_context() {
        let small = SizeRange {
            min: 64,
            avg: 256,
            max: 1024,
        };
        let c = Chunker::new(small);
        let data = random(4 << 20, 11);
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let (mut agreed_cut, mut agreed_no, mut odd_traps) = (0, 0, 0);
        let mut pos = 0;
        while pos + 4096 < data.len() {
            let natural = c.cut(&data[pos..]);
            // An old piece starting at `pos` and ending at a random point,
            // at a cut point, or one byte past one: a chunk of odd length
            // whose piece ended there was never tested one byte earlier.
            let end = pos
                + match rng.next_u32() % 3 {
                    0 => 1 + rng.next_u32() as usize % 1200,
                    1 => natural,
                    _ => natural + 1,
                };
            let mut p = pos;
            let mut last_len = 0;
            while p < end {
                last_len = c.cut(&data[p..end]);
                p += last_len;
            }
            let start = end - last_len;
            // The same bytes followed by the original ones, or by new ones.
            let mut next = data[start..end].to_vec();
            let more = 1 + rng.next_u32() as usize % 1500;
            if rng.next_u32() % 2 == 0 {
                next.extend_from_slice(&data[end..end + more]);
            } else {
                next.extend_from_slice(&random(more, u64::from(rng.next_u32())));
            }
            let cut = c.cut(&next);
            let want = cut == last_len;
            assert_eq!(c.cuts_at(&next, last_len, true), want, "piece ends after");
            if next.len() >= c.max_size() {
                assert_eq!(c.cuts_at(&next, last_len, false), want, "mid-stream");
            }
            if last_len % 2 == 1
                && last_len > c.min
                && next.len() > last_len
                && c.natural_cut(&next, last_len)
                && cut == last_len - 1
            {
                odd_traps += 1;
            }
            if want {
                agreed_cut += 1;
            } else {
                agreed_no += 1;
            }
            pos += natural;
        }
        assert!(
            agreed_cut > 100 && agreed_no > 100 && odd_traps > 0,
            "{agreed_cut} / {agreed_no} / {odd_traps}"
        );
    }
}
