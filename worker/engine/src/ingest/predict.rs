//! Chunk boundaries predicted from the previous version.
//!
//! A daily full backup is mostly the previous version again, in the same
//! order (duplicate locality). After a chunk that matches chunk `i` of the
//! previous version, the next one is most likely chunk `i + 1`. The chunking
//! stage checks that guess instead of running the gear hash over the chunk:
//! the bytes must hash to that chunk's fingerprint (the hash is needed anyway)
//! and [`Chunker::cuts_at`] must confirm that the chunker would end a chunk
//! there. The idea is RapidCDC's (Ni and Jiang, SoCC '19); the second check
//! keeps the chunks exactly those a full scan cuts, so dedup and every later
//! version's chunking are unchanged, only the scan is skipped.
//!
//! After a miss, chunks are cut by scanning and hashed at once (probes) until
//! one is found in the previous version, and prediction resumes from there.
//!
//! The previous version's chunk list reaches the chunking stage through a
//! bounded channel, fed a batch at a time by a loading thread ([`Loader`]),
//! and is held as a [`Window`] around the current position: memory stays
//! bounded whatever the version's size, and a version that moved data
//! further than the window only loses prediction there. Before cutting a
//! buffer the chunking stage waits, if need be, until the window reaches as
//! far as that buffer's chunks can: the loader reads far faster than data is
//! chunked, so this costs nothing once it is under way, and which chunks are
//! predicted does not depend on how the threads happen to run.
//!
//! In chunk mode an old chunk is a unit, and the loader reads its record
//! anyway: it pins the unit and passes its copy along with the prediction, so
//! the dedup stage references it without looking the chunk up in the index
//! (two reads per chunk, most of that stage's time in a profile).

use std::collections::VecDeque;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use rustc_hash::FxHashMap;

use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::container::CHUNK_ZERO;
use crate::format::fp::{is_zero, Fp};
use crate::format::recipe::Entry;
use crate::format::records::{RecipeForm, SeriesRecord, VersionRecord};
use crate::ingest::chunker::Chunker;
use crate::meta::MetaRead;
use crate::store::{Store, UnitCopy};

/// Old units per batch from the loader, once under way. The first batches
/// are smaller, doubling from 256: the chunking waits for the first, which
/// took 8 ms at full size.
const BATCH: usize = 4096;
const FIRST_BATCH: usize = 256;
/// Old chunks held ahead of and behind the position (about 512 MiB of data
/// each at 8 KiB chunks; 72 bytes per chunk plus its map entry, 14 MiB in
/// all).
const AHEAD: u64 = 1 << 16;
const BEHIND: u64 = 1 << 16;

/// A chunk of the previous version: what a prediction is checked against,
/// and in chunk mode the pinned copy a match dedups to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OldChunk {
    pub fp: Fp,
    pub len: u32,
    pub zero: bool,
    pub copy: Option<UnitCopy>,
}

/// The fingerprint of a chunk and whether it is all zeros. Long zero runs are
/// cut at the maximum size: their fingerprint is computed once, up front.
pub(crate) fn fingerprint(d: &[u8], max_len: usize, zero_fp_max: &Fp) -> (Fp, bool) {
    if is_zero(d) {
        (
            if d.len() == max_len {
                *zero_fp_max
            } else {
                Fp::of(d)
            },
            true,
        )
    } else {
        (Fp::of(d), false)
    }
}

/// The part of the previous version's chunk list around the current position.
pub(crate) struct Window {
    rx: Option<Receiver<Vec<OldChunk>>>,
    /// Old chunks to hold past the position before cutting a buffer (as many
    /// as one buffer can hold).
    need: u64,
    chunks: VecDeque<OldChunk>,
    /// Old index of `chunks[0]`.
    lo: u64,
    /// Latest old index of each fingerprint in the window.
    by_fp: FxHashMap<Fp, u64>,
    /// The old index the window is kept around: the last prediction's.
    at: u64,
}

impl Window {
    pub fn new(rx: Option<Receiver<Vec<OldChunk>>>, need: usize) -> Self {
        Window {
            rx,
            need: (need as u64).min(AHEAD),
            chunks: VecDeque::new(),
            lo: 0,
            by_fp: FxHashMap::default(),
            at: 0,
        }
    }

    fn get(&self, i: u64) -> Option<&OldChunk> {
        i.checked_sub(self.lo)
            .and_then(|k| self.chunks.get(usize::try_from(k).ok()?))
    }

    fn find(&self, fp: &Fp) -> Option<u64> {
        self.by_fp.get(fp).copied()
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Moves to `cursor` (if predicting), takes in old chunks up to
    /// [`AHEAD`] past it (waiting for the loader up to `need` past it, taking
    /// the rest if ready), and drops what lies more than [`BEHIND`] before it.
    fn advance(&mut self, cursor: Option<u64>) {
        if let Some(c) = cursor {
            self.at = c;
        }
        let at = self.at;
        loop {
            let end = self.lo + self.chunks.len() as u64;
            let Some(rx) = self.rx.as_ref().filter(|_| end < at + AHEAD) else {
                break;
            };
            let next = if end < at + self.need {
                rx.recv().ok()
            } else {
                match rx.try_recv() {
                    Ok(batch) => Some(batch),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            let Some(batch) = next else {
                // The whole list is in (or the loader stopped).
                self.rx = None;
                break;
            };
            for c in batch {
                let i = self.lo + self.chunks.len() as u64;
                self.by_fp.insert(c.fp, i);
                self.chunks.push_back(c);
            }
        }
        while self.lo + BEHIND < at {
            let Some(c) = self.chunks.pop_front() else {
                break;
            };
            if self.by_fp.get(&c.fp) == Some(&self.lo) {
                self.by_fp.remove(&c.fp);
            }
            self.lo += 1;
        }
    }
}

/// How a chunk's fingerprint became known while cutting it: the fingerprint,
/// whether the chunk is all zeros, and a copy of it the previous version
/// references when one is known (see [`OldChunk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    /// Not yet: the hashing stage computes it.
    No,
    /// Cut by scanning and hashed to look for it in the previous version.
    Probed(Fp, bool, Option<UnitCopy>),
    /// Predicted from the previous version and confirmed.
    Predicted(Fp, bool, Option<UnitCopy>),
}

impl Known {
    pub fn copy(&self) -> Option<UnitCopy> {
        match *self {
            Known::Predicted(_, _, c) | Known::Probed(_, _, c) => c,
            Known::No => None,
        }
    }
}

/// Chunks cut from a buffer, as (offset, length), with what is known of each.
#[derive(Default)]
pub(crate) struct Cuts {
    pub chunks: Vec<(u32, u32)>,
    pub known: Vec<Known>,
}

impl Cuts {
    fn push(&mut self, pos: usize, len: usize, k: Known) {
        self.chunks.push((pos as u32, len as u32));
        self.known.push(k);
    }
}

/// Cuts a stream into chunks a buffer at a time, following predictions from
/// the previous version when there is one.
pub(crate) struct Cutter {
    chunker: Chunker,
    window: Window,
    zero_fp_max: Fp,
    /// The old chunk predicted to start where the uncut rest begins.
    cursor: Option<u64>,
}

impl Cutter {
    pub fn new(chunker: Chunker, window: Window, zero_fp_max: Fp) -> Self {
        Cutter {
            chunker,
            window,
            zero_fp_max,
            cursor: None,
        }
    }

    /// Cuts the chunks of `data[start..]` whose ends are already certain and
    /// appends them to `out`; returns where the uncut rest begins. Unless
    /// `last` (the data runs to the end of its piece), the final `max` bytes
    /// may belong to a chunk that continues in the next read, so they are
    /// left uncut. The chunks are exactly those a scan from `start` cuts.
    ///
    /// A long span is cut in two halves at once, on two threads: the second
    /// half as if a chunk started at its middle, the first half's chunks
    /// continuing past the middle until one ends where one of the second
    /// half's begins. Cut points depend only on where a chunk starts, so from
    /// there on both agree; they meet within a chunk or two, except inside
    /// runs with no cut point (long zero runs), where the first half simply
    /// carries on alone.
    pub fn cut_span(&mut self, data: &[u8], start: usize, last: bool, out: &mut Cuts) -> usize {
        self.window.advance(self.cursor);
        let (pos, cursor) = self.span(data, start, last, out);
        self.cursor = cursor;
        pos
    }

    fn span(&self, data: &[u8], start: usize, last: bool, out: &mut Cuts) -> (usize, Option<u64>) {
        const PARALLEL_MIN: usize = 256 << 10;
        if data.len().saturating_sub(start) < PARALLEL_MIN {
            return self.chain(data, start, last, usize::MAX, self.cursor, out);
        }
        let mid = start + (data.len() - start) / 2;
        let mut right = Cuts::default();
        let ((mut pos, mut cur), (right_end, right_cur)) = rayon::join(
            || self.chain(data, start, last, mid, self.cursor, out),
            || self.chain(data, mid, last, usize::MAX, None, &mut right),
        );
        let mut i = 0;
        loop {
            while i < right.chunks.len() && (right.chunks[i].0 as usize) < pos {
                i += 1;
            }
            if i < right.chunks.len() && right.chunks[i].0 as usize == pos {
                out.chunks.extend_from_slice(&right.chunks[i..]);
                out.known.extend_from_slice(&right.known[i..]);
                return (right_end, right_cur);
            }
            if pos == right_end || !self.chunker.can_cut(data, pos, last) {
                return (pos, cur);
            }
            (pos, cur) = self.chain(data, pos, last, pos + 1, cur, out);
        }
    }

    /// Cuts chunks from `pos` while they can be cut and until one ends at or
    /// after `stop`, predicting from old chunk `cursor`.
    fn chain(
        &self,
        data: &[u8],
        mut pos: usize,
        last: bool,
        stop: usize,
        mut cursor: Option<u64>,
        out: &mut Cuts,
    ) -> (usize, Option<u64>) {
        let max_len = self.chunker.max_size();
        // Hashing a chunk here rather than in the hashing stage costs nothing
        // extra (both run on the same two workers), so with a previous
        // version to predict from every scanned chunk is a probe.
        let probe = !self.window.is_empty();
        while pos < stop && self.chunker.can_cut(data, pos, last) {
            if let Some((j, old)) = cursor.and_then(|j| Some((j, self.window.get(j)?))) {
                let len = old.len as usize;
                let rest = &data[pos..];
                // The cheap check first: would the chunker end a chunk there?
                if self.chunker.cuts_at(rest, len, last) {
                    let d = &rest[..len];
                    let same = if old.zero {
                        is_zero(d)
                    } else {
                        Fp::of(d) == old.fp
                    };
                    if same {
                        out.push(pos, len, Known::Predicted(old.fp, old.zero, old.copy));
                        pos += len;
                        cursor = Some(j + 1);
                        continue;
                    }
                }
            }
            cursor = None;
            let n = self.chunker.cut(&data[pos..]);
            if probe {
                let (fp, zero) = fingerprint(&data[pos..pos + n], max_len, &self.zero_fp_max);
                let found = self.window.find(&fp);
                cursor = found.map(|i| i + 1);
                let copy = found.and_then(|i| self.window.get(i)?.copy);
                out.push(pos, n, Known::Probed(fp, zero, copy));
            } else {
                out.push(pos, n, Known::No);
            }
            pos += n;
        }
        (pos, cursor)
    }
}

/// Reads the previous version's chunk list and feeds it to the [`Window`], on
/// its own thread ([`Loader::run`]), as far ahead as the channel allows.
/// Prediction only saves work, so a version it cannot read (archival form,
/// or removed meanwhile) just ends the list.
pub(crate) struct Loader {
    tx: Sender<Vec<OldChunk>>,
    /// Chunk mode: pass each unit's copy along (pinned).
    copies: bool,
    /// Units in the next batch.
    batch: usize,
    entries: std::vec::IntoIter<Entry>,
    /// The entry being expanded and how many of its chunks were sent.
    entry: Option<(Entry, u64)>,
    zero_fps: FxHashMap<u32, Fp>,
    max_len: usize,
    zero_fp_max: Fp,
}

impl Loader {
    /// A loader for `v` of `series`, and the window's end of the channel.
    pub fn new(
        r: &impl MetaRead,
        series: &SeriesRecord,
        v: &VersionRecord,
        max_len: usize,
        zero_fp_max: Fp,
    ) -> Option<(Loader, Receiver<Vec<OldChunk>>)> {
        if v.form != RecipeForm::Live {
            return None;
        }
        let parts = match crate::recipe::recipe_entries(r, series, v) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "no chunk prediction: the previous recipe is unreadable");
                return None;
            }
        };
        let (tx, rx) = crossbeam_channel::bounded((AHEAD as usize).div_ceil(BATCH));
        Some((
            Loader {
                tx,
                copies: series.unit == DedupUnit::Chunk,
                batch: FIRST_BATCH,
                entries: parts.into_iter().flatten().collect::<Vec<_>>().into_iter(),
                entry: None,
                zero_fps: FxHashMap::default(),
                max_len,
                zero_fp_max,
            },
            rx,
        ))
    }

    /// Sends the list a batch at a time until it is done or the window is
    /// gone. The ids of the units it pins go to `pinned`, for the backup to
    /// unpin once it has committed.
    pub fn run(mut self, store: &Store, pinned: &parking_lot::Mutex<Vec<u64>>) {
        loop {
            let batch = self.next_batch(store, &mut pinned.lock());
            match batch {
                Ok(Some(b)) => {
                    if self.tx.send(b).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "chunk prediction stops: the previous version is unreadable");
                    break;
                }
            }
        }
    }

    fn next_batch(
        &mut self,
        store: &Store,
        pinned: &mut Vec<u64>,
    ) -> Result<Option<Vec<OldChunk>>> {
        // Up to `batch` units' worth of entries, in order.
        let batch = self.batch as u64;
        self.batch = (self.batch * 2).min(BATCH);
        let mut plan: Vec<Entry> = Vec::new();
        let mut units = 0u64;
        while units < batch {
            let (e, done) = match self.entry.take() {
                Some(x) => x,
                None => match self.entries.next() {
                    Some(e) => (e, 0),
                    None => break,
                },
            };
            match e {
                Entry::Units { first, count } => {
                    let take = (count - done).min(batch - units);
                    plan.push(Entry::Units {
                        first: first + done,
                        count: take,
                    });
                    units += take;
                    if done + take < count {
                        self.entry = Some((e, done + take));
                    }
                }
                Entry::Zero { .. } => plan.push(e),
                // A live recipe holds nothing else.
                Entry::Direct { .. } | Entry::Indirect { .. } => {
                    self.entries = Vec::new().into_iter();
                    break;
                }
            }
        }
        if plan.is_empty() {
            return Ok(None);
        }
        let ids: Vec<u64> = plan
            .iter()
            .flat_map(|e| match *e {
                Entry::Units { first, count } => first..first + count,
                _ => 0..0,
            })
            .collect();
        let mut records = if self.copies {
            store.read_pin(&ids, pinned)?
        } else {
            crate::meta::load_units(&store.meta, &ids)?
                .into_iter()
                .map(|u| (u, None))
                .collect()
        }
        .into_iter();
        let mut out = Vec::with_capacity(batch as usize);
        for e in plan {
            match e {
                Entry::Units { count, .. } => {
                    for (u, copy) in records.by_ref().take(count as usize) {
                        // A chunk unit holds one chunk; anything else is no copy of one.
                        let copy = copy.filter(|_| u.chunks.len() == 1);
                        out.extend(u.chunks.iter().map(|c| OldChunk {
                            fp: c.fp,
                            len: c.len,
                            zero: c.flags & CHUNK_ZERO != 0,
                            copy,
                        }));
                    }
                }
                Entry::Zero { len, count } => {
                    let fp = *self.zero_fps.entry(len).or_insert_with(|| {
                        fingerprint(&vec![0u8; len as usize], self.max_len, &self.zero_fp_max).0
                    });
                    out.extend((0..count).map(|_| OldChunk {
                        fp,
                        len,
                        zero: true,
                        copy: None,
                    }));
                }
                _ => {}
            }
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SizeRange;
    use proptest::prelude::*;
    use rand::{Rng, RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random(n: usize, seed: u64) -> Vec<u8> {
        let mut v = vec![0u8; n];
        ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
        v
    }

    fn old_chunks(c: &Chunker, data: &[u8], zero_fp_max: &Fp) -> Vec<OldChunk> {
        let mut pos = 0;
        c.chunk_all(data)
            .into_iter()
            .map(|n| {
                let (fp, zero) = fingerprint(&data[pos..pos + n], c.max_size(), zero_fp_max);
                pos += n;
                OldChunk {
                    fp,
                    len: n as u32,
                    zero,
                    copy: None,
                }
            })
            .collect()
    }

    /// Cuts `data` as the chunking stage does: `buf`-byte reads, the uncut
    /// tail carried over.
    fn cut_all(cutter: &mut Cutter, data: &[u8], buf: usize) -> Cuts {
        let mut all = Cuts::default();
        let mut base = 0;
        loop {
            let end = (base + buf).min(data.len());
            let last = end == data.len();
            let mut cuts = Cuts::default();
            let rest = cutter.cut_span(&data[base..end], 0, last, &mut cuts);
            for (&(o, l), k) in cuts.chunks.iter().zip(&cuts.known) {
                all.push(base + o as usize, l as usize, *k);
            }
            if last && base + rest == end {
                return all;
            }
            base += rest;
        }
    }

    /// A new version: the old data with random inserts (some exactly where
    /// an old chunk ended, where the byte after the chunk changes), deletes,
    /// overwrites and zero runs, and more data at the end.
    fn edit(c: &Chunker, old: &[u8], rng: &mut ChaCha8Rng, edits: usize) -> Vec<u8> {
        let ends: Vec<usize> = c
            .chunk_all(old)
            .into_iter()
            .scan(0, |acc, n| {
                *acc += n;
                Some(*acc)
            })
            .collect();
        let mut v = old.to_vec();
        for e in 0..edits {
            let mut at = rng.random_range(0..=v.len());
            let n = rng.random_range(1..5000usize);
            if e % 2 == 0 {
                // Back to front, so this is (mostly) still an old chunk end.
                at = ends[ends.len() * (edits - e) / (edits + 1)].min(v.len());
            }
            match rng.random_range(0..4) {
                0 => {
                    let mut ins = vec![0u8; n];
                    rng.fill_bytes(&mut ins);
                    v.splice(at..at, ins);
                }
                1 => {
                    v.drain(at..(at + n).min(v.len()));
                }
                2 => {
                    let end = (at + n).min(v.len());
                    rng.fill_bytes(&mut v[at..end]);
                }
                _ => {
                    v.splice(at..at, std::iter::repeat_n(0u8, n * 20));
                }
            }
        }
        v
    }

    fn check(range: SizeRange, seed: u64, edits: usize, buf: usize) {
        let c = Chunker::new(range);
        let zfp = Fp::of(&vec![0u8; c.max_size()]);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut old = random(3 << 20, seed);
        old[1 << 20..(1 << 20) + 300_000].fill(0);
        let mut new = edit(&c, &old, &mut rng, edits);
        let mut more = vec![0u8; rng.random_range(0..3000usize)];
        rng.fill_bytes(&mut more);
        new.extend_from_slice(&more);
        let (tx, rx) = crossbeam_channel::unbounded();
        for b in old_chunks(&c, &old, &zfp).chunks(BATCH) {
            tx.send(b.to_vec()).unwrap();
        }
        drop(tx);
        let mut cutter = Cutter::new(c.clone(), Window::new(Some(rx), c.most_chunks(buf)), zfp);
        let got = cut_all(&mut cutter, &new, buf);
        // Exactly the chunks a full scan cuts ...
        let mut pos = 0;
        let want: Vec<(u32, u32)> = c
            .chunk_all(&new)
            .into_iter()
            .map(|n| {
                pos += n;
                ((pos - n) as u32, n as u32)
            })
            .collect();
        assert_eq!(got.chunks, want);
        // ... with the right fingerprints for those it hashed ...
        let mut predicted = 0;
        for (&(o, l), k) in got.chunks.iter().zip(&got.known) {
            let d = &new[o as usize..(o + l) as usize];
            match *k {
                Known::Predicted(fp, z, _) | Known::Probed(fp, z, _) => {
                    assert_eq!((fp, z), fingerprint(d, c.max_size(), &zfp))
                }
                Known::No => {}
            }
            if matches!(k, Known::Predicted(..)) {
                predicted += l as usize;
            }
        }
        // ... and most of an edited copy predicted rather than scanned.
        assert!(
            predicted * 10 > new.len() * 7,
            "predicted {predicted} of {}",
            new.len()
        );
    }

    /// The chunks of `d[start..]` one after another, as `Cutter::cut_span` must return them.
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
        let c = Chunker::new(crate::config::StoreConfig::default().chunk);
        let zfp = Fp::of(&vec![0u8; c.max_size()]);
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
                // Nothing to predict from: every chunk is scanned for.
                let mut cutter = Cutter::new(c.clone(), Window::new(None, 0), zfp);
                let mut out = Cuts::default();
                out.push(7, 7, Known::No);
                let pos = cutter.cut_span(d, start, last, &mut out);
                let (want, want_pos) = cut_sequentially(&c, d, start, last);
                assert_eq!(out.chunks[0], (7, 7), "chunks already in the list are kept");
                assert_eq!(
                    out.chunks[1..],
                    want[..],
                    "span {start}..{end}, last {last}"
                );
                assert!(out.known.iter().all(|k| *k == Known::No));
                assert_eq!(pos, want_pos, "span {start}..{end}, last {last}");
            }
        }
    }

    #[test]
    fn predicted_chunks_are_the_scanned_ones() {
        check(crate::config::StoreConfig::default().chunk, 1, 20, 1 << 20);
        check(crate::config::StoreConfig::default().chunk, 2, 0, 1 << 20);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn predicted_chunks_are_the_scanned_ones_for_any_edits(
            seed in any::<u64>(),
            edits in 0usize..40,
            buf in prop::sample::select(vec![5000usize, 300 << 10, 1 << 20]),
        ) {
            let small = SizeRange { min: 64, avg: 256, max: 1024 };
            check(small, seed, edits, buf);
        }
    }
}
