//! Allocation/free throughput of NSM, Calloc and the naive bump allocator, at 1 and 2 threads,
//! in one run so the ratios are comparable (papers/nbtree.txt Fig. 15 uses the naive allocator as
//! the ceiling). Each iteration allocates a batch of 256-byte blocks per thread and frees them
//! again (naive: allocates only — it cannot free — from a region reset per sample).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use numakv_pmem::alloc::calloc::{Calloc, CallocConfig};
use numakv_pmem::alloc::naive::Naive;
use numakv_pmem::alloc::nsm::{Nsm, NsmMode};
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{EngineId, PersistMode, Pool, PoolConfig};

const BATCH: usize = 1024;
const BLOCK: usize = 256;

fn pool(mode: PersistMode) -> Arc<Pool> {
    pool_of(mode, 512 << 20)
}

/// A volatile pool of `bytes` (virtual: untouched pages cost nothing).
fn pool_of(mode: PersistMode, bytes: u64) -> Arc<Pool> {
    let mut cfg = PoolConfig::new(EngineId::new("alloc-bench", 1), bytes);
    cfg.mode = mode;
    Pool::volatile(cfg).unwrap()
}

/// Runs `iters` rounds of "allocate BATCH, free BATCH" on `threads` threads; returns the wall
/// time of the slowest thread.
fn run<A: PmAllocator>(alloc: &Arc<A>, threads: usize, iters: u64, free: bool) -> Duration {
    let barrier = Barrier::new(threads);
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut blocks = Vec::with_capacity(BATCH);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        for _ in 0..BATCH {
                            blocks.push(alloc.alloc(BLOCK).expect("bench pool too small"));
                        }
                        for p in blocks.drain(..) {
                            if free {
                                // SAFETY: allocated just above by this thread, freed once, never
                                // shared with another thread.
                                unsafe { alloc.free(p).unwrap() };
                            }
                        }
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    times.into_iter().max().unwrap_or_default()
}

fn allocators(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free_256B");
    g.sample_size(10);
    for mode in [PersistMode::Eadr, PersistMode::Adr] {
        for threads in [1usize, 2] {
            g.throughput(Throughput::Elements((BATCH * threads) as u64));
            let id = |name: &str| BenchmarkId::new(format!("{name}/{mode}"), threads);
            g.bench_function(id("nsm"), |b| {
                let nsm = Nsm::new(pool(mode), NsmMode::Local).unwrap();
                b.iter_custom(|iters| run(&nsm, threads, iters, true))
            });
            g.bench_function(id("calloc"), |b| {
                let cfg = CallocConfig {
                    chunk_size: 4 << 20,
                    chunks_per_node: 16,
                    ..CallocConfig::default()
                };
                let calloc = Calloc::create(pool(mode), cfg).unwrap().0;
                b.iter_custom(|iters| run(&calloc, threads, iters, true))
            });
            g.bench_function(id("naive"), |b| {
                b.iter_custom(|iters| {
                    // A fresh region per sample: the naive allocator never reuses memory.
                    let bytes = (iters + 1) * (BATCH * BLOCK * threads) as u64;
                    let naive = Naive::new(pool_of(mode, bytes + (64 << 20)), bytes).unwrap();
                    run(&naive, threads, iters, false)
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, allocators);
criterion_main!(benches);
