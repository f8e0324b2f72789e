//! The sampled index at scale, without the bytes (`revault bench index`): a synthetic
//! fingerprint stream of many series drives a real store's sampled index and commit path
//! until the store holds the logical size asked for, and a point is reported at each step.
//!
//! What runs for real: a backup's lookups (`Store::lookup_pin`: [`Store::use_sampled_index`]'s
//! index with its neighbourhood loads and progressive resampling, then the pins and record
//! reads of what it names) and [`Store::commit`] for every new unit (unit records, reference
//! counts, the exact index on disk, container records), in sessions of up to 65,536 units. A
//! chunk-mode backup predicts most chunks from its previous version without a lookup; here
//! every fingerprint is looked up, which is more work than a backup does. What does not: chunking, compression and container files (no bytes exist), and
//! recipes (a version's recipe is written once and read at restore: it does not touch the
//! index). Unit records hold one chunk entry, so the metadata on disk is smaller than a real
//! store's; the index's entries are the real ones.
//!
//! The stream is modelled on the kube series (docs/benchmarks.md): each version of a series
//! keeps its previous version and changes about 1% of its chunks in short runs, plus a little
//! growth; series come in families of four whose first versions share 80% of their content
//! (replicas, one application per tenant). In segment mode each run of changed chunks changes
//! one segment, so about one segment in six changes per version, as on kube. Content is a
//! counter, a fingerprint its hash: whether a lookup *should* find a copy is known exactly,
//! which gives `dedup_vs_exact` without an exact index beside the sampled one.

use std::time::Instant;

use serde::Serialize;

use crate::config::{DedupUnit, KIB, MIB};
use crate::error::Result;
use crate::format::container::ChunkEntry;
use crate::format::fp::Fp;
use crate::format::keys::CF_INDEX;
use crate::format::records::ContainerRecord;
use crate::format::refcounts::Refs;
use crate::format::unit::UnitRecord;
use crate::store::commit::Txn;
use crate::store::domain::DedupScope;
use crate::store::Store;

const TIB: f64 = (1u64 << 40) as f64;
/// Fingerprints looked up at once, as a backup's dedup stage batches them: a chunk-mode
/// backup looks up a hashing block's chunks together (1 MiB, ~128 chunks), a segment-mode
/// one each segment as it closes.
fn batch(kind: DedupUnit) -> usize {
    match kind {
        DedupUnit::Chunk => 128,
        DedupUnit::Segment => 1,
    }
}
/// New units committed at most per commit.
const COMMIT_UNITS: usize = 65_536;

#[derive(Clone, Debug)]
pub struct IndexBenchOptions {
    pub unit: DedupUnit,
    /// The store grows to this many TiB of logical (backed-up) data.
    pub logical_tib: f64,
    /// The sampled index's memory budget.
    pub budget_bytes: usize,
    pub series: u32,
    /// The average size of a series' volume: 1 GiB in chunk mode, 16 GiB in segment mode
    /// unless set (each volume is 0.5 to 2 times it).
    pub volume_bytes: Option<u64>,
    /// Points reported (evenly spaced in logical size).
    pub points: u32,
    pub seed: u64,
}

impl Default for IndexBenchOptions {
    fn default() -> Self {
        IndexBenchOptions {
            unit: DedupUnit::Segment,
            logical_tib: 1.0,
            budget_bytes: 256 << 20,
            series: 16,
            volume_bytes: None,
            points: 10,
            seed: 1,
        }
    }
}

/// One store size.
#[derive(Clone, Debug, Serialize)]
pub struct IndexBenchPoint {
    pub logical_tib: f64,
    /// What the store holds: new units times their average size.
    pub unique_tib: f64,
    /// Fingerprints looked up per second of lookup time since the point before: the index,
    /// the neighbourhood loads it makes, and pinning and reading the records it names.
    pub fingerprints_per_sec: f64,
    /// Fingerprints per second of everything since the point before: lookups, and the
    /// commits of the new units (the exact index on disk, unit records, reference counts).
    pub ingest_fingerprints_per_sec: f64,
    /// Memory the sampled index has allocated (its tables and neighbourhood lists).
    pub index_ram_bytes: u64,
    /// The exact index on disk (RocksDB tables and memtables): the sample's persistent copy.
    pub index_disk_bytes: u64,
    /// Duplicate bytes the index found over the duplicate bytes an exact index finds.
    pub dedup_vs_exact: f64,
    /// The sampling rate at this size (1 = every fingerprint).
    pub sampling_rate: f64,
    pub versions: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct IndexBenchReport {
    pub unit: DedupUnit,
    pub series: u32,
    pub budget_bytes: u64,
    /// Average bytes one fingerprint stands for.
    pub unit_bytes: u64,
    pub points: Vec<IndexBenchPoint>,
    pub seconds: f64,
}

/// Runs the benchmark on `store` (new and empty), calling `on_point` as each point is
/// measured.
pub fn bench_index(
    store: &mut Store,
    opts: &IndexBenchOptions,
    mut on_point: impl FnMut(&IndexBenchPoint),
) -> Result<IndexBenchReport> {
    store.use_sampled_index(opts.budget_bytes)?;
    let unit_bytes = match opts.unit {
        DedupUnit::Chunk => 8 * KIB,
        DedupUnit::Segment => MIB,
    };
    let mut stream = Stream::new(opts, unit_bytes);
    let target = opts.logical_tib * TIB;
    let step = target / f64::from(opts.points.max(1));
    let (start, mut since) = (Instant::now(), Instant::now());
    let mut tally = Tally::default();
    let mut lookups_since = 0u64;
    let mut index_secs_before = 0.0;
    let mut points = Vec::new();
    while (points.len() as u32) < opts.points.max(1) {
        let (ids, watermark) = stream.next_version();
        let before = tally.lookups;
        back_up(
            store,
            opts.unit,
            unit_bytes,
            &ids,
            watermark,
            stream.seed,
            &mut tally,
        )?;
        lookups_since += tally.lookups - before;
        let logical = tally.lookups as f64 * unit_bytes as f64;
        if logical >= step * (points.len() + 1) as f64 {
            let st = store
                .sampled_index_stats()
                .expect("the bench uses a sampled index");
            let p = IndexBenchPoint {
                logical_tib: logical / TIB,
                unique_tib: tally.new_units as f64 * unit_bytes as f64 / TIB,
                fingerprints_per_sec: lookups_since as f64 / (tally.index_secs - index_secs_before),
                ingest_fingerprints_per_sec: lookups_since as f64 / since.elapsed().as_secs_f64(),
                index_ram_bytes: st.allocated_bytes as u64,
                index_disk_bytes: store.meta.cf_bytes(CF_INDEX)?,
                dedup_vs_exact: if tally.exact_dups == 0 {
                    1.0
                } else {
                    tally.found_dups as f64 / tally.exact_dups as f64
                },
                sampling_rate: 1.0 / (1u64 << st.shift) as f64,
                versions: tally.versions,
            };
            on_point(&p);
            points.push(p);
            lookups_since = 0;
            index_secs_before = tally.index_secs;
            since = Instant::now();
        }
    }
    Ok(IndexBenchReport {
        unit: opts.unit,
        series: opts.series,
        budget_bytes: opts.budget_bytes as u64,
        unit_bytes,
        points,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[derive(Default)]
struct Tally {
    lookups: u64,
    /// Seconds spent in the index's lookups.
    index_secs: f64,
    new_units: u64,
    exact_dups: u64,
    found_dups: u64,
    versions: u64,
}

/// One version through the index: every fingerprint looked up as a backup does
/// (`Store::lookup_pin`: the index, then pinning and reading the records it names); what is
/// not found is a new unit, committed in sessions of at most [`COMMIT_UNITS`] units.
fn back_up(
    store: &Store,
    kind: DedupUnit,
    unit_bytes: u64,
    ids: &[u64],
    watermark: u64,
    seed: u64,
    tally: &mut Tally,
) -> Result<()> {
    let mut new = Vec::new();
    let mut pinned = Vec::new();
    for batch in ids.chunks(batch(kind)) {
        let fps: Vec<Fp> = batch.iter().map(|&c| fingerprint(c, seed)).collect();
        let t = Instant::now();
        let found = store.lookup_pin(kind, &fps, &DedupScope::Any, &mut pinned)?;
        tally.index_secs += t.elapsed().as_secs_f64();
        for (&content, fp) in batch.iter().zip(fps) {
            tally.lookups += 1;
            let duplicate = content < watermark;
            tally.exact_dups += u64::from(duplicate);
            if found.get(&fp).is_some_and(|c| !c.is_empty()) {
                // Found means a usable copy of this very fingerprint (the record check
                // drops a hint to another one), so only duplicates are ever found.
                tally.found_dups += u64::from(duplicate);
            } else {
                new.push(fp);
            }
        }
    }
    // The new units are committed when the version is (a backup's commit): until then
    // its own repeats are not in the index, as the stream has none.
    let result = new
        .chunks(COMMIT_UNITS)
        .try_for_each(|part| commit_units(store, kind, unit_bytes, part));
    store.unpin(pinned);
    result?;
    tally.new_units += new.len() as u64;
    tally.versions += 1;
    Ok(())
}

/// Commits `fps` as new units, packed into containers of 4 MiB in stream order.
fn commit_units(store: &Store, kind: DedupUnit, unit_bytes: u64, fps: &[Fp]) -> Result<()> {
    let mut session = store.begin_session("bench-index")?;
    let alloc = session.allocator();
    let per_container = (4 * MIB / unit_bytes).max(1) as usize;
    let mut txn = Txn {
        session: Some(session.id),
        ..Default::default()
    };
    for group in fps.chunks(per_container) {
        let container = alloc.next();
        let vbytes = unit_bytes * group.len() as u64;
        txn.new_containers.push((
            container,
            ContainerRecord {
                file_bytes: vbytes / 2,
                vbytes,
                live_vbytes: vbytes,
                live_units: group.len() as u64,
                owner: None,
            },
        ));
        for (i, fp) in group.iter().enumerate() {
            let id = store.alloc_unit();
            let rec = UnitRecord {
                kind,
                fp: *fp,
                container,
                vbase: i as u64 * unit_bytes,
                trimmed: false,
                domain: 0,
                chunks: vec![ChunkEntry::new(0, unit_bytes as u32, *fp)],
            };
            txn.new_units.push((
                id,
                rec,
                Refs {
                    live: 1,
                    arch: 0,
                    links: 0,
                },
            ));
            txn.index_puts.push(((kind, *fp), id));
        }
    }
    store.commit(txn)?;
    session.mark_committed();
    Ok(())
}

/// A fingerprint for content `c`: 32 bytes of a 64-bit mix (a stand-in for BLAKE3, whose
/// output the index sees only as uniform bits).
fn fingerprint(c: u64, seed: u64) -> Fp {
    let mut fp = [0u8; 32];
    let mut x = c ^ seed.rotate_left(17);
    for w in fp.chunks_mut(8) {
        x = mix(x);
        w.copy_from_slice(&x.to_be_bytes());
    }
    Fp(fp)
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The series and their content, version by version, round-robin.
struct Stream {
    seed: u64,
    rng: u64,
    /// Content ids handed out so far: content below it has been stored before.
    next_content: u64,
    /// Chunks per unit: 1, or ~128 in segment mode (runs of changed chunks per segment).
    chunks_per_unit: f64,
    series: Vec<Vec<u64>>,
    sizes: Vec<usize>,
    /// Each family's first content, shared by its series' first versions.
    families: Vec<Option<Vec<u64>>>,
    turn: usize,
}

impl Stream {
    fn new(opts: &IndexBenchOptions, unit_bytes: u64) -> Stream {
        let n = opts.series.max(1) as usize;
        // Volumes of 0.5 to 2 GiB in chunk mode, 8 to 32 GiB in segment mode (one version is
        // 1/1000 of 10 TiB or of 100 TiB, over 16 series, give or take).
        let volume = opts.volume_bytes.unwrap_or(match unit_bytes {
            b if b < MIB => 1u64 << 30,
            _ => 16u64 << 30,
        });
        let mut rng = mix(opts.seed);
        let sizes = (0..n)
            .map(|_| {
                rng = mix(rng);
                let f = 0.5 + 1.5 * (rng >> 11) as f64 / (1u64 << 53) as f64;
                ((volume as f64 * f) / unit_bytes as f64) as usize
            })
            .collect();
        Stream {
            seed: opts.seed,
            rng,
            next_content: 0,
            chunks_per_unit: unit_bytes as f64 / (8 * KIB) as f64,
            series: vec![Vec::new(); n],
            sizes,
            families: vec![None; n.div_ceil(4)],
            turn: 0,
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng = mix(self.rng);
        self.rng
    }

    fn below(&mut self, n: usize) -> usize {
        (self.rand() % n.max(1) as u64) as usize
    }

    fn fresh(&mut self, n: usize) -> Vec<u64> {
        let v = (self.next_content..self.next_content + n as u64).collect();
        self.next_content += n as u64;
        v
    }

    /// The next version of the next series, and the content watermark before it: content
    /// below the watermark was stored before this version.
    fn next_version(&mut self) -> (Vec<u64>, u64) {
        let watermark = self.next_content;
        let s = self.turn;
        self.turn = (self.turn + 1) % self.series.len();
        let ids = if self.series[s].is_empty() {
            self.first_version(s)
        } else {
            self.changed(s)
        };
        self.series[s] = ids.clone();
        (ids, watermark)
    }

    /// The family's content with a fifth of it the series' own (in runs, as files differ).
    fn first_version(&mut self, s: usize) -> Vec<u64> {
        let size = self.sizes[s];
        let family = s / 4;
        let base = match self.families[family].clone() {
            Some(b) => b,
            None => {
                let b = self.fresh(size);
                self.families[family] = Some(b.clone());
                return b;
            }
        };
        let mut ids: Vec<u64> = base.into_iter().cycle().take(size).collect();
        let run = 256.min(size);
        for _ in 0..size / 5 / run.max(1) {
            let at = self.below(size - run + 1);
            let own = self.fresh(run);
            ids[at..at + run].copy_from_slice(&own);
        }
        ids
    }

    /// The previous version with ~1% of its chunks changed in runs of 1 to 16 chunks (each
    /// run one unit in segment mode) and 0.2% growth at the end.
    fn changed(&mut self, s: usize) -> Vec<u64> {
        let mut ids = std::mem::take(&mut self.series[s]);
        let chunks = ids.len() as f64 * self.chunks_per_unit;
        let runs = (chunks * 0.01 / 8.5).ceil() as usize;
        for _ in 0..runs {
            let len = if self.chunks_per_unit > 1.0 {
                1
            } else {
                1 + self.below(16)
            };
            let len = len.min(ids.len());
            let at = self.below(ids.len() - len + 1);
            let new = self.fresh(len);
            ids[at..at + len].copy_from_slice(&new);
        }
        let grow = ((ids.len() as f64 * 0.002) as usize).max(1);
        let more = self.fresh(grow);
        ids.extend(more);
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{InitOptions, OpenMode};

    #[test]
    fn a_small_run_reports_every_point_and_finds_almost_every_duplicate() {
        let dir = tempfile::tempdir().unwrap();
        Store::init(dir.path(), &InitOptions::default()).unwrap();
        let mut store = Store::open(dir.path(), OpenMode::ReadWrite, "test").unwrap();
        // 8 series of ~64 MiB, 80 versions: ~40k chunks stored, sampled at 1/8.
        let opts = IndexBenchOptions {
            unit: DedupUnit::Chunk,
            logical_tib: 5.0 / 1024.0,
            budget_bytes: 256 << 10,
            series: 8,
            volume_bytes: Some(64 << 20),
            points: 4,
            seed: 7,
        };
        let mut seen = 0;
        let r = bench_index(&mut store, &opts, |_| seen += 1).unwrap();
        assert_eq!((r.points.len(), seen), (4, 4));
        let last = r.points.last().unwrap();
        assert!(last.logical_tib >= opts.logical_tib, "{last:?}");
        assert!(
            last.sampling_rate < 1.0,
            "the budget makes it sample: {last:?}"
        );
        // The budget counts entries; tables round up, to at most twice as much.
        assert!(last.index_ram_bytes <= 2 * (256 << 10), "{last:?}");
        assert!(
            last.dedup_vs_exact > 0.95 && last.dedup_vs_exact <= 1.0,
            "{last:?}"
        );
        // Later versions are mostly duplicates: the store holds far less than it was given.
        assert!(last.unique_tib < last.logical_tib / 3.0, "{last:?}");
        assert!(last.index_disk_bytes > 0, "{last:?}");
        // What the bench committed is a consistent store.
        let totals = store.totals().unwrap();
        assert_eq!(
            totals.units as f64,
            (last.unique_tib * TIB / (8 * KIB) as f64).round()
        );
    }
}
