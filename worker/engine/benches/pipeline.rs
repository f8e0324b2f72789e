//! The backup hot loop, per core: content-defined chunking and BLAKE3
//! fingerprinting, beside a memory-read and a BLAKE3 baseline measured in the
//! same run (the machines are noisy; compare ratios, not absolute figures).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use revault_engine::{Chunker, Fp, StoreConfig};
use std::hint::black_box;

const LEN: usize = 64 << 20;

fn data() -> Vec<u8> {
    let mut v = vec![0u8; LEN];
    ChaCha8Rng::seed_from_u64(7).fill_bytes(&mut v);
    v
}

fn bench(c: &mut Criterion) {
    let d = data();
    let chunker = Chunker::new(StoreConfig::default().chunk);
    let mut g = c.benchmark_group("hot-loop");
    g.throughput(Throughput::Bytes(LEN as u64));
    g.sample_size(15);

    g.bench_function(BenchmarkId::new("baseline", "memory-read"), |b| {
        b.iter(|| {
            // SAFETY: every bit pattern is a valid u64; align_to returns only the aligned middle.
            let words: &[u64] = unsafe { d.align_to::<u64>().1 };
            black_box(words.iter().fold(0u64, |a, &w| a ^ w))
        })
    });
    g.bench_function(BenchmarkId::new("baseline", "blake3-8KiB"), |b| {
        b.iter(|| {
            for c in d.chunks(8192) {
                black_box(Fp::of(c));
            }
        })
    });
    g.bench_function(BenchmarkId::new("revault", "fastcdc"), |b| {
        b.iter(|| black_box(chunker.chunk_all(&d).len()))
    });
    g.bench_function(BenchmarkId::new("revault", "fastcdc+blake3"), |b| {
        b.iter(|| {
            let mut rest = &d[..];
            while !rest.is_empty() {
                let n = chunker.cut(rest);
                black_box(Fp::of(&rest[..n]));
                rest = &rest[n..];
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
