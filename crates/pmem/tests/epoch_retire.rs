//! Epoch-based reclamation: a block retired while a reader is pinned is not handed out again
//! until that reader unpins; afterwards it becomes reusable. And a pending retirement does not
//! keep the store open.

use std::collections::HashSet;
use std::sync::Arc;

use numakv_pmem::alloc::calloc::{Calloc, CallocConfig};
use numakv_pmem::alloc::{epoch, retire, PmAllocator};
use numakv_pmem::{EngineId, OpenConfig, Pool, PoolConfig};

fn small_calloc(pool: Arc<Pool>) -> Arc<Calloc> {
    let cfg = CallocConfig {
        block_size: 256,
        chunk_size: 64 << 10,
        chunks_per_node: 4,
        ring_capacity: 4,
        ..CallocConfig::default()
    };
    Calloc::create(pool, cfg).unwrap().0
}

#[test]
fn retired_block_is_not_reused_while_a_reader_is_pinned() {
    let mut cfg = PoolConfig::new(EngineId::new("epoch-test", 1), 8 << 20);
    cfg.page_size = 64 << 10;
    let pool = Pool::volatile(cfg).unwrap();
    let calloc = small_calloc(pool);
    let victim = calloc.alloc(256).unwrap();

    let reader = epoch::pin(); // a lock-free reader that may still be looking at `victim`
    {
        let writer = epoch::pin();
        // SAFETY: `victim` came from `calloc`, is retired once, and (in this test) is reachable
        // only by the pinned reader.
        unsafe { retire(&calloc, &writer, victim) };
        writer.flush();
    }
    // Allocate the whole rest of the pool: the victim must never come back while pinned.
    let mut seen = HashSet::new();
    while let Ok(p) = calloc.alloc(256) {
        assert_ne!(p, victim, "retired block reused under a pinned reader");
        assert!(seen.insert(p));
        if seen.len() % 64 == 0 {
            epoch::pin().flush(); // give the collector every chance to run early
        }
    }
    drop(reader);
    // After the grace period the block is freed and can be allocated again.
    let mut reused = false;
    for _ in 0..1000 {
        epoch::pin().flush();
        if let Ok(p) = calloc.alloc(256) {
            assert!(!seen.contains(&p), "a live block was handed out twice");
            if p == victim {
                reused = true;
                break;
            }
            seen.insert(p);
        }
    }
    assert!(reused, "retired block never became reusable after the reader unpinned");
}

#[test]
fn pending_retirement_does_not_keep_the_store_locked() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = PoolConfig::new(EngineId::new("epoch-test", 1), 8 << 20);
    cfg.page_size = 64 << 10;
    let pool = Pool::create(tmp.path(), cfg).unwrap();
    let calloc = small_calloc(Arc::clone(&pool));
    let p = calloc.alloc(256).unwrap();
    let _reader = epoch::pin(); // keeps the deferred free pending for the whole test
                                // SAFETY: `p` came from `calloc` and nobody else can reach it.
    unsafe { retire(&calloc, &epoch::pin(), p) };
    drop(calloc);
    drop(pool);
    Pool::open(tmp.path(), OpenConfig::new(EngineId::new("epoch-test", 1)))
        .expect("a pending deferred free must not hold the store lock");
}
