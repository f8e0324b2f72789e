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
use crate::fp::Fp;

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

    /// Cuts the chunks of `data[start..]` whose ends are already certain and
    /// appends them to `out` as (offset, length); returns where the uncut rest
    /// begins. Unless `last` (the data runs to the end of its piece), the final
    /// `max` bytes may belong to a chunk that continues in the next read, so
    /// they are left uncut.
    ///
    /// A long span is cut in two halves at once, on two threads: the second
    /// half is cut as if a chunk started at its middle, and the first half's
    /// chunks continue past the middle until one ends where one of the second
    /// half's begins. Cut points depend only on where a chunk starts, so from
    /// there on both agree and the result is exactly the sequential one; they
    /// meet within a chunk or two, except inside runs with no cut point (long
    /// zero runs), where the first half simply carries on alone.
    pub fn cut_span(
        &self,
        data: &[u8],
        start: usize,
        last: bool,
        out: &mut Vec<(u32, u32)>,
    ) -> usize {
        const PARALLEL_MIN: usize = 256 << 10;
        if data.len().saturating_sub(start) < PARALLEL_MIN {
            return self.cut_until(data, start, last, usize::MAX, out);
        }
        let mid = start + (data.len() - start) / 2;
        let mut right = Vec::new();
        let (mut pos, right_end) = rayon::join(
            || self.cut_until(data, start, last, mid, out),
            || self.cut_until(data, mid, last, usize::MAX, &mut right),
        );
        let mut i = 0;
        loop {
            while i < right.len() && (right[i].0 as usize) < pos {
                i += 1;
            }
            if i < right.len() && right[i].0 as usize == pos {
                out.extend_from_slice(&right[i..]);
                return right_end;
            }
            if pos == right_end || !self.can_cut(data, pos, last) {
                return pos;
            }
            let n = self.cut(&data[pos..]);
            out.push((pos as u32, n as u32));
            pos += n;
        }
    }

    /// Whether the chunk starting at `pos` can be cut now (see [`Self::cut_span`]).
    #[inline]
    fn can_cut(&self, data: &[u8], pos: usize, last: bool) -> bool {
        pos < data.len() && (last || data.len() - pos >= self.max)
    }

    /// Cuts chunks from `pos` while they can be cut and until one ends at or
    /// after `stop`; returns where the next chunk starts.
    fn cut_until(
        &self,
        data: &[u8],
        mut pos: usize,
        last: bool,
        stop: usize,
        out: &mut Vec<(u32, u32)>,
    ) -> usize {
        while pos < stop && self.can_cut(data, pos, last) {
            let n = self.cut(&data[pos..]);
            out.push((pos as u32, n as u32));
            pos += n;
        }
        pos
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

    /// The chunks of `d[start..]` one after another, as `cut_span` must return them.
    fn cut_sequentially(
        c: &Chunker,
        d: &[u8],
        start: usize,
        last: bool,
    ) -> (Vec<(u32, u32)>, usize) {
        let mut out = Vec::new();
        let mut pos = start;
        while pos < d.len() && (last || d.len() - pos >= c.max_size()) {
            let n = c.cut(&d[pos..]);
            out.push((pos as u32, n as u32));
            pos += n;
        }
        (out, pos)
    }

    #[test]
    fn cutting_a_span_in_halves_gives_the_sequential_chunks() {
        let c = Chunker::new(StoreConfig::default().chunk);
        // Random data, a long zero run (no cut points: inside it chains that
        // start apart stay apart), a short repeated pattern, random again.
        let mut data = random(600 << 10, 5);
        data.extend(std::iter::repeat_n(0u8, 700 << 10));
        data.extend(b"0123456789abcdef".iter().cycle().take(300 << 10));
        data.extend(random(900 << 10, 6));
        // Spans whose middle falls in random data, in the zero run, in the
        // pattern; one too short to split.
        for (start, end) in [
            (0, data.len()),
            (12_345, data.len()),
            (0, 1 << 20),
            (999, 1 << 20),
            (650_000, 1_400_000),
            (0, 200 << 10),
        ] {
            let d = &data[..end];
            for last in [false, true] {
                let mut out = vec![(7, 7)];
                let pos = c.cut_span(d, start, last, &mut out);
                let (want, want_pos) = cut_sequentially(&c, d, start, last);
                assert_eq!(out[0], (7, 7), "chunks already in the list are kept");
                assert_eq!(out[1..], want[..], "span {start}..{end}, last {last}");
                assert_eq!(pos, want_pos, "span {start}..{end}, last {last}");
            }
        }
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
}
