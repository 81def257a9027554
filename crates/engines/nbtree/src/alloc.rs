//! Where NBTree's key-value blocks come from (papers/nbtree.txt §III-C, §VI-F and Fig. 15).
//!
//! - **Calloc** (default, the paper's): two-layer, allocation bitmap, reclaimed ring buffers and
//!   the recyclable SMO log; an SMO's blocks are logged before they are allocated, so a crash at
//!   any point of an SMO leaks nothing ([`numakv_pmem::alloc::calloc`]).
//! - **Naive**: the paper's §VI-A baseline and Fig. 15's ceiling — a bump pointer per node, no
//!   free, no crash consistency ([`numakv_pmem::alloc::naive`]).
//! - **Page heap**: the substrate's general persistent allocator, standing in for the
//!   general-purpose allocators Fig. 15 compares (PMDK, NVAlloc, nvm_malloc): every block is an
//!   extent of whole pages with a persistent page-info record written on allocation and on
//!   free; the old block of an SMO is freed after the epoch grace period.
//!
//! Naive and page-heap stores are *measurement* stores: they are not logged, so they cannot be
//! recovered, and `open` refuses them (the format word records the allocator). docs/design.md
//! "NBTree", allocators.

use std::str::FromStr;
use std::sync::Arc;

use numakv_index::{Error, Result};
use numakv_pmem::alloc::calloc::Smo;
use numakv_pmem::alloc::epoch::Guard;
use numakv_pmem::alloc::naive::Naive;
use numakv_pmem::alloc::PmAllocator;
use numakv_pmem::{PPtr, Pool, PoolError};

/// Page-heap owner tag of NBTree's blocks (engines own tags from `OWNER_ENGINE` up).
const OWNER_NBTREE_BLOCK: u8 = numakv_pmem::heap::OWNER_ENGINE + 2;

/// The allocator of the key-value blocks (an option; recorded in the format word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeafAllocator {
    /// Calloc, the paper's cache-crafty allocator (crash-consistent, recoverable).
    #[default]
    Calloc,
    /// Bump allocation, never freed, not recoverable: Fig. 15's performance ceiling.
    Naive,
    /// The pool's page heap: persistent per-extent metadata, freed after the grace period;
    /// not recoverable.
    PageHeap,
}

impl LeafAllocator {
    /// Every allocator, in Fig. 15's order.
    pub const ALL: [LeafAllocator; 3] =
        [LeafAllocator::Calloc, LeafAllocator::Naive, LeafAllocator::PageHeap];

    /// The option value (`calloc` | `naive` | `page-heap`).
    pub fn name(self) -> &'static str {
        match self {
            LeafAllocator::Calloc => "calloc",
            LeafAllocator::Naive => "naive",
            LeafAllocator::PageHeap => "page-heap",
        }
    }

    /// The code stored in the format word.
    pub(crate) fn code(self) -> u64 {
        match self {
            LeafAllocator::Calloc => 0,
            LeafAllocator::Naive => 1,
            LeafAllocator::PageHeap => 2,
        }
    }

    /// The allocator of a format-word code.
    pub(crate) fn from_code(c: u64) -> Option<LeafAllocator> {
        LeafAllocator::ALL.into_iter().find(|a| a.code() == c)
    }
}

impl FromStr for LeafAllocator {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        LeafAllocator::ALL.into_iter().find(|a| a.name() == s.trim()).ok_or_else(|| {
            format!(
                "{s:?} is not an allocator: calloc | naive | page-heap (papers/nbtree.txt Fig. 15)"
            )
        })
    }
}

/// The session's allocator of blocks other than Calloc's.
#[derive(Debug)]
pub(crate) enum Plain {
    /// Bump regions, one per node.
    Naive(Arc<Naive>),
    /// Page extents of `pages` pages each.
    PageHeap {
        /// Pages per block.
        pages: u64,
    },
}

impl Plain {
    /// The allocator for `which` (not Calloc), reserving `bytes_per_node` for the naive one.
    pub(crate) fn new(
        pool: &Arc<Pool>,
        which: LeafAllocator,
        block_size: usize,
        bytes_per_node: u64,
    ) -> Result<Option<Plain>> {
        Ok(match which {
            LeafAllocator::Calloc => None,
            LeafAllocator::Naive => {
                Some(Plain::Naive(Naive::new(Arc::clone(pool), bytes_per_node)?))
            }
            LeafAllocator::PageHeap => {
                let ps = pool.page_size();
                if ps > (4 * block_size as u64).max(4096) {
                    return Err(Error::InvalidOptions(format!(
                        "allocator=page-heap gives every {block_size}-byte block whole pages: with \
                         {ps}-byte pages most of the pool would be padding; create the pool with \
                         page_size 4096"
                    )));
                }
                Some(Plain::PageHeap { pages: (block_size as u64).div_ceil(ps) })
            }
        })
    }

    /// One block on the calling thread's node.
    pub(crate) fn alloc(&self, pool: &Pool, block_size: usize) -> Result<PPtr> {
        Ok(match self {
            Plain::Naive(n) => n.alloc(block_size)?,
            Plain::PageHeap { pages } => {
                let node = numakv_numa::current_node().min(pool.nodes() - 1);
                pool.alloc_pages(node, *pages, OWNER_NBTREE_BLOCK, 0)?
            }
        })
    }

    /// Bytes handed out on `node` (naive) — the page heap is asked by the caller.
    pub(crate) fn naive_used(&self, node: usize) -> Option<u64> {
        match self {
            Plain::Naive(n) => Some(n.used(node)),
            Plain::PageHeap { .. } => None,
        }
    }
}

/// The blocks of one SMO: the new ones, and how the old one goes when the SMO commits.
#[derive(Debug)]
pub(crate) enum SmoBlocks {
    /// A Calloc SMO (logged).
    Calloc(Smo),
    /// Blocks of a plain allocator.
    Plain {
        /// The new blocks.
        new: Vec<PPtr>,
        /// The replaced block.
        old: PPtr,
    },
}

impl SmoBlocks {
    /// The new blocks.
    pub(crate) fn new_blocks(&self) -> &[PPtr] {
        match self {
            SmoBlocks::Calloc(smo) => smo.new_blocks(),
            SmoBlocks::Plain { new, .. } => new,
        }
    }

    /// `n` new blocks from `plain`, replacing `old`; on failure nothing stays allocated.
    pub(crate) fn begin_plain(
        pool: &Pool,
        plain: &Plain,
        block_size: usize,
        old: PPtr,
        n: usize,
    ) -> Result<SmoBlocks> {
        let mut new = Vec::with_capacity(n);
        for _ in 0..n {
            match plain.alloc(pool, block_size) {
                Ok(p) => new.push(p),
                Err(e) => {
                    SmoBlocks::Plain { new, old }.abort(pool, plain);
                    return Err(e);
                }
            }
        }
        Ok(SmoBlocks::Plain { new, old })
    }

    /// The SMO is linked: the old block goes after the grace period.
    ///
    /// # Safety
    /// The new blocks must be linked and the old one unreachable for new readers; called once.
    pub(crate) unsafe fn commit(self, pool: &Arc<Pool>, plain: Option<&Plain>, g: &Guard) {
        match self {
            // SAFETY: the caller's contract is Calloc's.
            SmoBlocks::Calloc(smo) => unsafe { smo.commit(g) },
            SmoBlocks::Plain { old, .. } => {
                if let Some(Plain::PageHeap { .. }) = plain {
                    let pool = Arc::clone(pool);
                    // Readers still pinned may read the old block: free it after they unpin.
                    g.defer(move || {
                        // A failure here (a crashed pool) leaves a page the store cannot
                        // reopen anyway: measurement stores are not recovered.
                        let _ = pool.free_pages(old);
                    });
                }
                // Naive: never freed.
            }
        }
    }

    /// The SMO lost its copy race: its new blocks were never visible; free them now.
    pub(crate) fn abort(self, pool: &Pool, plain: &Plain) {
        match self {
            SmoBlocks::Calloc(smo) => smo.abort(),
            SmoBlocks::Plain { new, .. } => {
                if let Plain::PageHeap { .. } = plain {
                    for p in new {
                        let _ = pool.free_pages(p);
                    }
                }
            }
        }
    }
}

/// The error `open` gives for a measurement store.
pub(crate) fn not_recoverable(which: LeafAllocator) -> Error {
    Error::Pool(PoolError::InvalidArgument(format!(
        "this nbtree store was created with allocator={} (a measurement option, Fig. 15): \
         its blocks are not logged, so it cannot be reopened; create stores you keep with \
         allocator=calloc",
        which.name()
    )))
}
