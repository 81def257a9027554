//! Inner nodes (DRAM): FAST&FAIR's node structure plus a high key and a sibling pointer
//! (B-link), updated atomically through [`htm`], searched lock-free with the paper's
//! shift-aware search (papers/nbtree.txt §IV-C).
//!
//! A node holds `count` separators `keys[0..count)` (ascending) and children: `leftmost` for keys
//! below `keys[0]`, `kids[i]` for `keys[i] ≤ key < keys[i+1]`; every key of the subtree is below
//! `high` (`u64::MAX` = +inf). Children of level-1 nodes are leaves ([`LeafMeta`]), of higher
//! levels inner nodes. Separators only ever get inserted (a leaf SMO replaces its child pointer
//! in place and inserts the right leaf's separator; NBTree never merges), so every shift moves
//! entries to the right and the switch counter keeps its "forward" parity; it is maintained all
//! the same, so that a deletion could be added without changing readers.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::leaf::LeafMeta;

/// Separators per inner node (FAST&FAIR-sized: 64 × 16 bytes ≈ 1 KiB of entries).
pub const INNER_CAP: usize = 64;

/// The atomic-update abstraction for inner nodes: where NBTree uses an HTM transaction
/// (`xbegin`/`xend`), this hardware-neutral fallback uses a per-node version word.
///
/// ```text
/// version word: bit 0  locked (a writer is inside its "transaction")
///               bits 1..64  version, +1 at every commit
/// writer:  CAS(v even → v|1) … stores … store(v+2)          (= xbegin … xend)
/// reader:  v = load (wait while odd) … loads … load == v ?   (= a non-transactional reader
///                                                              that validates; retry if not)
/// ```
///
/// A writer's stores become visible to validated readers all at once, as HTM's commit makes
/// them; an HTM path would replace [`htm::VersionLock::begin`]/drop of the guard with
/// `xbegin`/`xend` (falling back to the lock on abort) and leave readers as they are.
pub mod htm {
    use std::sync::atomic::{fence, AtomicU64, Ordering};

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
                    // ORDERING: the lock word store must be visible before the node's data
                    // stores, or a reader could validate an unchanged version around a torn
                    // read: a Release fence orders the CAS before the following stores.
                    fence(Ordering::Release);
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

        /// Starts an optimistic read: the current (even) version, waiting out a writer.
        #[inline]
        pub fn read_begin(&self) -> u64 {
            loop {
                // ORDERING: Acquire; pairs with the Release store of the writer's commit.
                let v = self.0.load(Ordering::Acquire);
                if v & 1 == 0 {
                    return v;
                }
                std::hint::spin_loop();
            }
        }

        /// True when no writer committed or started since `read_begin` returned `v`.
        #[inline]
        pub fn validate(&self, v: u64) -> bool {
            // ORDERING: Acquire fence: the data loads before it are ordered before the version
            // load after it (seqlock read side).
            fence(Ordering::Acquire);
            self.0.load(Ordering::Relaxed) == v
        }
    }

    impl Drop for Txn<'_> {
        fn drop(&mut self) {
            // ORDERING: Release; publishes the transaction's stores to validating readers.
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
    /// FAST&FAIR's switch counter: even = last shift rightward (insert).
    pub switch: AtomicU64,
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
            switch: AtomicU64::new(0),
            count: AtomicUsize::new(0),
            high: AtomicU64::new(high),
            sibling: AtomicPtr::new(std::ptr::null_mut()),
            leftmost: AtomicUsize::new(leftmost),
            keys: std::array::from_fn(|_| AtomicU64::new(0)),
            kids: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// Lock-free search for the child covering `key`: the shift-aware linear search (the key of
    /// a chosen entry is read again after its pointer; a changed key means a concurrent shift
    /// moved it and the search continues from the current position), then the B-link check
    /// against the high key, then validation of the version word.
    pub fn step(&self, key: u64) -> Step {
        loop {
            let v = self.lock.read_begin();
            // ORDERING: Relaxed loads inside a validated read (seqlock): validate() orders them.
            let high = self.high.load(Ordering::Relaxed);
            if key >= high {
                let s = self.sibling.load(Ordering::Relaxed);
                if self.lock.validate(v) && !s.is_null() {
                    return Step::Right(s);
                }
                continue;
            }
            let n = self.count.load(Ordering::Relaxed).min(INNER_CAP);
            let mut child = self.leftmost.load(Ordering::Relaxed);
            let mut i = 0;
            while i < n {
                let k = self.keys[i].load(Ordering::Relaxed);
                if key < k {
                    break;
                }
                let c = self.kids[i].load(Ordering::Relaxed);
                if self.keys[i].load(Ordering::Relaxed) != k {
                    // Shift-aware: the entry moved under us; re-examine this position.
                    continue;
                }
                child = c;
                i += 1;
            }
            if self.lock.validate(v) {
                return Step::Child(child);
            }
        }
    }

    /// Inserts `(key, child)` in a node with room, inside a write transaction; FAST order
    /// (shift right-to-left, pointer before key), so lock-free readers see no gap.
    pub fn insert_entry(&self, _txn: &htm::Txn<'_>, key: u64, child: usize) {
        // ORDERING (whole function): Relaxed stores inside a transaction; the commit's Release
        // publishes them.
        let n = self.count.load(Ordering::Relaxed);
        debug_assert!(n < INNER_CAP);
        if self.switch.load(Ordering::Relaxed) % 2 == 1 {
            self.switch.fetch_add(1, Ordering::Relaxed);
        }
        let mut i = n;
        while i > 0 && self.keys[i - 1].load(Ordering::Relaxed) > key {
            self.kids[i].store(self.kids[i - 1].load(Ordering::Relaxed), Ordering::Relaxed);
            self.keys[i].store(self.keys[i - 1].load(Ordering::Relaxed), Ordering::Relaxed);
            i -= 1;
        }
        self.kids[i].store(child, Ordering::Relaxed);
        self.keys[i].store(key, Ordering::Relaxed);
        self.count.store(n + 1, Ordering::Relaxed);
    }

    /// Replaces child pointer `old` by `new` (in place, one store); false if `old` is not a
    /// child of this node.
    pub fn replace_child(&self, _txn: &htm::Txn<'_>, old: usize, new: usize) -> bool {
        // ORDERING: Relaxed inside a transaction, as insert_entry.
        if self.leftmost.load(Ordering::Relaxed) == old {
            self.leftmost.store(new, Ordering::Relaxed);
            return true;
        }
        let n = self.count.load(Ordering::Relaxed);
        for k in &self.kids[..n] {
            if k.load(Ordering::Relaxed) == old {
                k.store(new, Ordering::Relaxed);
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
        self.switch.fetch_add(2, Ordering::Relaxed);
        self.count.store(m, Ordering::Relaxed);
        self.high.store(sep, Ordering::Relaxed);
        self.sibling.store(&*sib as *const Inner as *mut Inner, Ordering::Relaxed);
        let _ = txn;
        (sep, sib)
    }

    /// All children, in key order (validated snapshot).
    pub fn children(&self) -> Vec<(u64, usize)> {
        loop {
            let v = self.lock.read_begin();
            // ORDERING: Relaxed inside a validated read.
            let n = self.count.load(Ordering::Relaxed).min(INNER_CAP);
            let mut out = Vec::with_capacity(n + 1);
            out.push((0, self.leftmost.load(Ordering::Relaxed)));
            for i in 0..n {
                out.push((
                    self.keys[i].load(Ordering::Relaxed),
                    self.kids[i].load(Ordering::Relaxed),
                ));
            }
            if self.lock.validate(v) {
                return out;
            }
        }
    }
}

/// A leaf pointer as stored in level-1 nodes.
pub fn leaf_word(p: *const LeafMeta) -> usize {
    p as usize
}
