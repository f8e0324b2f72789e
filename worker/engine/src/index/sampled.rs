//! The sampled, progressive index of "Rethinking Deduplication Scalability" (Efstathopoulos &
//! Guo, §3.1; ../shared/papers/001): what a backup looks its fingerprints up in when the exact
//! index no longer fits in memory.
//!
//! - **The sample**: for one fingerprint in 2^`shift`, the newest unit holding it, in memory.
//!   A fingerprint is sampled when its first 64 bits are below 2^(64 − shift). A fingerprint is
//!   a hash, so that is a uniform sample — and a *key range* of the exact index, so rebuilding
//!   the sample at open reads the sample and nothing else.
//! - **Locality**: a hit loads the hit unit's *neighbourhood* — the units with neighbouring ids
//!   — into a cache, and the fingerprints that follow in the stream are found there. The paper
//!   prefetches the hit container's fingerprint list; unit ids are handed out in the order a
//!   backup writes new data, so a block of consecutive ids is the same neighbourhood, and it
//!   stays one when slides move units between containers.
//! - **Progression**: the rate starts at 1 and halves (`shift` + 1, dropping the entries no
//!   longer sampled: the paper's "mod T" resampling) whenever the sample outgrows its share of
//!   the memory budget, so a small store is indexed exactly and a large one within the budget.
//!
//! The exact index (`CF_INDEX`, [`crate::index::FullIndex`]) stays on disk: commits keep it,
//! `check` verifies it, and it is the sample's persistent copy. This index only decides what a
//! backup *tries* to deduplicate against: every candidate still goes through
//! `Store::lookup_pin`'s pin and record check, so a stale or wrong hint costs a duplicate copy,
//! never data.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::config::DedupUnit;
use crate::error::Result;
use crate::format::fp::Fp;
use crate::format::keys::{index_key, CF_INDEX, CF_UNITS};
use crate::format::unit::UnitRecord;
use crate::index::full::decode_copies;
use crate::index::FingerprintIndex;
use crate::meta::Meta;

/// Bytes one entry of a `FxHashMap<u64, u64>` takes: key, value and control byte, over the
/// map's 7/8 load factor.
const MAP_ENTRY_BYTES: usize = (8 + 8 + 1) * 8 / 7;
/// Bytes a cached entry takes beyond its map entry: its line in its block's eviction list.
const BLOCK_LINE_BYTES: usize = 16;
/// The sample's share of the memory budget; the cache has the rest.
const SAMPLE_SHARE: f64 = 0.5;

/// Units per neighbourhood, as a power of two: at least 1024 chunks (~8 MiB of data, two
/// containers) or 16 segments (~16 MiB, four containers), and enough that a neighbourhood
/// holds 16 sampled fingerprints on average (the paper's containers of ~1000 segments at
/// rates down to 1%), or a stream would run through neighbourhoods no sample leads to.
fn block_bits(kind: DedupUnit, shift: u32) -> u32 {
    let least = match kind {
        DedupUnit::Chunk => 10,
        DedupUnit::Segment => 4,
    };
    least.max(shift + 4).min(40)
}

fn slot(kind: DedupUnit) -> usize {
    match kind {
        DedupUnit::Segment => 0,
        DedupUnit::Chunk => 1,
    }
}

/// The first 64 bits of a fingerprint: the sample's and the cache's key. Two fingerprints
/// sharing them (about one pair in 2^64/n²) make a wrong hint, which the record check drops.
pub fn prefix(fp: &Fp) -> u64 {
    u64::from_be_bytes(fp.0[..8].try_into().expect("32-byte fingerprint"))
}

/// What the index holds and has done, for `stats` and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampledStats {
    /// Sampling rate 2^-shift.
    pub shift: u32,
    pub sampled: usize,
    pub cached: usize,
    pub cached_blocks: usize,
    /// Bytes the budget counts: the entries the sample and the cache hold.
    pub ram_bytes: usize,
    /// Bytes the index has allocated: hash tables round their sizes up, so this is up to
    /// about twice `ram_bytes` right after a table has grown.
    pub allocated_bytes: usize,
    pub lookups: u64,
    pub sample_hits: u64,
    pub cache_hits: u64,
    pub blocks_loaded: u64,
}

type Block = (DedupUnit, u32, u64);

pub struct SampledIndex {
    budget: usize,
    shift: u32,
    /// Per kind (see [`slot`]): fingerprint prefix → newest unit holding it.
    sample: [FxHashMap<u64, u64>; 2],
    /// Per kind: fingerprint prefix → newest unit of the cached neighbourhoods holding it.
    cache: [FxHashMap<u64, u64>; 2],
    /// Cached neighbourhoods (kind, size in bits, number), each with the entries it put in
    /// the cache, and their order of loading (the oldest is evicted first).
    blocks: FxHashMap<Block, Vec<(u64, u64)>>,
    order: VecDeque<Block>,
    cached_lines: usize,
    stats: SampledStats,
}

impl SampledIndex {
    /// An empty index that will hold at most about `budget` bytes, sampling at the rate that
    /// fits `units` stored units.
    pub fn new(budget: usize, units: u64) -> SampledIndex {
        let mut shift = 0;
        while (units >> shift) as f64 * MAP_ENTRY_BYTES as f64 > budget as f64 * SAMPLE_SHARE
            && shift < 63
        {
            shift += 1;
        }
        SampledIndex {
            budget,
            shift,
            sample: Default::default(),
            cache: Default::default(),
            blocks: FxHashMap::default(),
            order: VecDeque::new(),
            cached_lines: 0,
            stats: SampledStats::default(),
        }
    }

    /// Builds the sample from the exact index: for each kind, the key range of the sampled
    /// fingerprints. The rate first fits the store's unit count (an upper bound on its
    /// fingerprints), then doubles while twice the sample still fits, reading each time only
    /// the range it adds.
    pub fn open(meta: &Meta, budget: usize, units: u64) -> Result<SampledIndex> {
        let mut ix = SampledIndex::new(budget, units);
        ix.load_range(meta, 0, ix.shift)?;
        while ix.shift > 0 && (ix.sample_bytes() * 2) as f64 <= budget as f64 * SAMPLE_SHARE {
            let from = 1u128 << (64 - ix.shift);
            ix.shift -= 1;
            ix.load_range(meta, from, ix.shift)?;
        }
        ix.resample();
        Ok(ix)
    }

    /// Adds the exact index's entries whose prefix lies in `from..2^(64 - shift)`.
    fn load_range(&mut self, meta: &Meta, from: u128, shift: u32) -> Result<()> {
        let to = 1u128 << (64 - shift);
        for kind in [DedupUnit::Segment, DedupUnit::Chunk] {
            let key = |p: u128| {
                let mut k = index_key(kind, &Fp([0; 32])).to_vec();
                if p > u128::from(u64::MAX) {
                    k.truncate(1);
                    k[0] += 1; // past the last key of this kind
                } else {
                    k[1..9].copy_from_slice(&(p as u64).to_be_bytes());
                }
                k
            };
            let sample = &mut self.sample[slot(kind)];
            meta.for_each_range(CF_INDEX, &key(from), &key(to), |k, v| {
                if let (Ok(fp), Some(copies)) = (k[1..].try_into().map(Fp), decode_copies(v)) {
                    sample.insert(prefix(&fp), copies[0]);
                }
                Ok(true)
            })?;
        }
        Ok(())
    }

    fn sampled(&self, p: u64) -> bool {
        self.shift == 0 || p >> (64 - self.shift) == 0
    }

    /// The units that may hold each fingerprint (one hint at most), in `fps` order. Sample
    /// hits anywhere in the batch load their neighbourhoods first, so a fingerprint early in
    /// the batch is found in a neighbourhood a later one led to.
    pub fn copies_many(
        &mut self,
        meta: &Meta,
        kind: DedupUnit,
        fps: &[Fp],
    ) -> Result<Vec<Vec<u64>>> {
        let s = slot(kind);
        self.stats.lookups += fps.len() as u64;
        for fp in fps {
            let p = prefix(fp);
            if self.cache[s].contains_key(&p) || !self.sampled(p) {
                continue;
            }
            if let Some(&unit) = self.sample[s].get(&p) {
                self.stats.sample_hits += 1;
                self.load_block(meta, kind, unit)?;
            }
        }
        let hints = fps
            .iter()
            .map(|fp| {
                let p = prefix(fp);
                match self.cache[s].get(&p) {
                    Some(&u) => {
                        self.stats.cache_hits += 1;
                        vec![u]
                    }
                    None => self.sample[s].get(&p).map(|&u| vec![u]).unwrap_or_default(),
                }
            })
            .collect();
        // Only now: the batch's own neighbourhoods must not push each other out before
        // the batch is resolved.
        self.evict();
        Ok(hints)
    }

    /// Loads the neighbourhood of `unit` into the cache, unless it is there.
    fn load_block(&mut self, meta: &Meta, kind: DedupUnit, unit: u64) -> Result<()> {
        let bits = block_bits(kind, self.shift);
        let block = unit >> bits;
        if self.blocks.contains_key(&(kind, bits, block)) {
            return Ok(());
        }
        self.stats.blocks_loaded += 1;
        let from = (block << bits).to_be_bytes().to_vec();
        // Past the last id of the block; past every id for the last block (9 bytes sort
        // after any 8).
        let to = match (block + 1)
            .checked_shl(bits)
            .filter(|e| e >> bits == block + 1)
        {
            Some(end) => end.to_be_bytes().to_vec(),
            None => vec![0xff; 9],
        };
        let mut lines = Vec::new();
        meta.for_each_range(CF_UNITS, &from, &to, |k, v| {
            // A key or record that does not decode is `check`'s to report; a hint can do
            // without it.
            let Ok(id) = k.try_into().map(u64::from_be_bytes) else {
                return Ok(true);
            };
            if let Ok((k, false, fp)) = UnitRecord::decode_key(id, v) {
                if k == kind {
                    lines.push((prefix(&fp), id));
                }
            }
            Ok(true)
        })?;
        let s = slot(kind);
        for &(p, id) in &lines {
            let e = self.cache[s].entry(p).or_insert(id);
            *e = (*e).max(id);
        }
        self.cached_lines += lines.len();
        self.blocks.insert((kind, bits, block), lines);
        self.order.push_back((kind, bits, block));
        Ok(())
    }

    /// Drops the oldest neighbourhoods while the index is over its budget (the newest one
    /// stays: the backup is reading it). Between a batch's loads and this, the cache may
    /// exceed its share by the neighbourhoods of one batch.
    fn evict(&mut self) {
        while self.ram_bytes() > self.budget && self.order.len() > 1 {
            let key = self.order.pop_front().expect("more than one");
            let kind = key.0;
            let lines = self.blocks.remove(&key).unwrap_or_default();
            self.cached_lines -= lines.len();
            // A fingerprint another cached neighbourhood holds too goes with the one whose
            // unit the cache names: a later lookup of it misses (a copy more, no harm).
            let cache = &mut self.cache[slot(kind)];
            for (p, id) in lines {
                if cache.get(&p) == Some(&id) {
                    cache.remove(&p);
                }
            }
        }
    }

    /// Learns what a commit wrote: `lists` holds, for every fingerprint the commit touched,
    /// its copies after it (newest first; empty when none is left).
    pub fn committed<'a>(
        &mut self,
        lists: impl IntoIterator<Item = (&'a (DedupUnit, Fp), &'a Vec<u64>)>,
    ) {
        for ((kind, fp), copies) in lists {
            let (s, p) = (slot(*kind), prefix(fp));
            match copies.first() {
                None => {
                    self.sample[s].remove(&p);
                    self.cache[s].remove(&p);
                }
                Some(&u) => {
                    if self.sampled(p) {
                        self.sample[s].insert(p, u);
                    }
                    let bits = block_bits(*kind, self.shift);
                    let block = (*kind, bits, u >> bits);
                    if let Some(lines) = self.blocks.get_mut(&block) {
                        if self.cache[s].insert(p, u) != Some(u) {
                            lines.push((p, u));
                            self.cached_lines += 1;
                        }
                    } else if self.cache[s].get(&p).is_some_and(|c| !copies.contains(c)) {
                        // Its cached copy is gone; the new one's neighbourhood is not cached.
                        self.cache[s].remove(&p);
                    }
                }
            }
        }
        self.resample();
    }

    /// Halves the sampling rate until the sample fits its share of the budget, then trims
    /// the cache to the rest.
    fn resample(&mut self) {
        let share = self.budget as f64 * SAMPLE_SHARE;
        while self.sample_bytes() as f64 > share && self.shift < 63 {
            self.shift += 1;
            if [DedupUnit::Chunk, DedupUnit::Segment]
                .iter()
                .any(|&k| block_bits(k, self.shift) != block_bits(k, self.shift - 1))
            {
                // Neighbourhoods grow: cached ones of the old size would overlap new ones.
                self.clear_cache();
            }
            let limit = 1u64 << (64 - self.shift);
            for m in &mut self.sample {
                m.retain(|p, _| *p < limit);
                m.shrink_to_fit();
            }
        }
        self.evict();
    }

    fn clear_cache(&mut self) {
        self.cache = Default::default();
        self.blocks.clear();
        self.order.clear();
        self.cached_lines = 0;
    }

    fn sample_bytes(&self) -> usize {
        self.sample.iter().map(|m| m.len()).sum::<usize>() * MAP_ENTRY_BYTES
    }

    /// The memory the index takes, estimated from what it holds.
    pub fn ram_bytes(&self) -> usize {
        let cache: usize = self.cache.iter().map(|m| m.len()).sum();
        self.sample_bytes() + cache * MAP_ENTRY_BYTES + self.cached_lines * BLOCK_LINE_BYTES
    }

    fn allocated_bytes(&self) -> usize {
        let tables: usize = self
            .sample
            .iter()
            .chain(&self.cache)
            .map(|m| m.capacity())
            .sum();
        let lines: usize = self.blocks.values().map(|l| l.capacity()).sum();
        tables * MAP_ENTRY_BYTES + lines * BLOCK_LINE_BYTES
    }

    /// Test hook: makes the sample name `unit` for `fp`, as a 64-bit collision would.
    #[cfg(test)]
    pub(crate) fn forge(&mut self, kind: DedupUnit, fp: &Fp, unit: u64) {
        self.sample[slot(kind)].insert(prefix(fp), unit);
    }

    pub fn stats(&self) -> SampledStats {
        SampledStats {
            shift: self.shift,
            sampled: self.sample.iter().map(|m| m.len()).sum(),
            cached: self.cache.iter().map(|m| m.len()).sum(),
            cached_blocks: self.order.len(),
            ram_bytes: self.ram_bytes(),
            allocated_bytes: self.allocated_bytes(),
            ..self.stats
        }
    }
}

/// The sampled index behind [`FingerprintIndex`]: what `Store::lookup_pin` reads through.
pub struct SampledLookup<'a> {
    pub index: &'a parking_lot::Mutex<SampledIndex>,
    pub meta: &'a Meta,
}

impl FingerprintIndex for SampledLookup<'_> {
    fn copies(&self, kind: DedupUnit, fp: &Fp) -> Result<Vec<u64>> {
        Ok(self
            .copies_many(kind, std::slice::from_ref(fp))?
            .pop()
            .unwrap_or_default())
    }

    fn copies_many(&self, kind: DedupUnit, fps: &[Fp]) -> Result<Vec<Vec<u64>>> {
        self.index.lock().copies_many(self.meta, kind, fps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::container::{ChunkEntry, ContainerId};
    use crate::index::full;

    /// A store's metadata holding `n` chunk units written in order (ids 1..=n), their
    /// fingerprints `fp(i)` in the exact index.
    fn written(n: u64) -> (tempfile::TempDir, Meta) {
        let dir = tempfile::tempdir().unwrap();
        let meta = Meta::create(&dir.path().join("meta")).unwrap();
        let mut b = meta.batch();
        for id in 1..=n {
            put(&mut b, id, id);
        }
        meta.write(b, false).unwrap();
        (dir, meta)
    }

    fn fp(i: u64) -> Fp {
        Fp::of(&i.to_le_bytes())
    }

    fn put(b: &mut crate::meta::Batch<'_>, id: u64, content: u64) {
        let u = UnitRecord {
            kind: DedupUnit::Chunk,
            fp: fp(content),
            container: ContainerId::new(1, id >> 9),
            vbase: 0,
            trimmed: false,
            domain: 0,
            chunks: vec![ChunkEntry::new(0, 8192, fp(content))],
        };
        b.put_unit(id, &u);
        full::stage(b, DedupUnit::Chunk, &u.fp, &[id]);
    }

    /// Looks the stream `1..=n` up in batches of 256, as a backup does; returns how many
    /// were found and whether every hint named the unit of its fingerprint.
    fn look_up_stream(ix: &mut SampledIndex, meta: &Meta, n: u64) -> (u64, bool) {
        let (mut found, mut right) = (0, true);
        let ids: Vec<u64> = (1..=n).collect();
        for batch in ids.chunks(256) {
            let fps: Vec<Fp> = batch.iter().map(|&i| fp(i)).collect();
            for (&i, hint) in batch
                .iter()
                .zip(ix.copies_many(meta, DedupUnit::Chunk, &fps).unwrap())
            {
                if !hint.is_empty() {
                    found += 1;
                    right &= hint == vec![i];
                }
            }
        }
        (found, right)
    }

    #[test]
    fn a_hint_to_a_unit_of_another_fingerprint_is_no_copy_and_leaves_no_pin() {
        use crate::ingest::{backup, BackupOptions};
        use crate::source::StreamSource;
        use crate::store::{InitOptions, OpenMode, Store};
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let mut st = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        st.use_sampled_index(1 << 20).unwrap();
        let data: Vec<u8> = (0..3u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let opts = BackupOptions {
            unit: Some(DedupUnit::Chunk),
            ..Default::default()
        };
        let src = StreamSource::new("data", std::io::Cursor::new(data));
        backup(&st, "t/a", Box::new(src), &opts).unwrap();
        // Some stored unit, and a fingerprint the store does not hold that the sample now
        // says it does.
        let (unit, _) = st
            .meta
            .scan_prefix(CF_UNITS, b"")
            .unwrap()
            .into_iter()
            .next()
            .map(|(k, v)| {
                let id = u64::from_be_bytes(k[..8].try_into().unwrap());
                (id, UnitRecord::decode_key(id, &v).unwrap())
            })
            .unwrap();
        let stranger = Fp::of(b"never stored");
        st.sampled
            .as_ref()
            .unwrap()
            .lock()
            .forge(DedupUnit::Chunk, &stranger, unit);
        let mut pinned = Vec::new();
        let found = st
            .lookup_pin(
                DedupUnit::Chunk,
                &[stranger],
                &crate::store::domain::DedupScope::Any,
                &mut pinned,
            )
            .unwrap();
        assert!(
            found[&stranger].is_empty(),
            "a unit of another fingerprint is no copy"
        );
        assert!(pinned.is_empty(), "{pinned:?}");
        assert!(
            !st.pins.lock().pins.contains_key(&unit),
            "the forged unit stays unpinned"
        );
    }

    #[test]
    fn a_small_store_is_indexed_whole() {
        let (_d, meta) = written(5000);
        let mut ix = SampledIndex::open(&meta, 64 << 20, 5000).unwrap();
        assert_eq!(ix.stats().shift, 0);
        assert_eq!(ix.stats().sampled, 5000);
        assert_eq!(look_up_stream(&mut ix, &meta, 5000), (5000, true));
    }

    #[test]
    fn a_sampled_store_finds_a_stream_through_its_neighbourhoods_within_the_budget() {
        let n = 100_000;
        let (_d, meta) = written(n);
        // Room for about 1/20 of the fingerprints: the rate drops to 1/32.
        let budget = (n as usize / 20) * MAP_ENTRY_BYTES * 2;
        let mut ix = SampledIndex::open(&meta, budget, n).unwrap();
        let st = ix.stats();
        assert_eq!(st.shift, 5, "{st:?}");
        let expected = n as f64 / 32.0;
        assert!(
            (st.sampled as f64 - expected).abs() < expected * 0.2,
            "{st:?}"
        );
        let (found, right) = look_up_stream(&mut ix, &meta, n);
        assert!(right, "a hint named the wrong unit");
        // A neighbourhood of 1024 units holds ~32 sampled ones: a stream read in order misses
        // only what comes before the first sample of each neighbourhood in its batch.
        assert!(found as f64 >= n as f64 * 0.99, "found {found} of {n}");
        assert!(ix.ram_bytes() <= budget, "{} > {budget}", ix.ram_bytes());
        // Fingerprints never stored are not found.
        let absent: Vec<Fp> = (n + 1..n + 1000).map(fp).collect();
        let hints = ix.copies_many(&meta, DedupUnit::Chunk, &absent).unwrap();
        assert!(hints.iter().all(|h| h.is_empty()));
    }

    #[test]
    fn the_rate_halves_as_commits_grow_the_store_and_follows_their_copies() {
        let budget = 2000 * MAP_ENTRY_BYTES * 2;
        let mut ix = SampledIndex::new(budget, 0);
        let mut lists = FxHashMap::default();
        for id in 1..=20_000u64 {
            lists.insert((DedupUnit::Chunk, fp(id)), vec![id]);
        }
        ix.committed(&lists);
        let st = ix.stats();
        assert_eq!(st.shift, 4, "{st:?}");
        assert!(st.sampled <= 2000, "{st:?}");
        // A commit that frees a sampled fingerprint's only copy drops it; one that writes a
        // newer copy points the sample there.
        let sampled: Vec<u64> = (1..=20_000)
            .filter(|&i| ix.sampled(prefix(&fp(i))))
            .collect();
        let (gone, moved) = (sampled[0], sampled[1]);
        let mut lists = FxHashMap::default();
        lists.insert((DedupUnit::Chunk, fp(gone)), vec![]);
        lists.insert((DedupUnit::Chunk, fp(moved)), vec![30_000, moved]);
        ix.committed(&lists);
        assert_eq!(
            ix.sample[slot(DedupUnit::Chunk)].get(&prefix(&fp(gone))),
            None
        );
        assert_eq!(
            ix.sample[slot(DedupUnit::Chunk)].get(&prefix(&fp(moved))),
            Some(&30_000)
        );
    }
}
