//! Inner nodes (DRAM): FAST&FAIR's node structure plus a high key and a sibling pointer
//! (B-link), updated atomically through [`htm`] (writers), searched lock-free with the paper's
//! shift-aware search (readers never wait for a writer; papers/nbtree.txt §IV-C).
//!
//! A node holds `count` separators `keys[0..count)` (ascending) and children: `leftmost` for keys
//! below `keys[0]`, `kids[i]` for `keys[i] ≤ key < keys[i+1]`; every key of the subtree is below
//! `high` (`u64::MAX` = +inf). Children of level-1 nodes are leaves ([`LeafMeta`]), of higher
//! levels inner nodes.
//!
//! # Why a reader that never validates is safe
//!
//! Writers store in FAST order with Release stores (a shift moves entries right, from the end,
//! each slot's child before its key; the new entry's child, then its key; `count` last; a split
//! publishes the sibling, then the high key, then the lower count). Separators are only ever
//! inserted — NBTree never merges, and a leaf SMO replaces a child by its copy, which has the
//! same low key — so:
//!
//! 1. every write to `keys[i]` lowers it (a shift writes `keys[i-1]`, the new entry a key
//!    below the one it displaces, and after a split every new key is below the separator while
//!    the slots left beyond `count` hold keys at or above it);
//! 2. the key stored right after a child is that child's low key.
//!
//! A reader loads `keys[i]` (Acquire), then `kids[i]`: the child it gets was stored no earlier
//! than the child paired with the key it read, so its low key is at most that key, hence at most
//! the search key. A reader therefore never lands *right* of the correct child; it may land left
//! (a stale count, a slot mid-shift, the old high key of a split node), and B-link moves right
//! (the child's high key, and `next` at the leaf level in `settle`) take it to the right one.
//! The paper's shift-aware check — the key read again after its child, the position
//! re-examined when it changed — keeps the landing exact in the common case.
//!
//! FAST&FAIR's switch counter tells a reader which way the last shift went (inserts shift
//! right, deletes left) so that it scans in the safe direction. With inserts only, every shift
//! goes right and left-to-right is always the safe direction: the counter would be dead code,
//! and it is not kept. A delete path would need it back (and property 1 would no longer hold).

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::leaf::LeafMeta;

/// Separators per inner node (FAST&FAIR-sized: 64 × 16 bytes ≈ 1 KiB of entries).
pub const INNER_CAP: usize = 64;

/// The atomic-update abstraction for inner nodes: where NBTree uses an HTM transaction
/// (`xbegin`/`xend`), this hardware-neutral fallback serialises the writers of a node with a
/// per-node version word.
///
/// ```text
/// version word: bit 0  locked (a writer is inside its "transaction")
///               bits 1..64  version, +1 at every commit
/// writer:  CAS(v even → v|1) … stores … store(v+2)          (= xbegin … xend)
/// ```
///
/// Readers do not look at the word: an HTM commit would make a writer's stores visible at
/// once, while here they appear one by one — in the FAST order that the lock-free search
/// tolerates (see the module docs). Writers of one node wait for each other (spin, then
/// yield); they are the SMOs' parent updates and inner splits, never a read. An HTM path would
/// replace [`htm::VersionLock::begin`]/drop of the guard with `xbegin`/`xend` (falling back to
/// the lock on abort) and leave readers as they are.
pub mod htm {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A node's version word (see the parent module).
    #[derive(Debug, Default)]
    pub struct VersionLock(AtomicU64);

    /// An open write "transaction" on one node; committed (version bumped, lock released) on
    /// drop, so it cannot be forgotten.
    #[derive(Debug)]
    pub struct Txn<'a> {
        lock: &'a VersionLock,
        v: u64,
    }

    impl VersionLock {
        /// Begins a write transaction (spins while another writer holds the node).
        pub fn begin(&self) -> Txn<'_> {
            let mut spins = 0u32;
            loop {
                let v = self.0.load(Ordering::Relaxed);
                // ORDERING: Acquire on success; pairs with the Release in Txn::drop, so the
                // previous writer's stores are visible.
                if v & 1 == 0
                    && self
                        .0
                        .compare_exchange_weak(v, v | 1, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return Txn { lock: self, v };
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }

        /// Commits so far (a writer's count, for tests and diagnostics).
        pub fn version(&self) -> u64 {
            // ORDERING: Relaxed; a counter.
            self.0.load(Ordering::Relaxed) >> 1
        }
    }

    impl Drop for Txn<'_> {
        fn drop(&mut self) {
            // ORDERING: Release; publishes the transaction's stores to the next writer.
            self.lock.0.store(self.v + 2, Ordering::Release);
        }
    }
}

/// One inner node.
#[derive(Debug)]
pub struct Inner {
    /// The version word ([`htm::VersionLock`]).
    pub lock: htm::VersionLock,
    /// 1 = children are leaves.
    pub level: u32,
    /// Separators in use.
    pub count: AtomicUsize,
    /// Exclusive upper bound of the node's keys.
    pub high: AtomicU64,
    /// Right sibling (B-link).
    pub sibling: AtomicPtr<Inner>,
    /// Child for keys below `keys[0]`.
    pub leftmost: AtomicUsize,
    /// Separators.
    pub keys: [AtomicU64; INNER_CAP],
    /// Children right of each separator.
    pub kids: [AtomicUsize; INNER_CAP],
}

/// Where a search step leads.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// The child covering the key (a `*const Inner` or `*const LeafMeta` as usize).
    Child(usize),
    /// The key is at or above this node's high key: go right.
    Right(*mut Inner),
}

impl Inner {
    /// An empty node of `level` whose only child is `leftmost`.
    pub fn new(level: u32, leftmost: usize, high: u64) -> Inner {
        Inner {
            lock: htm::VersionLock::default(),
            level,
            count: AtomicUsize::new(0),
            high: AtomicU64::new(high),
            sibling: AtomicPtr::new(std::ptr::null_mut()),
            leftmost: AtomicUsize::new(leftmost),
            keys: std::array::from_fn(|_| AtomicU64::new(0)),
            kids: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// Lock-free search for the child covering `key` (or a child left of it, which B-link
    /// corrects; see the module docs): the B-link check against the high key, then the
    /// shift-aware linear search (the key of a chosen entry is read again after its child; a
    /// changed key means a concurrent shift moved it, and the position is examined again). No
    /// waiting and no retry of the whole node: a writer parked mid-shift delays nobody.
    pub fn step(&self, key: u64) -> Step {
        // ORDERING (whole function): Acquire loads; pair with the writers' Release stores
        // (insert_entry, split), which is what the module docs' argument needs.
        let high = self.high.load(Ordering::Acquire);
        if key >= high {
            // A split stores the sibling before the high key: it is set.
            return Step::Right(self.sibling.load(Ordering::Acquire));
        }
        let n = self.count.load(Ordering::Acquire).min(INNER_CAP);
        let mut child = self.leftmost.load(Ordering::Acquire);
        let mut i = 0;
        while i < n {
            let k = self.keys[i].load(Ordering::Acquire);
            if key < k {
                break;
            }
            let c = self.kids[i].load(Ordering::Acquire);
            if self.keys[i].load(Ordering::Acquire) != k {
                // Shift-aware: the entry moved under us; re-examine this position (its key
                // only goes down, so this ends when the writer stops).
                continue;
            }
            child = c;
            i += 1;
        }
        Step::Child(child)
    }

    /// Inserts `(key, child)` in a node with room, inside a write transaction; FAST order
    /// (shift right-to-left, each slot's child before its key, the count last), so lock-free
    /// readers see no gap and never a child right of their key.
    pub fn insert_entry(&self, _txn: &htm::Txn<'_>, key: u64, child: usize) {
        // ORDERING (whole function): loads Relaxed (the transaction's Acquire covers earlier
        // writers); stores Release, in the order the module docs' argument relies on.
        let n = self.count.load(Ordering::Relaxed);
        debug_assert!(n < INNER_CAP);
        let mut i = n;
        while i > 0 && self.keys[i - 1].load(Ordering::Relaxed) > key {
            self.kids[i].store(self.kids[i - 1].load(Ordering::Relaxed), Ordering::Release);
            self.keys[i].store(self.keys[i - 1].load(Ordering::Relaxed), Ordering::Release);
            i -= 1;
        }
        numakv_pmem::pause_point!("nbtree.inner.shifted");
        self.kids[i].store(child, Ordering::Release);
        self.keys[i].store(key, Ordering::Release);
        self.count.store(n + 1, Ordering::Release);
    }

    /// Replaces child pointer `old` by `new` (in place, one store); false if `old` is not a
    /// child of this node.
    pub fn replace_child(&self, _txn: &htm::Txn<'_>, old: usize, new: usize) -> bool {
        // ORDERING: loads Relaxed inside a transaction; the store Release: a reader that takes
        // the new child sees it initialised. The copy has the old child's low key, so either
        // pointer is a correct landing.
        if self.leftmost.load(Ordering::Relaxed) == old {
            self.leftmost.store(new, Ordering::Release);
            return true;
        }
        let n = self.count.load(Ordering::Relaxed);
        for k in &self.kids[..n] {
            if k.load(Ordering::Relaxed) == old {
                k.store(new, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Moves the upper half of a full node into a new right sibling (inside `txn`): returns the
    /// separator and the sibling. The node's high key becomes the separator, its sibling the new
    /// node (B-link): readers that arrive for the moved keys go right.
    pub fn split(&self, txn: &htm::Txn<'_>) -> (u64, Box<Inner>) {
        // ORDERING: Relaxed inside a transaction, as insert_entry.
        let n = self.count.load(Ordering::Relaxed);
        let m = n / 2;
        let sep = self.keys[m].load(Ordering::Relaxed);
        let sib = Inner::new(
            self.level,
            self.kids[m].load(Ordering::Relaxed),
            self.high.load(Ordering::Relaxed),
        );
        sib.sibling.store(self.sibling.load(Ordering::Relaxed), Ordering::Relaxed);
        for i in m + 1..n {
            sib.keys[i - m - 1].store(self.keys[i].load(Ordering::Relaxed), Ordering::Relaxed);
            sib.kids[i - m - 1].store(self.kids[i].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        sib.count.store(n - m - 1, Ordering::Relaxed);
        let sib = Box::new(sib);
        // ORDERING: Release stores, sibling → high → count: a reader that sees the new high
        // key sees the sibling (and, through it, the sibling's contents, written above); one
        // that still sees the old count or high key lands left of its child at worst.
        self.sibling.store(&*sib as *const Inner as *mut Inner, Ordering::Release);
        self.high.store(sep, Ordering::Release);
        self.count.store(m, Ordering::Release);
        let _ = txn;
        (sep, sib)
    }

    /// All children, in key order. A snapshot for callers that have the tree to themselves
    /// (recovery, checks): concurrent writers may show through.
    pub fn children(&self) -> Vec<(u64, usize)> {
        // ORDERING: Acquire, as step().
        let n = self.count.load(Ordering::Acquire).min(INNER_CAP);
        let mut out = Vec::with_capacity(n + 1);
        out.push((0, self.leftmost.load(Ordering::Acquire)));
        for i in 0..n {
            out.push((self.keys[i].load(Ordering::Acquire), self.kids[i].load(Ordering::Acquire)));
        }
        out
    }
}

/// A leaf pointer as stored in level-1 nodes.
pub fn leaf_word(p: *const LeafMeta) -> usize {
    p as usize
}
