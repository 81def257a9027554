//! A naive bump allocator: one reserved extent per node and an atomic offset. No free, no reuse,
//! no crash consistency, no recovery — exactly the allocator papers/nbtree.txt §VI-A and Fig. 15
//! use as the performance ceiling. Never use it for a store that must survive a restart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::alloc::PmAllocator;
use crate::error::{PoolError, Result};
use crate::heap::OWNER_NAIVE;
use crate::pool::Pool;
use crate::pptr::PPtr;

/// Bump allocator over one extent per node; allocations go to the calling thread's node.
#[derive(Debug)]
pub struct Naive {
    pool: Arc<Pool>,
    /// Per node: (extent start, extent bytes, bump offset).
    regions: Vec<(PPtr, u64, AtomicU64)>,
}

impl Naive {
    /// Reserves `bytes_per_node` (rounded up to pages) on every node.
    pub fn new(pool: Arc<Pool>, bytes_per_node: u64) -> Result<Arc<Naive>> {
        let ps = pool.page_size();
        let pages = bytes_per_node.div_ceil(ps).max(1);
        let mut regions = Vec::with_capacity(pool.nodes());
        for node in 0..pool.nodes() {
            let start = pool.alloc_pages(node, pages, OWNER_NAIVE, 0)?;
            regions.push((start, pages * ps, AtomicU64::new(0)));
        }
        Ok(Arc::new(Naive { pool, regions }))
    }

    /// Allocates on `node` (for node-specific placement).
    pub fn alloc_on(&self, node: usize, size: usize) -> Result<PPtr> {
        let (start, len, next) = self.regions.get(node).ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "node {node} out of range ({} nodes)",
                self.regions.len()
            ))
        })?;
        let size = (size.max(1) as u64).next_multiple_of(if size >= 64 { 64 } else { 8 });
        // ORDERING: Relaxed; the offset only hands out disjoint ranges, it publishes nothing.
        let off = next.fetch_add(size, Ordering::Relaxed);
        if off + size > *len {
            next.fetch_sub(size, Ordering::Relaxed);
            return Err(PoolError::OutOfSpace { node, requested: size });
        }
        start.add(off).ok_or(PoolError::OutOfSpace { node, requested: size })
    }

    /// Bytes handed out on `node`.
    pub fn used(&self, node: usize) -> u64 {
        self.regions.get(node).map_or(0, |r| r.2.load(Ordering::Relaxed))
    }
}

impl PmAllocator for Naive {
    fn alloc(&self, size: usize) -> Result<PPtr> {
        let node = numakv_numa::current_node().min(self.regions.len() - 1);
        self.alloc_on(node, size)
    }

    /// Does nothing: the naive allocator never reuses memory.
    unsafe fn free(&self, _p: PPtr) -> Result<()> {
        Ok(())
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineId, PoolConfig};

    #[test]
    fn bumps_disjoint_aligned_blocks_until_full() {
        let mut cfg = PoolConfig::new(EngineId::new("t", 1), 2 << 20);
        cfg.page_size = 64 << 10;
        let pool = Pool::volatile(cfg).unwrap();
        let n = Naive::new(pool, 128 << 10).unwrap();
        let a = n.alloc(100).unwrap();
        let b = n.alloc(64).unwrap();
        assert_eq!(a.offset() % 64, 0);
        assert_eq!(b.offset(), a.offset() + 128);
        let mut count = 2;
        while n.alloc(64).is_ok() {
            count += 1;
        }
        assert_eq!(count, (128 << 10) / 64 - 1);
        assert!(matches!(n.alloc(64), Err(PoolError::OutOfSpace { .. })));
        assert!(n.alloc_on(3, 8).is_err());
    }
}
