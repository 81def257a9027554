//! NBTree's cache-crafty persistent allocator, Calloc (papers/nbtree.txt §III-C).
//!
//! Calloc serves fixed-size blocks (NBTree's leaves) and is built so that, on an eADR machine,
//! almost every PM write it makes lands in a cache line that is written again soon and therefore
//! stays in the (persistent) CPU cache:
//!
//! - **Two layers.** Per NUMA node one *Calloc pool* (the paper's Discussion: "separate memory
//!   pools for each NUMA node"), an extent of the page heap holding a chunk area. A thread that
//!   needs blocks takes a whole chunk with `fetch_add` on the persistent `alloc_num` and splits it
//!   into its volatile per-thread free list.
//! - **Allocation bitmap.** One persistent bit per block says "allocated". Allocating from the free
//!   list sets the bit; consecutive allocations come from one chunk, so they hit one bitmap line.
//! - **Reclaimed ring buffer.** A freed block is appended to the tail of the freeing thread's
//!   persistent ring *with its bit still set*; allocation first takes blocks from the ring's head.
//!   Only when the ring is full does a free clear the bit (a random bitmap write) and push the block
//!   on the volatile free list. A block is therefore *allocated* exactly when its bit is set and it
//!   is not in the live window of any ring.
//! - **Recyclable log.** An SMO (split/merge) records the old block(s) and the new blocks in a
//!   per-thread log slot *before* the new blocks' bits are set, and clears the slot only after the
//!   old blocks were freed. Recovery frees every logged block that is allocated but unreachable, so
//!   a crash at any point of an SMO leaks nothing.
//!
//! The paper targets eADR, where a store is durable once globally visible. In ADR mode every
//! persistent step below is followed by the flush + fence it needs ([`Pool::persist_obj`]); in
//! eADR mode those calls are no-ops (shadow mode still counts the fences as crash points).
//!
//! # Persistent layout
//!
//! A **directory** extent on node 0 (heap owner [`OWNER_CALLOC`], aux [`AUX_DIRECTORY`]):
//!
//! ```text
//! offset  size  field
//! 0       8     magic      DIR_MAGIC ("CALLOCDR")
//! 8       8     version    FORMAT_VERSION
//! 16      8     node_count must equal the pool's node count
//! 24      8     checksum   CRC-32 of the little-endian words magic, version, node_count, pools[..]
//! 32      32    reserved (zero)
//! 64      8×N   pools[n]   PPtr of node n's Calloc pool extent
//! ```
//!
//! One **Calloc pool** extent per node (owner [`OWNER_CALLOC`], aux [`AUX_NODE_POOL`]):
//!
//! ```text
//! offset      size                     field
//! 0           8                        magic          POOL_MAGIC ("CALLOCPL")
//! 8           8                        version | node << 32
//! 16          8                        block_size     bytes, multiple of 64
//! 24          8                        chunk_size     bytes, multiple of block_size
//! 32          8                        chunk_count
//! 40          8                        max_threads
//! 48          8                        ring_capacity  entries per ring
//! 56          8                        log_slots      slots per thread
//! 64          8                        bitmap_off     = HEADER_BYTES
//! 72          8                        rings_off
//! 80          8                        logs_off
//! 88          8                        chunks_off
//! 96          8                        total_bytes    bytes of the pool actually used
//! 104         8                        checksum       CRC-32 of the words at 0..104
//! 112         16                       reserved
//! 128         8                        alloc_num      chunks handed out (mutable; may overshoot
//!                                                     chunk_count, clamped at recovery)
//! 136         56                       reserved
//! 192         round64(blocks / 8)      bitmap         bit b of word w: block 64·w + b allocated
//! rings_off   T × ring_stride          rings[tid]     line 0: head u64, tail u64 (monotonic
//!                                                     counters, tail − head ≤ capacity); then
//!                                                     entries[capacity] u64 block PPtrs, the
//!                                                     live window is [head, tail) mod capacity
//! logs_off    T × S × 64               logs[tid][s]   one cache line per slot, see LogSlot
//! chunks_off  chunk_count × chunk_size chunk area     (4 KiB aligned)
//! ```
//!
//! `ring_stride = 64 + round64(8 × ring_capacity)`. All integers are little-endian.
//!
//! # The recyclable-log slot as a state machine
//!
//! ```text
//!            smo_begin: addresses written+persisted, then state word ACTIVE persisted,
//!  FREE ────────────────────────────────────────────────────────────────────────────▶ ACTIVE
//!   ▲        then the new blocks' bits set (or ring heads advanced) and persisted      │
//!   │                                                                                  │
//!   │  abort: new blocks freed, then state word 0 persisted                            │
//!   ├──────────────────────────────────────────────────────────────────────────────────┤
//!   │  commit: old blocks retired; after the epoch grace period they are freed,        │
//!   └── then state word 0 persisted ◀──────────────────────────────────────────────────┘
//! ```
//!
//! Crash in ACTIVE, at any point: recovery frees every logged block (old or new) that is
//! allocated but not reachable (the engine's predicate), then clears the slot. Before the link
//! the old block is reachable and the new ones are not; after it the reverse; a logged block that
//! was already freed is not allocated and is skipped. Recovery is idempotent, so a crash during
//! recovery is repaired by the next one.
//!
//! Plain [`PmAllocator::alloc`] / [`PmAllocator::free`] outside an SMO are not logged (as in the
//! paper): a crash between allocating a block and linking it (or unlinking and freeing it) leaks
//! that one block. Engines allocate structure through SMOs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_epoch as epoch;
use parking_lot::Mutex;

use crate::access::{PmType, PmU64};
use crate::alloc::PmAllocator;
use crate::error::{PoolError, Result};
use crate::heap::OWNER_CALLOC;
use crate::pool::Pool;
use crate::pptr::{PPtr, MAX_NODES};

// ---------------------------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------------------------

/// Heap `aux` tag of the directory extent.
pub const AUX_DIRECTORY: u16 = 1;
/// Heap `aux` tag of a per-node Calloc pool extent.
pub const AUX_NODE_POOL: u16 = 2;
/// "CALLOCDR".
pub const DIR_MAGIC: u64 = u64::from_le_bytes(*b"CALLOCDR");
/// "CALLOCPL".
pub const POOL_MAGIC: u64 = u64::from_le_bytes(*b"CALLOCPL");
/// On-media format version of the directory and pools.
pub const FORMAT_VERSION: u64 = 1;
/// Bytes of a pool header (three cache lines; `alloc_num` has the second line to itself).
pub const HEADER_BYTES: u64 = 192;
/// Block addresses one log slot can hold (old + new).
pub const LOG_ADDRS: usize = 7;

const LINE: u64 = 64;
/// Tag in the low byte of an ACTIVE log state word (a random non-zero tag, so garbage is
/// recognised as corruption rather than replayed).
const LOG_ACTIVE: u64 = 0xC1;
/// Rounds of `pin().flush()` `smo_begin` spends waiting for a log slot before giving up.
const SLOT_WAIT_ROUNDS: usize = 256;
/// Largest accepted ring capacity, so the ring area stays small and `tail − head` sane.
const MAX_RING_CAPACITY: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// Persistent layouts
// ---------------------------------------------------------------------------------------------

/// Header of a per-node Calloc pool (see the module docs for the byte table).
#[repr(C)]
#[derive(Debug)]
struct PoolHeader {
    magic: PmU64,           // 0
    version_node: PmU64,    // 8
    block_size: PmU64,      // 16
    chunk_size: PmU64,      // 24
    chunk_count: PmU64,     // 32
    max_threads: PmU64,     // 40
    ring_capacity: PmU64,   // 48
    log_slots: PmU64,       // 56
    bitmap_off: PmU64,      // 64
    rings_off: PmU64,       // 72
    logs_off: PmU64,        // 80
    chunks_off: PmU64,      // 88
    total_bytes: PmU64,     // 96
    checksum: PmU64,        // 104
    _reserved: [PmU64; 2],  // 112
    alloc_num: PmU64,       // 128: own line, the only mutable header word
    _reserved2: [PmU64; 7], // 136
}
const _: () = assert!(std::mem::size_of::<PoolHeader>() == HEADER_BYTES as usize);
const _: () = assert!(std::mem::offset_of!(PoolHeader, checksum) == 104);
const _: () = assert!(std::mem::offset_of!(PoolHeader, alloc_num) == 128);
// SAFETY: repr(C) struct of PmU64 only: valid for any bits, no Drop, interior mutability only.
unsafe impl PmType for PoolHeader {}

/// Head of a directory extent; `node_count` pool pointers follow at offset 64.
#[repr(C)]
#[derive(Debug)]
struct DirHeader {
    magic: PmU64,          // 0
    version: PmU64,        // 8
    node_count: PmU64,     // 16
    checksum: PmU64,       // 24
    _reserved: [PmU64; 4], // 32
}
const _: () = assert!(std::mem::size_of::<DirHeader>() == 64);
// SAFETY: as for PoolHeader.
unsafe impl PmType for DirHeader {}

/// Head line of a per-thread reclaimed ring buffer; the entries follow on the next line.
#[repr(C)]
#[derive(Debug)]
struct RingHeader {
    /// Entries consumed so far (monotonic). Written by allocations.
    head: PmU64, // 0
    /// Entries appended so far (monotonic). Written by frees.
    tail: PmU64, // 8
    _reserved: [PmU64; 6], // 16
}
const _: () = assert!(std::mem::size_of::<RingHeader>() == 64);
// SAFETY: as for PoolHeader.
unsafe impl PmType for RingHeader {}

/// One recyclable-log slot, one cache line.
///
/// `state` bit by bit:
///
/// ```text
/// bits 0..8    tag    0 = FREE (the rest of the line is stale and ignored), LOG_ACTIVE = ACTIVE
/// bits 8..16   n_old  old blocks, addrs[0..n_old]
/// bits 16..24  n_new  new blocks, addrs[n_old..n_old + n_new]; n_old + n_new ≤ LOG_ADDRS
/// bits 24..64  zero
/// ```
#[repr(C)]
#[derive(Debug)]
struct LogSlot {
    state: PmU64,              // 0
    addrs: [PmU64; LOG_ADDRS], // 8
}
const _: () = assert!(std::mem::size_of::<LogSlot>() == 64);
// SAFETY: as for PoolHeader.
unsafe impl PmType for LogSlot {}

fn log_state(n_old: usize, n_new: usize) -> u64 {
    LOG_ACTIVE | ((n_old as u64) << 8) | ((n_new as u64) << 16)
}

/// Decodes an ACTIVE state word into `(n_old, n_new)`; `None` when it is not a valid one.
fn decode_log_state(w: u64) -> Option<(usize, usize)> {
    let (tag, n_old, n_new) = (w & 0xff, ((w >> 8) & 0xff) as usize, ((w >> 16) & 0xff) as usize);
    (tag == LOG_ACTIVE && w >> 24 == 0 && n_old + n_new <= LOG_ADDRS && n_old + n_new > 0)
        .then_some((n_old, n_new))
}

fn crc_words(words: &[u64]) -> u64 {
    let mut h = crc32fast::Hasher::new();
    for w in words {
        h.update(&w.to_le_bytes());
    }
    u64::from(h.finalize())
}

// ---------------------------------------------------------------------------------------------
// Configuration and geometry
// ---------------------------------------------------------------------------------------------

/// Parameters of a new Calloc. Stored in every node pool's header; [`Calloc::open`] reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallocConfig {
    /// Bytes per block (NBTree: one leaf). Multiple of 64, at least 64. Default 256.
    pub block_size: u64,
    /// Bytes per chunk, the unit threads take from the global pool. Multiple of `block_size`.
    /// Default 16 MiB (the paper's figure). A chunk of `512 × block_size` bytes or a multiple of
    /// it gives every chunk bitmap lines of its own.
    pub chunk_size: u64,
    /// Chunks in each node's pool.
    pub chunks_per_node: u64,
    /// Threads (dense ids `0..max_threads`) that may use the allocator. Default 64.
    pub max_threads: usize,
    /// Entries of each per-thread reclaimed ring buffer. Default 64.
    pub ring_capacity: u64,
    /// Recyclable-log slots per thread (1..=64), i.e. SMOs a thread may have in flight,
    /// counting those whose old blocks await their grace period. Default 8.
    pub log_slots: usize,
}

impl Default for CallocConfig {
    fn default() -> Self {
        CallocConfig {
            block_size: 256,
            chunk_size: 16 << 20,
            chunks_per_node: 4,
            max_threads: 64,
            ring_capacity: 64,
            log_slots: 8,
        }
    }
}

impl CallocConfig {
    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(PoolError::InvalidArgument(format!("CallocConfig: {m}")));
        if self.block_size < 64 || self.block_size % 64 != 0 {
            return bad(format!(
                "block_size {} must be a non-zero multiple of 64",
                self.block_size
            ));
        }
        if self.chunk_size < self.block_size || self.chunk_size % self.block_size != 0 {
            return bad(format!(
                "chunk_size {} must be a non-zero multiple of block_size {}",
                self.chunk_size, self.block_size
            ));
        }
        if self.chunks_per_node == 0 {
            return bad("chunks_per_node must be at least 1".into());
        }
        if self.max_threads == 0 || self.max_threads > numakv_numa::MAX_THREADS {
            return bad(format!(
                "max_threads {} must be 1..={}",
                self.max_threads,
                numakv_numa::MAX_THREADS
            ));
        }
        if self.ring_capacity == 0 || self.ring_capacity > MAX_RING_CAPACITY {
            return bad(format!(
                "ring_capacity {} must be 1..={MAX_RING_CAPACITY}",
                self.ring_capacity
            ));
        }
        if self.log_slots == 0 || self.log_slots > 64 {
            return bad(format!("log_slots {} must be 1..=64", self.log_slots));
        }
        Geometry::compute(self).map(|_| ())
    }
}

/// Offsets inside one node pool, derived from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    block_size: u64,
    chunk_size: u64,
    chunk_count: u64,
    blocks_per_chunk: u64,
    total_blocks: u64,
    max_threads: u64,
    ring_capacity: u64,
    log_slots: u64,
    bitmap_off: u64,
    bitmap_words: u64,
    rings_off: u64,
    ring_stride: u64,
    logs_off: u64,
    chunks_off: u64,
    total_bytes: u64,
}

fn round_up(x: u64, to: u64) -> Option<u64> {
    x.checked_add(to - 1).map(|v| v / to * to)
}

impl Geometry {
    fn compute(cfg: &CallocConfig) -> Result<Geometry> {
        let too_big = || PoolError::InvalidArgument("CallocConfig: pool size overflows".into());
        let blocks_per_chunk = cfg.chunk_size / cfg.block_size;
        let total_blocks = blocks_per_chunk.checked_mul(cfg.chunks_per_node).ok_or_else(too_big)?;
        let bitmap_words = total_blocks.div_ceil(64);
        let bitmap_off = HEADER_BYTES;
        let bitmap_bytes = round_up(bitmap_words * 8, LINE).ok_or_else(too_big)?;
        let rings_off = bitmap_off.checked_add(bitmap_bytes).ok_or_else(too_big)?;
        let ring_stride = LINE + round_up(cfg.ring_capacity * 8, LINE).ok_or_else(too_big)?;
        let max_threads = cfg.max_threads as u64;
        let logs_off = ring_stride
            .checked_mul(max_threads)
            .and_then(|r| r.checked_add(rings_off))
            .ok_or_else(too_big)?;
        let log_slots = cfg.log_slots as u64;
        let chunks_off = (log_slots * LINE)
            .checked_mul(max_threads)
            .and_then(|l| l.checked_add(logs_off))
            .and_then(|e| round_up(e, 4096))
            .ok_or_else(too_big)?;
        let total_bytes = cfg
            .chunk_size
            .checked_mul(cfg.chunks_per_node)
            .and_then(|c| c.checked_add(chunks_off))
            .ok_or_else(too_big)?;
        if total_bytes > 1 << crate::pptr::OFFSET_BITS {
            return Err(too_big());
        }
        Ok(Geometry {
            block_size: cfg.block_size,
            chunk_size: cfg.chunk_size,
            chunk_count: cfg.chunks_per_node,
            blocks_per_chunk,
            total_blocks,
            max_threads,
            ring_capacity: cfg.ring_capacity,
            log_slots,
            bitmap_off,
            bitmap_words,
            rings_off,
            ring_stride,
            logs_off,
            chunks_off,
            total_bytes,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Volatile state
// ---------------------------------------------------------------------------------------------

/// One thread's volatile state on one node, behind an (uncontended) mutex: normally only its
/// thread touches it, but deferred frees, aborted SMOs and the inspection functions may run on
/// another thread.
#[derive(Debug, Default)]
struct Local {
    /// Free blocks (bit clear), popped from the end.
    free: Vec<PPtr>,
    /// Mirror of the persistent ring head (saves a PM read per allocation).
    head: u64,
    /// Mirror of the persistent ring tail.
    tail: u64,
    /// Bit s set: log slot s is ACTIVE.
    log_busy: u64,
}

/// One node's pool: where it lives and its volatile state.
#[derive(Debug)]
struct NodePool {
    node: usize,
    base: PPtr,
    geo: Geometry,
    locals: Box<[Mutex<Local>]>,
    /// Free blocks not owned by any thread: rebuilt at recovery, and the fallback of frees by
    /// threads without a per-thread slot. Threads take them a chunk's worth at a time.
    shared_free: Mutex<Vec<PPtr>>,
    /// Serialises chunk hand-out. Not needed for atomicity (`fetch_add` is), but it keeps two
    /// threads' flushes of the `alloc_num` line in order, which ADR shadow mode (line captured
    /// at flush, applied at fence) would otherwise let a stale capture overwrite.
    chunk_lock: Mutex<()>,
}

impl NodePool {
    /// The PM object `T` at byte `off` of this pool.
    fn at<'a, T: PmType>(&self, pool: &'a Pool, off: u64) -> &'a T {
        debug_assert!(off + std::mem::size_of::<T>() as u64 <= self.geo.total_bytes);
        debug_assert!(off % 8 == 0);
        let p = PPtr::from_raw(self.base.raw() + off);
        // SAFETY: `base` is the start of an extent of this pool at least `geo.total_bytes` long
        // (checked at create and open), and every caller passes an 8-aligned offset computed from
        // `geo` with the object inside `total_bytes`; T is a PM type of PmU64 words.
        unsafe { pool.get_unchecked::<T>(p) }
    }

    fn header<'a>(&self, pool: &'a Pool) -> &'a PoolHeader {
        self.at(pool, 0)
    }

    fn bitmap_word<'a>(&self, pool: &'a Pool, idx: u64) -> &'a PmU64 {
        self.at(pool, self.geo.bitmap_off + 8 * (idx / 64))
    }

    fn ring<'a>(&self, pool: &'a Pool, tid: usize) -> &'a RingHeader {
        self.at(pool, self.geo.rings_off + self.geo.ring_stride * tid as u64)
    }

    fn ring_entry<'a>(&self, pool: &'a Pool, tid: usize, n: u64) -> &'a PmU64 {
        let off = self.geo.rings_off + self.geo.ring_stride * tid as u64 + LINE;
        self.at(pool, off + 8 * (n % self.geo.ring_capacity))
    }

    fn log_slot<'a>(&self, pool: &'a Pool, tid: usize, slot: usize) -> &'a LogSlot {
        let off = self.geo.logs_off + LINE * (self.geo.log_slots * tid as u64 + slot as u64);
        self.at(pool, off)
    }

    fn block_ptr(&self, idx: u64) -> PPtr {
        PPtr::from_raw(self.base.raw() + self.geo.chunks_off + idx * self.geo.block_size)
    }

    /// The block index of `p` in this pool, `None` when `p` is not the start of one of its blocks.
    fn block_index(&self, p: PPtr) -> Option<u64> {
        if p.node() != self.node {
            return None;
        }
        let rel = p.offset().checked_sub(self.base.offset() + self.geo.chunks_off)?;
        let idx = rel / self.geo.block_size;
        (rel % self.geo.block_size == 0 && idx < self.geo.total_blocks).then_some(idx)
    }

    fn bit_is_set(&self, pool: &Pool, idx: u64) -> bool {
        self.bitmap_word(pool, idx).load(Ordering::Acquire) & (1 << (idx % 64)) != 0
    }

    /// Sets `idx`'s bit; the caller persists (`flush` of the word, then a fence).
    fn set_bit<'a>(&self, pool: &'a Pool, idx: u64) -> &'a PmU64 {
        let w = self.bitmap_word(pool, idx);
        // ORDERING: Relaxed; the bit is a durable record, not a publication: the block is handed
        // to its user by the return value, and other threads' bits in the word are preserved by
        // the atomic RMW itself.
        w.fetch_or(1 << (idx % 64), Ordering::Relaxed);
        w
    }

    fn clear_bit<'a>(&self, pool: &'a Pool, idx: u64) -> &'a PmU64 {
        let w = self.bitmap_word(pool, idx);
        // ORDERING: Relaxed, as in set_bit.
        w.fetch_and(!(1 << (idx % 64)), Ordering::Relaxed);
        w
    }

    fn alloc_num(&self, pool: &Pool) -> u64 {
        self.header(pool).alloc_num.load(Ordering::Acquire).min(self.geo.chunk_count)
    }
}

/// Session counters (volatile, since the last create/open), for tests and benchmarks.
#[derive(Debug, Default)]
struct Counters {
    ring_hits: AtomicU64,
    ring_pushes: AtomicU64,
    bitmap_sets: AtomicU64,
    bitmap_clears: AtomicU64,
    chunks_taken: AtomicU64,
}

/// Per-node figures of [`CallocStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Chunks in the node's pool.
    pub chunks_total: u64,
    /// Chunks handed out to threads so far (clamped `alloc_num`).
    pub chunks_handed_out: u64,
    /// Blocks allocated: bit set and not in a ring.
    pub allocated_blocks: u64,
    /// Freed blocks waiting in reclaimed rings (bit still set).
    pub ring_blocks: u64,
    /// Blocks on volatile free lists (per-thread and shared).
    pub free_list_blocks: u64,
}

/// What [`Calloc::stats`] reports. Figures are exact only while no thread allocates or frees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallocStats {
    /// Per node.
    pub nodes: Vec<NodeStats>,
    /// Allocations served from a reclaimed ring (no bitmap write) this session.
    pub ring_hits: u64,
    /// Frees absorbed by a reclaimed ring (no bitmap write) this session.
    pub ring_pushes: u64,
    /// Bitmap bits set (allocations from free lists) this session.
    pub bitmap_sets: u64,
    /// Bitmap bits cleared (frees past a full ring, recovery frees) this session.
    pub bitmap_clears: u64,
    /// Chunks taken from the global pools this session.
    pub chunks_taken: u64,
}

/// What [`Calloc::open`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallocRecovery {
    /// Logged blocks that were allocated but unreachable and have been freed (the leaks an
    /// interrupted SMO would otherwise have caused).
    pub blocks_recovered: u64,
    /// ACTIVE recyclable-log slots found and cleared.
    pub log_slots_replayed: u64,
    /// `alloc_num` words that had overshot `chunk_count` and were clamped.
    pub alloc_num_clamped: u64,
    /// Free blocks of handed-out chunks put back on the free lists.
    pub free_blocks: u64,
    /// Blocks found waiting in reclaimed rings.
    pub ring_blocks: u64,
    /// Wall-clock time of the recovery.
    pub elapsed: Duration,
}

// ---------------------------------------------------------------------------------------------
// The allocator
// ---------------------------------------------------------------------------------------------

/// NBTree's Calloc: fixed-size blocks from per-node pools; see the module documentation.
#[derive(Debug)]
pub struct Calloc {
    pool: Arc<Pool>,
    dir: PPtr,
    cfg: CallocConfig,
    nodes: Vec<NodePool>,
    counters: Counters,
    /// Handed to deferred frees, which must not keep the pool alive (a crashed pool has to be
    /// dropped before it can be reopened; what a dropped allocator did not free, recovery does).
    me: Weak<Calloc>,
}

impl Calloc {
    /// Creates a Calloc on every node of `pool` and returns it with the pointer of its directory,
    /// which the engine stores in a root slot ([`Pool::root`]) and passes to [`Calloc::open`].
    ///
    /// A crash before the engine persisted that pointer leaks the extents (they are tagged
    /// [`OWNER_CALLOC`] in the page heap).
    pub fn create(pool: Arc<Pool>, cfg: CallocConfig) -> Result<(Arc<Calloc>, PPtr)> {
        cfg.validate()?;
        let geo = Geometry::compute(&cfg)?;
        let ps = pool.page_size();
        let pages = geo.total_bytes.div_ceil(ps);
        let n = pool.nodes();
        let mut bases = Vec::with_capacity(n);
        for node in 0..n {
            let base = match pool.alloc_pages(node, pages, OWNER_CALLOC, AUX_NODE_POOL) {
                Ok(b) => b,
                Err(e) => {
                    // Give back the extents of the nodes already done: a caller that retries
                    // with a smaller geometry (a small pool) must not find them leaked.
                    for &b in &bases {
                        let _ = pool.free_pages(b);
                    }
                    return Err(e);
                }
            };
            // Pages may hold a previous owner's bytes: zero the metadata (header, bitmap, rings,
            // logs); the chunk area's contents are unspecified anyway.
            let meta = pool.bytes(base, geo.chunks_off as usize)?;
            // SAFETY: the extent was just allocated and is not yet known to anyone else.
            unsafe { meta.fill(0, meta.len(), 0) };
            pool.flush(meta.as_ptr(), meta.len());
            let np = NodePool {
                node,
                base,
                geo,
                locals: Box::new([]),
                shared_free: Mutex::new(Vec::new()),
                chunk_lock: Mutex::new(()),
            };
            let h = np.header(&pool);
            let words = [
                POOL_MAGIC,
                FORMAT_VERSION | ((node as u64) << 32),
                geo.block_size,
                geo.chunk_size,
                geo.chunk_count,
                geo.max_threads,
                geo.ring_capacity,
                geo.log_slots,
                geo.bitmap_off,
                geo.rings_off,
                geo.logs_off,
                geo.chunks_off,
                geo.total_bytes,
            ];
            let fields = [
                &h.magic,
                &h.version_node,
                &h.block_size,
                &h.chunk_size,
                &h.chunk_count,
                &h.max_threads,
                &h.ring_capacity,
                &h.log_slots,
                &h.bitmap_off,
                &h.rings_off,
                &h.logs_off,
                &h.chunks_off,
                &h.total_bytes,
            ];
            for (f, w) in fields.iter().zip(words) {
                f.store(w, Ordering::Relaxed);
            }
            h.checksum.store(crc_words(&words), Ordering::Relaxed);
            // PERSIST: the zeroed metadata (flushed above) and the header are durable before the
            // directory names this pool.
            pool.persist_obj(h);
            bases.push(base);
        }
        let dir_bytes = 64 + 8 * n as u64;
        let dir = match pool.alloc_pages(0, dir_bytes.div_ceil(ps), OWNER_CALLOC, AUX_DIRECTORY) {
            Ok(d) => d,
            Err(e) => {
                // As above: nothing of a failed create stays allocated.
                for &b in &bases {
                    let _ = pool.free_pages(b);
                }
                return Err(e);
            }
        };
        let dh: &DirHeader = pool.get(dir)?;
        let mut words = vec![DIR_MAGIC, FORMAT_VERSION, n as u64];
        for (i, b) in bases.iter().enumerate() {
            let slot: &PmU64 = pool.get(dir.add(64 + 8 * i as u64).unwrap_or(PPtr::NULL))?;
            slot.store(b.raw(), Ordering::Relaxed);
            pool.flush_obj(slot);
            words.push(b.raw());
        }
        dh.magic.store(DIR_MAGIC, Ordering::Relaxed);
        dh.version.store(FORMAT_VERSION, Ordering::Relaxed);
        dh.node_count.store(n as u64, Ordering::Relaxed);
        dh.checksum.store(crc_words(&words), Ordering::Relaxed);
        for r in &dh._reserved {
            r.store(0, Ordering::Relaxed);
        }
        // PERSIST: the directory is durable before create returns, i.e. before the engine can
        // store its pointer in a root slot.
        pool.persist_obj(dh);
        let nodes = bases
            .into_iter()
            .enumerate()
            .map(|(node, base)| Self::node_pool(node, base, geo))
            .collect();
        let calloc = Self::assemble(pool, dir, cfg, nodes);
        Ok((calloc, dir))
    }

    fn node_pool(node: usize, base: PPtr, geo: Geometry) -> NodePool {
        NodePool {
            node,
            base,
            geo,
            locals: (0..geo.max_threads).map(|_| Mutex::new(Local::default())).collect(),
            shared_free: Mutex::new(Vec::new()),
            chunk_lock: Mutex::new(()),
        }
    }

    fn assemble(
        pool: Arc<Pool>,
        dir: PPtr,
        cfg: CallocConfig,
        nodes: Vec<NodePool>,
    ) -> Arc<Calloc> {
        Arc::new_cyclic(|me| Calloc {
            pool,
            dir,
            cfg,
            nodes,
            counters: Counters::default(),
            me: me.clone(),
        })
    }

    /// The directory pointer (what [`Calloc::create`] returned).
    pub fn directory(&self) -> PPtr {
        self.dir
    }

    /// The configuration (as stored in the pools).
    pub fn config(&self) -> &CallocConfig {
        &self.cfg
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.cfg.block_size as usize
    }

    fn node_pool_of(&self, node: usize) -> Result<&NodePool> {
        self.nodes.get(node).ok_or_else(|| {
            PoolError::InvalidArgument(format!(
                "node {node} out of range ({} nodes)",
                self.nodes.len()
            ))
        })
    }

    /// The calling thread's dense id, checked against `max_threads`.
    fn tid(&self) -> Result<usize> {
        let max = self.cfg.max_threads;
        let tid =
            numakv_numa::try_tid().map_err(|_| PoolError::TooManyThreads { tid: max, max })?;
        if tid >= max {
            return Err(PoolError::TooManyThreads { tid, max });
        }
        Ok(tid)
    }

    /// Node pool and block index of `p`, or `BadPointer`.
    fn locate(&self, p: PPtr) -> Result<(&NodePool, u64)> {
        let bad = |why| PoolError::BadPointer { ptr: p.to_string(), why };
        let np = self.nodes.get(p.node()).ok_or_else(|| bad("node out of range"))?;
        let idx = np.block_index(p).ok_or_else(|| bad("not a Calloc block"))?;
        Ok((np, idx))
    }

    // -----------------------------------------------------------------------------------------
    // Allocation
    // -----------------------------------------------------------------------------------------

    /// Allocates one block on `node` for the calling thread: from the head of its reclaimed ring
    /// (no bitmap write), else from its free list (bitmap bit set and persisted), taking a new
    /// chunk when the free list is empty. The block is durably allocated when this returns.
    pub fn alloc_on(&self, node: usize) -> Result<PPtr> {
        let np = self.node_pool_of(node)?;
        let tid = self.tid()?;
        let pool = &*self.pool;
        let mut local = np.locals[tid].lock();
        if local.head < local.tail {
            let p = PPtr::from_raw(np.ring_entry(pool, tid, local.head).load(Ordering::Acquire));
            local.head += 1;
            let ring = np.ring(pool, tid);
            ring.head.store(local.head, Ordering::Release);
            // PERSIST: the block has left the ring durably before the caller can link it;
            // otherwise a crash would leave it both linked and free.
            pool.persist_obj(&ring.head);
            self.counters.ring_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        let p = self.pop_free(np, &mut local)?;
        let idx = np
            .block_index(p)
            .ok_or_else(|| PoolError::corrupted("free list holds a foreign block"))?;
        let w = np.set_bit(pool, idx);
        // PERSIST: the allocation bit is durable before the block is handed out.
        pool.persist_obj(w);
        self.counters.bitmap_sets.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// Pops a free block (bit clear) from `local`, refilling it from the shared list or a new
    /// chunk when empty.
    fn pop_free(&self, np: &NodePool, local: &mut Local) -> Result<PPtr> {
        if let Some(p) = local.free.pop() {
            return Ok(p);
        }
        self.refill(np, local)?;
        local
            .free
            .pop()
            .ok_or(PoolError::OutOfSpace { node: np.node, requested: np.geo.block_size })
    }

    fn refill(&self, np: &NodePool, local: &mut Local) -> Result<()> {
        {
            let mut shared = np.shared_free.lock();
            if !shared.is_empty() {
                let n = shared.len().min(np.geo.blocks_per_chunk as usize);
                let at = shared.len() - n;
                local.free.extend(shared.drain(at..));
                return Ok(());
            }
        }
        let pool = &*self.pool;
        let out = PoolError::OutOfSpace { node: np.node, requested: np.geo.block_size };
        let _g = np.chunk_lock.lock();
        let h = np.header(pool);
        if h.alloc_num.load(Ordering::Acquire) >= np.geo.chunk_count {
            return Err(out);
        }
        // ORDERING: AcqRel; the counter hands out disjoint chunks (the lock above only orders the
        // flushes, see NodePool::chunk_lock).
        let chunk = h.alloc_num.fetch_add(1, Ordering::AcqRel);
        // PERSIST: the chunk is durably handed out before any of its blocks' bits can be set, so
        // recovery never sees a set bit in a chunk it believes unused.
        pool.persist_obj(&h.alloc_num);
        if chunk >= np.geo.chunk_count {
            return Err(out); // overshoot; clamped at recovery
        }
        self.counters.chunks_taken.fetch_add(1, Ordering::Relaxed);
        let first = chunk * np.geo.blocks_per_chunk;
        // Reversed, so that pops return ascending addresses (bitmap locality).
        local.free.extend((first..first + np.geo.blocks_per_chunk).rev().map(|i| np.block_ptr(i)));
        Ok(())
    }

    /// Frees `p` for the calling thread: appended to its reclaimed ring on `p`'s node (bit stays
    /// set), or, when the ring is full, bit cleared and block put on the volatile free list.
    fn free_block(&self, p: PPtr) -> Result<()> {
        let (np, idx) = self.locate(p)?;
        let pool = &*self.pool;
        let tid = match self.tid() {
            Ok(t) => t,
            Err(_) => {
                // A thread without a per-thread slot (e.g. a deferred free run by a foreign
                // thread) frees to the shared list.
                let w = np.clear_bit(pool, idx);
                // PERSIST: the bit is durably clear before the block can be handed out again.
                pool.persist_obj(w);
                self.counters.bitmap_clears.fetch_add(1, Ordering::Relaxed);
                np.shared_free.lock().push(p);
                return Ok(());
            }
        };
        let mut local = np.locals[tid].lock();
        if local.tail - local.head < np.geo.ring_capacity {
            let e = np.ring_entry(pool, tid, local.tail);
            e.store(p.raw(), Ordering::Release);
            // PERSIST: the entry is durable before the tail covers it.
            pool.persist_obj(e);
            local.tail += 1;
            let ring = np.ring(pool, tid);
            ring.tail.store(local.tail, Ordering::Release);
            // PERSIST: the block is durably free (in the ring) before the caller goes on.
            pool.persist_obj(&ring.tail);
            self.counters.ring_pushes.fetch_add(1, Ordering::Relaxed);
        } else {
            let w = np.clear_bit(pool, idx);
            // PERSIST: the bit is durably clear before the block can be handed out again.
            pool.persist_obj(w);
            self.counters.bitmap_clears.fetch_add(1, Ordering::Relaxed);
            local.free.push(p);
        }
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // SMOs and the recyclable log
    // -----------------------------------------------------------------------------------------

    /// Begins a structural modification that replaces the blocks `old` by `new_count` new blocks
    /// on the calling thread's node: takes a free log slot of the thread, records `old` and the
    /// new blocks' addresses and persists that *before* the new blocks are durably allocated.
    ///
    /// Then link the new blocks ([`Smo::new_blocks`]) and unlink the old ones, and finish with
    /// [`Smo::commit`] (or [`Smo::abort`] to give the new blocks back). When every slot is busy
    /// (their old blocks await a grace period), the epoch is advanced a bounded number of times;
    /// if that does not free a slot — e.g. because the caller itself is pinned — the result is
    /// `OutOfSpace` with `requested` = 64 (one log slot).
    ///
    /// Errors: `InvalidArgument` when `old.len() + new_count` is 0 or exceeds [`LOG_ADDRS`],
    /// `BadPointer` for an `old` that is not a Calloc block, `TooManyThreads`, `OutOfSpace`.
    pub fn smo_begin(&self, old: &[PPtr], new_count: usize) -> Result<Smo> {
        // Allocation and logging are the SMO's PM accesses (see `account::smo_scope`).
        let _acct = crate::account::smo_scope();
        let n = old.len() + new_count;
        if n == 0 || n > LOG_ADDRS {
            return Err(PoolError::InvalidArgument(format!(
                "an SMO logs 1..={LOG_ADDRS} blocks, got {} old + {new_count} new",
                old.len()
            )));
        }
        for &p in old {
            self.locate(p)?;
        }
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| PoolError::InvalidArgument("allocator is being dropped".into()))?;
        let node = numakv_numa::current_node().min(self.nodes.len() - 1);
        let np = &self.nodes[node];
        let tid = self.tid()?;
        let pool = &*self.pool;
        let full = if np.geo.log_slots == 64 { u64::MAX } else { (1u64 << np.geo.log_slots) - 1 };
        let mut rounds = 0;
        let mut local = loop {
            let local = np.locals[tid].lock();
            if local.log_busy & full != full {
                break local;
            }
            drop(local);
            if rounds == SLOT_WAIT_ROUNDS {
                return Err(PoolError::OutOfSpace { node, requested: LINE });
            }
            rounds += 1;
            // Completes grace periods so that deferred commits free their slots.
            epoch::pin().flush();
        };
        let slot = (!local.log_busy).trailing_zeros() as usize;

        // Reserve the new blocks (volatile only): first from the ring's head, then the free list.
        let from_ring = (local.tail - local.head).min(new_count as u64);
        let mut new = Vec::with_capacity(new_count);
        for i in 0..from_ring {
            new.push(PPtr::from_raw(
                np.ring_entry(pool, tid, local.head + i).load(Ordering::Acquire),
            ));
        }
        while new.len() < new_count {
            match self.pop_free(np, &mut local) {
                Ok(p) => new.push(p),
                Err(e) => {
                    local.free.extend(new.drain(from_ring as usize..).rev());
                    return Err(e);
                }
            }
        }

        // Log first: addresses, then the state word that makes them count.
        let log = np.log_slot(pool, tid, slot);
        for (a, p) in log.addrs.iter().zip(old.iter().chain(new.iter())) {
            a.store(p.raw(), Ordering::Relaxed);
        }
        // PERSIST: the addresses are durable before the state word can declare them valid.
        pool.persist_obj(&log.addrs);
        log.state.store(log_state(old.len(), new_count), Ordering::Release);
        // PERSIST: the log entry is durable before any new block is durably allocated (paper:
        // "records the addresses of both old leaf and new leaves ... before updating the bitmap").
        pool.persist_obj(&log.state);
        local.log_busy |= 1 << slot;

        // Now allocate them durably.
        if from_ring > 0 {
            local.head += from_ring;
            let ring = np.ring(pool, tid);
            ring.head.store(local.head, Ordering::Release);
            pool.flush_obj(&ring.head);
            self.counters.ring_hits.fetch_add(from_ring, Ordering::Relaxed);
        }
        for &p in &new[from_ring as usize..] {
            let idx = np
                .block_index(p)
                .ok_or_else(|| PoolError::corrupted("free list holds a foreign block"))?;
            pool.flush_obj(np.set_bit(pool, idx));
            self.counters.bitmap_sets.fetch_add(1, Ordering::Relaxed);
        }
        // PERSIST: the ring head and the bits flushed above: the new blocks are durably
        // allocated before the caller links them.
        pool.fence();
        drop(local);
        Ok(Smo { calloc: Some(me), node, tid, slot, old: old.to_vec(), new })
    }

    /// Clears log slot `slot` of thread `tid` on `node`, durably, and marks it free.
    fn clear_slot(&self, node: usize, tid: usize, slot: usize) {
        let Some(np) = self.nodes.get(node) else { return };
        let mut local = np.locals[tid].lock();
        let log = np.log_slot(&self.pool, tid, slot);
        log.state.store(0, Ordering::Release);
        // PERSIST: the slot is durably free before it can be reused; everything it protected
        // (frees of old or new blocks) was persisted before this call.
        self.pool.persist_obj(&log.state);
        local.log_busy &= !(1 << slot);
    }

    // -----------------------------------------------------------------------------------------
    // Recovery
    // -----------------------------------------------------------------------------------------

    /// Opens the Calloc whose directory is `root` (what [`Calloc::create`] returned), after a
    /// crash or a clean close alike: validates the directory and every node pool (`Corrupted` on
    /// anything inconsistent, never a panic), clamps `alloc_num`, replays the recyclable logs —
    /// every logged block that is allocated but for which `is_reachable` is false is freed — and
    /// rebuilds the volatile free lists and ring mirrors.
    ///
    /// `is_reachable(p)` must say whether the engine's recovered structure links block `p`.
    pub fn open(
        pool: Arc<Pool>,
        root: PPtr,
        is_reachable: impl Fn(PPtr) -> bool,
    ) -> Result<(Arc<Calloc>, CallocRecovery)> {
        let start = Instant::now();
        let corrupt = |m: String| PoolError::corrupted(format!("calloc: {m}"));
        let mut report = CallocRecovery::default();

        // Directory.
        let info = pool.page_info(root);
        if info.map(|i| (i.extent, i.owner, i.aux)) != Some((root, OWNER_CALLOC, AUX_DIRECTORY)) {
            return Err(corrupt(format!("{root} is not a Calloc directory extent")));
        }
        let dh: &DirHeader = pool.get(root)?;
        let (magic, version, n) = (
            dh.magic.load(Ordering::Acquire),
            dh.version.load(Ordering::Acquire),
            dh.node_count.load(Ordering::Acquire),
        );
        if magic != DIR_MAGIC || version != FORMAT_VERSION {
            return Err(corrupt(format!("directory magic/version {magic:#x}/{version}")));
        }
        if n != pool.nodes() as u64 || n == 0 || n > MAX_NODES as u64 {
            return Err(corrupt(format!("directory lists {n} nodes, pool has {}", pool.nodes())));
        }
        let mut words = vec![magic, version, n];
        let mut bases = Vec::new();
        for i in 0..n {
            let slot: &PmU64 = pool.get(root.add(64 + 8 * i).unwrap_or(PPtr::NULL))?;
            let b = slot.load(Ordering::Acquire);
            words.push(b);
            bases.push(PPtr::from_raw(b));
        }
        if crc_words(&words) != dh.checksum.load(Ordering::Acquire) {
            return Err(corrupt("directory checksum mismatch".into()));
        }

        // Node pools.
        let mut cfg = None;
        let mut nodes = Vec::with_capacity(bases.len());
        for (node, &base) in bases.iter().enumerate() {
            let info = pool.page_info(base);
            if base.node() != node
                || info.map(|i| (i.extent, i.owner, i.aux))
                    != Some((base, OWNER_CALLOC, AUX_NODE_POOL))
            {
                return Err(corrupt(format!("node {node}: {base} is not a Calloc pool extent")));
            }
            let h: &PoolHeader = pool.get(base)?;
            let ws: Vec<u64> = [
                &h.magic,
                &h.version_node,
                &h.block_size,
                &h.chunk_size,
                &h.chunk_count,
                &h.max_threads,
                &h.ring_capacity,
                &h.log_slots,
                &h.bitmap_off,
                &h.rings_off,
                &h.logs_off,
                &h.chunks_off,
                &h.total_bytes,
            ]
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect();
            if ws[0] != POOL_MAGIC || ws[1] != FORMAT_VERSION | ((node as u64) << 32) {
                return Err(corrupt(format!(
                    "node {node}: pool magic/version/node {:#x}/{:#x}",
                    ws[0], ws[1]
                )));
            }
            if crc_words(&ws) != h.checksum.load(Ordering::Acquire) {
                return Err(corrupt(format!("node {node}: pool header checksum mismatch")));
            }
            let c = CallocConfig {
                block_size: ws[2],
                chunk_size: ws[3],
                chunks_per_node: ws[4],
                max_threads: usize::try_from(ws[5]).unwrap_or(usize::MAX),
                ring_capacity: ws[6],
                log_slots: usize::try_from(ws[7]).unwrap_or(usize::MAX),
            };
            c.validate().map_err(|e| corrupt(format!("node {node}: header config: {e}")))?;
            let geo = Geometry::compute(&c)?;
            let stored = [ws[8], ws[9], ws[10], ws[11], ws[12]];
            if stored
                != [geo.bitmap_off, geo.rings_off, geo.logs_off, geo.chunks_off, geo.total_bytes]
            {
                return Err(corrupt(format!(
                    "node {node}: header offsets disagree with its config"
                )));
            }
            let extent_bytes = pool
                .extents(node)?
                .iter()
                .find(|e| e.ptr == base)
                .map_or(0, |e| e.pages * pool.page_size());
            if extent_bytes < geo.total_bytes {
                return Err(corrupt(format!("node {node}: pool larger than its extent")));
            }
            if *cfg.get_or_insert_with(|| c.clone()) != c {
                return Err(corrupt(format!("node {node}: config differs from node 0's")));
            }
            nodes.push(Self::node_pool(node, base, geo));
        }
        let cfg = cfg.ok_or_else(|| corrupt("no nodes".into()))?;

        // alloc_num, bitmap beyond the handed-out chunks, rings.
        let mut in_ring = HashSet::new();
        for np in &nodes {
            let geo = &np.geo;
            let an = &np.header(&pool).alloc_num;
            if an.load(Ordering::Acquire) > geo.chunk_count {
                an.store(geo.chunk_count, Ordering::Release);
                // PERSIST: the clamp, so a later overshoot cannot wrap the counter.
                pool.persist_obj(an);
                report.alloc_num_clamped += 1;
            }
            let first_unused = np.alloc_num(&pool) * geo.blocks_per_chunk;
            for w in 0..geo.bitmap_words {
                let word = np.bitmap_word(&pool, w * 64).load_unaccounted(Ordering::Acquire);
                let lo = w * 64;
                let mask = if first_unused <= lo {
                    u64::MAX
                } else if first_unused >= lo + 64 {
                    0
                } else {
                    u64::MAX << (first_unused - lo)
                };
                if word & mask != 0 {
                    return Err(corrupt(format!(
                        "node {}: allocation bits set beyond the handed-out chunks (word {w})",
                        np.node
                    )));
                }
            }
            for tid in 0..geo.max_threads as usize {
                let ring = np.ring(&pool, tid);
                let (head, tail) = (
                    ring.head.load_unaccounted(Ordering::Acquire),
                    ring.tail.load_unaccounted(Ordering::Acquire),
                );
                if tail < head || tail - head > geo.ring_capacity {
                    return Err(corrupt(format!(
                        "node {} ring {tid}: head {head}, tail {tail}",
                        np.node
                    )));
                }
                for i in head..tail {
                    let p = PPtr::from_raw(
                        np.ring_entry(&pool, tid, i).load_unaccounted(Ordering::Acquire),
                    );
                    let ok = np.block_index(p).is_some_and(|idx| np.bit_is_set(&pool, idx));
                    if !ok || !in_ring.insert(p) {
                        return Err(corrupt(format!(
                            "node {} ring {tid}: entry {p} is not a distinct allocated block",
                            np.node
                        )));
                    }
                }
                let mut local = np.locals[tid].lock();
                local.head = head;
                local.tail = tail;
            }
        }
        report.ring_blocks = in_ring.len() as u64;

        // Recyclable logs: collect the ACTIVE slots' blocks, free the allocated unreachable ones.
        let mut logged = HashSet::new();
        let mut active = Vec::new();
        for np in &nodes {
            for tid in 0..np.geo.max_threads as usize {
                for s in 0..np.geo.log_slots as usize {
                    let log = np.log_slot(&pool, tid, s);
                    let st = log.state.load_unaccounted(Ordering::Acquire);
                    if st == 0 {
                        continue;
                    }
                    let (n_old, n_new) = decode_log_state(st).ok_or_else(|| {
                        corrupt(format!("node {} log {tid}/{s}: state word {st:#x}", np.node))
                    })?;
                    for a in &log.addrs[..n_old + n_new] {
                        let p = PPtr::from_raw(a.load_unaccounted(Ordering::Acquire));
                        if !nodes.get(p.node()).is_some_and(|x| x.block_index(p).is_some()) {
                            return Err(corrupt(format!(
                                "node {} log {tid}/{s}: {p} is not a block",
                                np.node
                            )));
                        }
                        logged.insert(p);
                    }
                    active.push(log);
                }
            }
        }
        let mut freed = Vec::new();
        for &p in &logged {
            let np = &nodes[p.node()];
            let idx = np.block_index(p).unwrap_or(0);
            if np.bit_is_set(&pool, idx) && !in_ring.contains(&p) && !is_reachable(p) {
                pool.flush_obj(np.clear_bit(&pool, idx));
                freed.push(p);
            }
        }
        // PERSIST: the freed blocks' bits are durably clear before the slots that justify
        // freeing them are cleared (a crash in between repeats this idempotent step).
        pool.fence();
        for log in &active {
            log.state.store(0, Ordering::Release);
            pool.flush_obj(&log.state);
        }
        // PERSIST: the cleared slots.
        pool.fence();
        report.blocks_recovered = freed.len() as u64;
        report.log_slots_replayed = active.len() as u64;

        // Free lists: every clear bit of a handed-out chunk.
        for np in &nodes {
            let end = np.alloc_num(&pool) * np.geo.blocks_per_chunk;
            let mut free: Vec<PPtr> =
                (0..end).filter(|&i| !np.bit_is_set(&pool, i)).map(|i| np.block_ptr(i)).collect();
            report.free_blocks += free.len() as u64;
            free.reverse(); // taken from the end: lowest addresses first
            *np.shared_free.lock() = free;
        }
        let calloc = Self::assemble(pool, root, cfg, nodes);
        calloc.counters.bitmap_clears.store(freed.len() as u64, Ordering::Relaxed);
        report.elapsed = start.elapsed();
        Ok((calloc, report))
    }

    // -----------------------------------------------------------------------------------------
    // Inspection
    // -----------------------------------------------------------------------------------------

    /// Whether `p`'s allocation bit is set (true also for blocks waiting in a ring).
    pub fn bit_is_set(&self, p: PPtr) -> Result<bool> {
        let (np, idx) = self.locate(p)?;
        Ok(np.bit_is_set(&self.pool, idx))
    }

    fn ring_blocks(&self, np: &NodePool) -> HashSet<PPtr> {
        let mut set = HashSet::new();
        for tid in 0..np.geo.max_threads as usize {
            let local = np.locals[tid].lock();
            for i in local.head..local.tail {
                let e = np.ring_entry(&self.pool, tid, i).load_unaccounted(Ordering::Acquire);
                set.insert(PPtr::from_raw(e));
            }
        }
        set
    }

    /// Every allocated block (bit set, not in a ring), in address order per node: the leak
    /// check's view. Exact only while no thread allocates or frees.
    pub fn allocated_blocks(&self) -> Vec<PPtr> {
        let mut out = Vec::new();
        for np in &self.nodes {
            let rings = self.ring_blocks(np);
            let end = np.alloc_num(&self.pool) * np.geo.blocks_per_chunk;
            out.extend(
                (0..end)
                    .filter(|&i| np.bit_is_set(&self.pool, i))
                    .map(|i| np.block_ptr(i))
                    .filter(|p| !rings.contains(p)),
            );
        }
        out
    }

    /// Figures per node and session counters. Exact only while no thread allocates or frees.
    pub fn stats(&self) -> CallocStats {
        let c = &self.counters;
        let mut s = CallocStats {
            nodes: Vec::new(),
            ring_hits: c.ring_hits.load(Ordering::Relaxed),
            ring_pushes: c.ring_pushes.load(Ordering::Relaxed),
            bitmap_sets: c.bitmap_sets.load(Ordering::Relaxed),
            bitmap_clears: c.bitmap_clears.load(Ordering::Relaxed),
            chunks_taken: c.chunks_taken.load(Ordering::Relaxed),
        };
        for np in &self.nodes {
            let rings = self.ring_blocks(np).len() as u64;
            let handed = np.alloc_num(&self.pool);
            let set = (0..handed * np.geo.blocks_per_chunk)
                .filter(|&i| np.bit_is_set(&self.pool, i))
                .count() as u64;
            let free = np.locals.iter().map(|l| l.lock().free.len() as u64).sum::<u64>()
                + np.shared_free.lock().len() as u64;
            s.nodes.push(NodeStats {
                chunks_total: np.geo.chunk_count,
                chunks_handed_out: handed,
                allocated_blocks: set.saturating_sub(rings),
                ring_blocks: rings,
                free_list_blocks: free,
            });
        }
        s
    }
}

impl PmAllocator for Calloc {
    /// One block on the calling thread's node ([`numakv_numa::current_node`]); `size` must not
    /// exceed the block size.
    fn alloc(&self, size: usize) -> Result<PPtr> {
        if size as u64 > self.cfg.block_size {
            return Err(PoolError::InvalidArgument(format!(
                "Calloc serves blocks of {} bytes, {size} requested",
                self.cfg.block_size
            )));
        }
        self.alloc_on(numakv_numa::current_node().min(self.nodes.len() - 1))
    }

    unsafe fn free(&self, p: PPtr) -> Result<()> {
        self.free_block(p)
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

// ---------------------------------------------------------------------------------------------
// SMO handle
// ---------------------------------------------------------------------------------------------

/// An SMO in flight: its log slot is ACTIVE. Finish it with [`Smo::commit`] or [`Smo::abort`];
/// dropping it unfinished aborts it.
#[derive(Debug)]
pub struct Smo {
    /// `None` once finished.
    calloc: Option<Arc<Calloc>>,
    node: usize,
    tid: usize,
    slot: usize,
    old: Vec<PPtr>,
    new: Vec<PPtr>,
}

impl Smo {
    /// The new blocks, durably allocated and logged; link them.
    pub fn new_blocks(&self) -> &[PPtr] {
        &self.new
    }

    /// The old blocks the SMO replaces.
    pub fn old_blocks(&self) -> &[PPtr] {
        &self.old
    }

    /// Ends the SMO: the old blocks are retired through the epoch — freed once every thread
    /// pinned now has unpinned — and only after that free the log slot is cleared, so a crash at
    /// any point is repaired by recovery. If the allocator is dropped before the grace period
    /// ends, nothing is freed now and the next [`Calloc::open`] frees the (unreachable) old
    /// blocks from the log.
    ///
    /// # Safety
    /// The new blocks must be linked and the old ones unlinked: no new reader may reach an old
    /// block, and no old block may be freed or retired by anyone else.
    pub unsafe fn commit(mut self, guard: &epoch::Guard) {
        let Some(calloc) = self.calloc.take() else { return };
        let weak = Arc::downgrade(&calloc);
        drop(calloc);
        let (node, tid, slot) = (self.node, self.tid, self.slot);
        let old = std::mem::take(&mut self.old);
        guard.defer(move || {
            let Some(c) = weak.upgrade() else { return };
            // Runs in whichever operation collects the epoch: the SMO's work, counted as such.
            let _acct = crate::account::smo_scope();
            for p in old {
                // A deferred function has nobody to report an error to; on one, leave the slot
                // ACTIVE so that recovery frees what is still allocated.
                if c.free_block(p).is_err() {
                    return;
                }
            }
            c.clear_slot(node, tid, slot);
        });
    }

    /// Cancels the SMO: the new blocks are freed (the old ones stay as they are) and the slot is
    /// cleared.
    pub fn abort(mut self) {
        self.abort_inner();
    }

    fn abort_inner(&mut self) {
        let Some(c) = self.calloc.take() else { return };
        let _acct = crate::account::smo_scope();
        for &p in &self.new {
            if c.free_block(p).is_err() {
                return; // slot stays ACTIVE; recovery frees what is still allocated
            }
        }
        c.clear_slot(self.node, self.tid, self.slot);
    }
}

impl Drop for Smo {
    fn drop(&mut self) {
        self.abort_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        assert!(CallocConfig::default().validate().is_ok());
        let bad = [
            CallocConfig { block_size: 100, ..Default::default() },
            CallocConfig { block_size: 0, ..Default::default() },
            CallocConfig { chunk_size: 1000, ..Default::default() },
            CallocConfig { chunks_per_node: 0, ..Default::default() },
            CallocConfig { max_threads: 0, ..Default::default() },
            CallocConfig { ring_capacity: 0, ..Default::default() },
            CallocConfig { log_slots: 65, ..Default::default() },
            CallocConfig { chunk_size: 1 << 40, chunks_per_node: 1 << 30, ..Default::default() },
        ];
        for c in bad {
            assert!(matches!(c.validate(), Err(PoolError::InvalidArgument(_))), "{c:?}");
        }
    }

    #[test]
    fn log_state_round_trips_and_rejects_garbage() {
        assert_eq!(decode_log_state(log_state(1, 2)), Some((1, 2)));
        assert_eq!(decode_log_state(log_state(0, 7)), Some((0, 7)));
        assert_eq!(decode_log_state(log_state(4, 4)), None);
        assert_eq!(decode_log_state(log_state(0, 0)), None);
        assert_eq!(decode_log_state(0xdead_beef), None);
    }

    #[test]
    fn geometry_is_line_aligned() {
        let c = CallocConfig {
            chunk_size: 64 << 10,
            ring_capacity: 5,
            log_slots: 3,
            ..Default::default()
        };
        let g = Geometry::compute(&c).unwrap();
        assert_eq!(g.rings_off % 64, 0);
        assert_eq!(g.ring_stride, 64 + 64);
        assert_eq!(g.logs_off, g.rings_off + 64 * g.ring_stride);
        assert_eq!(g.chunks_off % 4096, 0);
        assert!(g.chunks_off >= g.logs_off + 64 * 3 * 64);
        assert_eq!(g.total_blocks, 4 * 256);
    }
}
