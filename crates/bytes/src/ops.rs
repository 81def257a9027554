//! Point operations: lock-free reads, and writes that build new nodes, persist them and
//! publish with one 8-byte store (docs/design.md, "Byte-string layer", Operations).
//!
//! A write of key `k` with index key `x = index_key(k)`:
//! - a put or update of the key of a cell (a root of one pair) with a value that fits: the
//!   stripe lock of `x` exclusively, the engine's `get`, and the cell rewritten in place with
//!   one fence (`crate::cell`);
//! - inside a tree, when the leaf stays one leaf: the stripe lock of `x` shared, the leaf's slot
//!   lock, a new leaf, a persisted in-place store into the slot ([`Bytes::write`]'s shared path);
//! - otherwise the stripe lock of `x` exclusively: the root through the engine's
//!   [`Index::update_with`] (a root leaf that stays one leaf is replaced inside it, one descent),
//!   or a descent that remembers the path; a split or a removal copies the path up to the first
//!   node that keeps its shape (and a removal the neighbour's edge whose range grows), then
//!   publishes with one slot store or the engine's `upsert`/`remove`;
//! - then retires what it replaced: freed once every reader pinned now has unpinned.
//!
//! A read pins the epoch, reads the root of `x` from the engine and descends in place; the pin
//! keeps nodes that a writer retires meanwhile from being freed under it.

use numakv_index::{Error, Index, Result};
use numakv_pmem::alloc::{epoch, retire, PmAllocator};
use numakv_pmem::PPtr;
use parking_lot::{Mutex, RwLock};

use std::sync::atomic::{AtomicBool, Ordering};

use numakv_pmem::alloc::nsm::Nsm;

use crate::cell::{cell_bytes, cell_words, write_cell};
use crate::layout::{
    check_key, check_value, entry_bytes, index_key, inner_bytes, write_inner, write_record, Inner,
    Node, Record, RecordImage, HEADER_BYTES, LAYER,
};
use crate::tree;
use crate::Bytes;

/// Stripe locks (a power of two).
const STRIPES: usize = 1024;

/// The writer locks: per stripe of index keys a readers-writer lock — held shared by a write
/// that rewrites one leaf inside a prefix's tree, exclusively by every other write (one that
/// changes the tree's shape, or the root) — and per stripe of child slots a mutex, which
/// serialises the writers of one leaf among the shared holders.
pub(crate) struct Stripes {
    prefixes: Box<[crossbeam_utils::CachePadded<Prefixes>]>,
    slots: Box<[crossbeam_utils::CachePadded<Mutex<()>>]>,
    /// Mechanism counters of this session (the kit's coverage gates): cells rewritten in
    /// place, and leaf rewrites that split or emptied the leaf (the tree path).
    pub(crate) cells_rewritten: std::sync::atomic::AtomicU64,
    pub(crate) leaf_splits: std::sync::atomic::AtomicU64,
}

/// One stripe of prefixes.
#[derive(Default)]
struct Prefixes {
    lock: RwLock<()>,
    /// A hint, not a fact: whether the last write of this stripe found its prefix's root to be
    /// an inner node. Writes try the shared path only then, so that a prefix of one leaf (keys
    /// with their own 8-byte prefix, the common case) costs no extra engine lookup.
    trees: AtomicBool,
    /// A hint, not a fact: whether the last exclusive write of this stripe found a root leaf
    /// holding more than one pair. Puts and updates try the in-place rewrite of a cell first
    /// only when neither hint is set, so that prefixes shared by several keys pay no extra
    /// engine lookup.
    crowded: AtomicBool,
}

/// Fibonacci hashing onto `STRIPES` buckets: neighbouring values land on different stripes.
fn stripe(v: u64) -> usize {
    (v.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - STRIPES.trailing_zeros())) as usize
}

impl Stripes {
    pub(crate) fn new() -> Stripes {
        Stripes {
            prefixes: (0..STRIPES).map(|_| Default::default()).collect(),
            slots: (0..STRIPES).map(|_| Default::default()).collect(),
            cells_rewritten: Default::default(),
            leaf_splits: Default::default(),
        }
    }

    fn of(&self, x: u64) -> &Prefixes {
        &self.prefixes[stripe(x)]
    }

    /// The stripe number of index key `x` (a batch locks its stripes in ascending order).
    pub(crate) fn index_of(x: u64) -> usize {
        stripe(x)
    }

    /// The exclusive lock of stripe number `i` (from [`Stripes::index_of`]).
    pub(crate) fn lock_exclusive(&self, i: usize) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.prefixes[i].lock.write()
    }

    /// The lock of child slot `i` of the inner node at `node`.
    fn slot(&self, node: PPtr, i: usize) -> &Mutex<()> {
        &self.slots[stripe(node.raw().wrapping_add(8 * i as u64))]
    }
}

/// Lines of a node that [`prefetch_node`] asks for: a cell of a 16-byte key and a value of up
/// to 112 bytes (two slots) whole, or a record's first 320 bytes.
const PREFETCH_LINES: usize = 5;

/// Asks the CPU to start loading the first lines of the node at `p`: its header and the lines
/// after it then arrive in parallel instead of one miss after the other (the header says where
/// a cell's active slot is, a record's entries follow it).
#[inline]
fn prefetch_node(pool: &numakv_pmem::Pool, p: PPtr) {
    #[cfg(target_arch = "x86_64")]
    {
        let base = pool.resolve(p);
        if base.is_null() {
            return;
        }
        for i in 0..PREFETCH_LINES {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    base.wrapping_add(64 * i).cast(),
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (pool, p);
}

/// A mutating operation on one key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Write<'a> {
    Put(&'a [u8]),
    Insert(&'a [u8]),
    Update(&'a [u8]),
    Delete,
}

impl<E: Index> Bytes<E> {
    /// [`crate::ByteMap::get_into`].
    pub(crate) fn read(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        check_key(key)?;
        let x = index_key(key);
        // The pin comes before the engine read: a node unlinked after we read its pointer is
        // retired after this pin and cannot be freed before we unpin.
        let _guard = epoch::pin();
        let Some(p) = self.index.get(x)? else { return Ok(false) };
        prefetch_node(&self.pool, PPtr::from_raw(p));
        // SAFETY: `p` was read from the index while pinned (Node::at's contract).
        unsafe { tree::lookup(&self.pool, PPtr::from_raw(p), key, out) }
    }

    /// Applies `w` to `key`; the `bool` is what insert / update / delete report (put: `true`).
    pub(crate) fn write(&self, key: &[u8], w: Write<'_>) -> Result<bool> {
        check_key(key)?;
        self.writable()?;
        let value = match w {
            Write::Put(v) | Write::Insert(v) | Write::Update(v) => {
                check_value(v)?;
                Some(v)
            }
            Write::Delete => None,
        };
        let x = index_key(key);
        let stripe = self.stripes.of(x);
        // ORDERING: Relaxed; a stale hint only picks the slower path.
        if stripe.trees.load(Ordering::Relaxed) {
            if let Some(result) = self.write_shared(x, key, w, value)? {
                return Ok(result);
            }
        }
        let _lock = stripe.lock.write();
        self.write_locked(x, key, w, value)
    }

    /// [`Bytes::write`] after its checks, by a caller that holds the stripe lock of `x =
    /// index_key(key)` exclusively (a single write, or a batch that holds all its keys'
    /// stripes); `value` is `w`'s value, already checked.
    pub(crate) fn write_locked(
        &self,
        x: u64,
        key: &[u8],
        w: Write<'_>,
        value: Option<&[u8]>,
    ) -> Result<bool> {
        let stripe = self.stripes.of(x);
        // Not pinned while the engine writes if the engine may wait for a grace period inside
        // its write (NBTree's SMO waits, unpinned itself, for Calloc log slots that come back
        // only after one), which a pin held here would never let end. The tree needs no pin:
        // only a writer of `x`, under this lock, changes or retires its nodes. An engine that
        // never waits gets one pin around the whole write: its own pin and the retire's are
        // then nested ones, without the locked instruction of a first pin (which, right after
        // the leaf's flushes, cost ~19% of a byte update on FAST&FAIR).
        let _pin = (!self.index.writes_wait_for_grace()).then(epoch::pin);
        // A put or update of a key whose prefix's root is a cell holding it, with a value that
        // fits: rewritten in place (one engine lookup, no engine write, no block allocated or
        // retired). Tried first when the stripe's hints say its prefixes are single pairs.
        if let Write::Put(v) | Write::Update(v) = w {
            // ORDERING: Relaxed, hints.
            if !stripe.trees.load(Ordering::Relaxed) && !stripe.crowded.load(Ordering::Relaxed) {
                if let Some(raw) = self.index.get(x)? {
                    prefetch_node(&self.pool, PPtr::from_raw(raw));
                    // SAFETY: `raw` is `x`'s root and we hold the stripe lock of `x`: no writer
                    // can unlink and retire it while we read it.
                    if let Node::Cell(c) = unsafe { Node::at(&self.pool, PPtr::from_raw(raw))? } {
                        // SAFETY: we hold the stripe lock of `x` exclusively; `c` is its root.
                        if c.key() == key && unsafe { c.overwrite(&self.pool, v) } {
                            self.stripes.cells_rewritten.fetch_add(1, Ordering::Relaxed);
                            return Ok(true);
                        }
                    }
                }
            }
        }
        // The root, read through the engine's read-modify-write: when it is a leaf that this
        // write leaves one leaf (the common case for keys with their own prefix), the new leaf
        // replaces it inside that call — one descent of the engine instead of a get and an
        // upsert. Anything else (no prefix yet, a tree, a split or an emptied leaf) goes on
        // below with the root it saw, which nobody else can change: we hold the stripe lock.
        let mut seen: Option<PPtr> = None;
        let mut done: Option<(bool, Option<PPtr>)> = None;
        let swapped = self.index.update_with(x, &mut |raw| {
            let p = PPtr::from_raw(raw);
            seen = Some(p);
            // A cell's pair, copied as a record image, when the root is a cell.
            let mut image = Vec::new();
            // SAFETY: `p` is `x`'s root, and we hold the stripe lock of `x`: no writer can unlink
            // and retire it while we read it.
            let old = match unsafe { Node::at(&self.pool, p)? } {
                Node::Leaf(r) => r,
                Node::Cell(c) => {
                    if let (Write::Put(v) | Write::Update(v), true) = (w, c.key() == key) {
                        // SAFETY: we hold the stripe lock of `x` exclusively; `c` is its root.
                        if unsafe { c.overwrite(&self.pool, v) } {
                            self.stripes.cells_rewritten.fetch_add(1, Ordering::Relaxed);
                            done = Some((true, None));
                            return Ok(None);
                        }
                    }
                    c.as_record(&mut image)?
                }
                Node::Inner(_) => return Ok(None),
            };
            // ORDERING: Relaxed, a hint.
            stripe.crowded.store(old.count() > 1, Ordering::Relaxed);
            let Some((result, new)) = self.rewrite_leaf(&old, key, w, value, true)? else {
                return Ok(None);
            };
            done = Some((result, new));
            Ok(new.map(PPtr::raw))
        });
        match (swapped, done) {
            (Ok(_), Some((result, new))) => {
                if new.is_some() {
                    if let Some(old) = seen {
                        self.retire_all(&[old]);
                    }
                }
                return Ok(result);
            }
            (Err(e), Some((_, Some(new)))) => {
                // The engine did not link the new leaf: nobody can hold it, free it now.
                // SAFETY: `new` came from this allocator and was never published.
                let _ = unsafe { self.nsm.free(new) };
                return Err(e);
            }
            (Err(e), _) => return Err(e),
            (Ok(_), None) => {}
        }
        let root = seen;
        if let Some(r) = root {
            // SAFETY: `r` is `x`'s root and we hold the stripe lock of `x` exclusively.
            let tree = matches!(unsafe { Node::at(&self.pool, r)? }, Node::Inner(_));
            // ORDERING: Relaxed, a hint.
            stripe.trees.store(tree, Ordering::Relaxed);
        }
        // The path from the root to the leaf of `key`: (inner node, child taken).
        let mut path: Vec<(Inner<'_>, usize)> = Vec::new();
        let mut leaf = None;
        let mut image = Vec::new();
        if let Some(mut p) = root {
            for _ in 0..tree::MAX_DEPTH {
                // SAFETY: `p` is reachable from `x`'s root, and we hold the stripe lock of `x`:
                // no writer can unlink and retire it while we read it.
                match unsafe { Node::at(&self.pool, p)? } {
                    Node::Leaf(r) => {
                        leaf = Some(r);
                        break;
                    }
                    Node::Cell(c) => {
                        leaf = Some(c.as_record(&mut image)?);
                        break;
                    }
                    Node::Inner(n) => {
                        let i = n.find_child(key)?;
                        p = n.child(i)?;
                        path.push((n, i));
                    }
                }
            }
            if leaf.is_none() {
                return Err(Error::corrupted(LAYER, format!("tree of {x:#x} too deep")));
            }
        }
        let present = match &leaf {
            Some(r) => r.find(key)?.is_some(),
            None => false,
        };
        let proceed = match w {
            Write::Put(_) => true,
            Write::Insert(_) => !present,
            Write::Update(_) | Write::Delete => present,
        };
        if !proceed {
            return Ok(false);
        }
        if let Some(p) = self.build_leaf(leaf.as_ref(), key, value, present, path.is_empty())? {
            // The common case: one leaf replaces one leaf, nothing above changes shape.
            // ORDERING/PERSIST: the leaf is durable (build_leaf persisted it) before the slot
            // store or the engine's upsert makes it reachable.
            let linked = match path.last() {
                Some((parent, i)) => self.publish_in_place(parent, *i, p),
                None => self.index.upsert(x, p.raw()),
            };
            if let Err(e) = linked {
                // Never published: nobody can hold it, free it now.
                // SAFETY: `p` came from this allocator and was never linked.
                let _ = unsafe { self.nsm.free(p) };
                return Err(e);
            }
            if let Some(old) = leaf {
                self.retire_all(&[old.at_ptr()]);
            }
            return Ok(true);
        }
        // The leaf splits (or empties): write the pieces, then rebuild the path above.
        self.stripes.leaf_splits.fetch_add(1, Ordering::Relaxed);
        let mut fresh = Fresh { nsm: &self.nsm, blocks: Vec::new() };
        let mut retired: Vec<PPtr> = leaf.as_ref().map(Record::at_ptr).into_iter().collect();
        let entries = tree::merged_entries(leaf.as_ref(), key, value)?;
        let mut repl = Vec::new();
        for (r, sep) in tree::leaf_pieces(&entries, &self.limits) {
            let part = &entries[r];
            let len = HEADER_BYTES + part.iter().map(|(k, v)| entry_bytes(k, v)).sum::<usize>();
            let p = fresh.alloc(len)?;
            // SAFETY: `p` was just allocated and is not published yet.
            unsafe {
                write_record(&self.pool, p, len, part.len() as u32, |emit| {
                    part.iter().for_each(|(k, v)| emit(k, v));
                    Ok(())
                })?
            };
            repl.push((sep, p.raw()));
        }
        // On an error `fresh` frees what this write allocated: nothing was published.
        self.link(x, &mut path, repl, &mut fresh, &mut retired)?;
        fresh.blocks.clear();
        self.retire_all(&retired);
        Ok(true)
    }

    /// A write that rewrites one leaf of a tree (its parent an inner node, the merged leaf one
    /// leaf): under the prefix's lock held *shared* and the lock of the leaf's slot, so writers
    /// of different leaves of one prefix run in parallel. `None` when the write is not of that
    /// kind (the prefix is absent or a single leaf, or the leaf splits or empties): the caller
    /// then takes the prefix's lock exclusively.
    ///
    /// Under the shared lock no writer changes the tree's shape (that takes the lock
    /// exclusively), so the inner nodes on the path stay linked and their slots keep their
    /// ranges; only leaf writers store into slots, each under its slot's lock, so the leaf
    /// re-read under that lock is the slot's current one and only this writer replaces it.
    fn write_shared(
        &self,
        x: u64,
        key: &[u8],
        w: Write<'_>,
        value: Option<&[u8]>,
    ) -> Result<Option<bool>> {
        let stripe = self.stripes.of(x);
        let _shared = stripe.lock.read();
        // No engine write below: the pin can cover the whole write (it keeps nothing from
        // ending; the retire's pin is then nested).
        let _pin = epoch::pin();
        let Some(root) = self.index.get(x)? else { return Ok(None) };
        let mut p = PPtr::from_raw(root);
        let mut parent = None;
        for _ in 0..tree::MAX_DEPTH {
            // SAFETY: `p` is reachable from `x`'s root and we are pinned (Node::at's contract).
            match unsafe { Node::at(&self.pool, p)? } {
                Node::Leaf(_) | Node::Cell(_) => break,
                Node::Inner(n) => {
                    let i = n.find_child(key)?;
                    p = n.child(i)?;
                    parent = Some((n, i));
                }
            }
        }
        let Some((n, i)) = parent else {
            // ORDERING: Relaxed, a hint.
            stripe.trees.store(false, Ordering::Relaxed);
            return Ok(None);
        };
        let _slot = self.stripes.slot(n.at_ptr(), i).lock();
        // Again under the slot's lock: another writer of this leaf may have replaced it.
        let leaf_at = n.child(i)?;
        // SAFETY: `leaf_at` is linked (read from a linked node's slot under its lock) and we
        // are pinned; only we can retire it now.
        let Node::Leaf(leaf) = (unsafe { Node::at(&self.pool, leaf_at)? }) else {
            return Err(Error::corrupted(
                LAYER,
                format!("slot {i} of {} left the leaf level", n.at_ptr()),
            ));
        };
        match self.rewrite_leaf(&leaf, key, w, value, false)? {
            None => Ok(None),
            Some((result, None)) => Ok(Some(result)),
            Some((result, Some(new))) => {
                // The new leaf is built, not yet published; this writer holds the prefix's
                // lock shared and the leaf's slot lock.
                numakv_pmem::pause_point!("bytes.write.leaf_built");
                if let Err(e) = self.publish_in_place(&n, i, new) {
                    // SAFETY: `new` came from this allocator and was never published.
                    let _ = unsafe { self.nsm.free(new) };
                    return Err(e);
                }
                self.retire_all(&[leaf_at]);
                Ok(Some(result))
            }
        }
    }

    /// The common case of a write whose leaf is the prefix's root, or `None` when it is not
    /// common (the merged leaf must split, or empties): `Some((false, None))` when the write
    /// changes nothing (insert of a present key, update or delete of an absent one), else
    /// `Some((true, Some(new)))` with the merged leaf written and persisted in a fresh block,
    /// not yet published. A one-pair leaf that is the prefix's `root` is written as a cell when
    /// its value is small enough.
    fn rewrite_leaf(
        &self,
        leaf: &Record<'_>,
        key: &[u8],
        w: Write<'_>,
        value: Option<&[u8]>,
        root: bool,
    ) -> Result<Option<(bool, Option<PPtr>)>> {
        let present = leaf.find(key)?.is_some();
        let proceed = match w {
            Write::Put(_) => true,
            Write::Insert(_) => !present,
            Write::Update(_) | Write::Delete => present,
        };
        if !proceed {
            return Ok(Some((false, None)));
        }
        Ok(self.build_leaf(Some(leaf), key, value, present, root)?.map(|p| (true, Some(p))))
    }

    /// The leaf that replaces `leaf` (`None`: the prefix is new) after the write of `key`
    /// (`value`; `None` deletes; `present`: whether `leaf` holds `key`), in a fresh block,
    /// persisted, not published — or `None` when the merged entries are empty or must split.
    /// A prefix's `root` that is the written pair alone becomes a cell (its value permitting),
    /// without merging anything; otherwise the merged entries are built in DRAM in one pass and
    /// written with one copy. On an error nothing stays allocated.
    fn build_leaf(
        &self,
        leaf: Option<&Record<'_>>,
        key: &[u8],
        value: Option<&[u8]>,
        present: bool,
        root: bool,
    ) -> Result<Option<PPtr>> {
        let alone = leaf.map_or(true, |r| r.count() == 1 && present);
        let (p, built) = match value.filter(|v| root && alone && self.limits.cell_for(v)) {
            Some(v) => {
                let p = self.nsm.alloc(cell_bytes(key.len(), cell_words(v.len())))?;
                // SAFETY: `p` was just allocated and is not published yet.
                (p, unsafe { write_cell(&self.pool, p, key, v) })
            }
            None => {
                let extra = value.map_or(0, |v| entry_bytes(key, v));
                let mut image =
                    RecordImage::with_capacity(leaf.map_or(HEADER_BYTES, Record::len) + extra);
                tree::merged(leaf, key, value, &mut |k, v| image.push(k, v))?;
                let (count, len) = (image.count(), image.len());
                if count == 0 || (count > 1 && !self.limits.leaf_fits(count, len)) {
                    return Ok(None);
                }
                let p = self.nsm.alloc(len)?;
                // SAFETY: `p` was just allocated (`len` bytes) and is not published yet.
                (p, unsafe { image.write_to(&self.pool, p) })
            }
        };
        if let Err(e) = built {
            // SAFETY: `p` came from this allocator and was never published.
            let _ = unsafe { self.nsm.free(p) };
            return Err(e);
        }
        Ok(Some(p))
    }

    /// Where the leaf that holds `key`'s place lives (`None` when no key has its prefix): for
    /// tests and diagnostics (which keys share a leaf).
    pub fn leaf_of(&self, key: &[u8]) -> Result<Option<u64>> {
        check_key(key)?;
        let _guard = epoch::pin();
        let Some(root) = self.index.get(index_key(key))? else { return Ok(None) };
        let mut p = PPtr::from_raw(root);
        for _ in 0..tree::MAX_DEPTH {
            // SAFETY: `p` was reached from the index while pinned (Node::at's contract).
            match unsafe { Node::at(&self.pool, p)? } {
                Node::Leaf(_) | Node::Cell(_) => return Ok(Some(p.raw())),
                Node::Inner(n) => p = n.child(n.find_child(key)?)?,
            }
        }
        Err(Error::corrupted(LAYER, format!("tree of {key:x?} too deep")))
    }

    /// Height of the tree of `key`'s prefix: `None` when no key has that prefix, 0 for a single
    /// leaf, 1 for an inner root over leaves, and so on.
    pub fn prefix_height(&self, key: &[u8]) -> Result<Option<usize>> {
        check_key(key)?;
        let _guard = epoch::pin();
        let Some(root) = self.index.get(index_key(key))? else { return Ok(None) };
        let mut p = PPtr::from_raw(root);
        for height in 0..tree::MAX_DEPTH {
            // SAFETY: `p` was reached from the index while pinned (Node::at's contract).
            match unsafe { Node::at(&self.pool, p)? } {
                Node::Leaf(_) | Node::Cell(_) => return Ok(Some(height)),
                Node::Inner(n) => p = n.child(0)?,
            }
        }
        Err(Error::corrupted(LAYER, format!("tree of {key:x?} too deep")))
    }

    /// Replaces child `i` of `parent` by `child` with one persisted 8-byte store: the
    /// publication (and linearization point) of a write that changes no node's shape.
    fn publish_in_place(&self, parent: &Inner<'_>, i: usize, child: PPtr) -> Result<()> {
        let slot = parent.slot(i)?;
        // ORDERING: Release publishes the new child (written and persisted before) to readers,
        // which load the slot with Acquire.
        slot.store(child.raw(), Ordering::Release);
        // PERSIST: the slot now names the new child; the write is durable here. An aligned
        // 8-byte store: a crash leaves the old or the new child, never a mix.
        self.pool.persist_obj(slot);
        Ok(())
    }

    /// Retires nodes this writer unlinked: each is freed once every reader pinned now unpins.
    fn retire_all(&self, old: &[PPtr]) {
        // Pinned after the unlink: every reader that can still hold an old node pinned before
        // it, so the frees wait for them.
        let guard = epoch::pin();
        for &p in old {
            // SAFETY: `p` is unlinked (nothing reachable points at it any more), came from this
            // allocator, and only this writer (under the stripe lock) retires it.
            unsafe { retire(&self.nsm, &guard, p) };
        }
    }

    /// Links `repl` — the nodes (with their separators; the first one's is ignored) that replace
    /// the last node of `path`'s children, or the root when `path` is empty — and rebuilds the
    /// path above as far as node shapes change. The single store that publishes the write is an
    /// in-place child slot or the engine's `upsert`/`remove` of `x`. Replaced inner nodes are
    /// appended to `retired`.
    fn link(
        &self,
        x: u64,
        path: &mut Vec<(Inner<'_>, usize)>,
        mut repl: Vec<(Vec<u8>, u64)>,
        fresh: &mut Fresh<'_>,
        retired: &mut Vec<PPtr>,
    ) -> Result<()> {
        while let Some((parent, i)) = path.pop() {
            if repl.len() == 1 {
                return self.publish_in_place(&parent, i, PPtr::from_raw(repl[0].1));
            }
            // The parent changes shape: a copy with child `i` replaced by `repl`.
            let removed = repl.is_empty();
            let mut kids: Vec<(Vec<u8>, u64)> = Vec::with_capacity(parent.count() + repl.len());
            let mut repl_iter = Some(std::mem::take(&mut repl));
            for j in 0..parent.count() {
                let sep = parent.sep(j)?.to_vec();
                if j == i {
                    for (k, (s, p)) in repl_iter.take().into_iter().flatten().enumerate() {
                        // The first replacement inherits the replaced child's lower bound.
                        kids.push((if k == 0 { sep.clone() } else { s }, p));
                    }
                } else {
                    kids.push((sep, parent.child(j)?.raw()));
                }
            }
            if removed && !kids.is_empty() {
                // Child `i` is gone and a neighbour's range grows over its range: the left
                // neighbour's upwards, or (for child 0) the right one's downwards. A linked node's
                // range never changes — readers still walking the old parent rely on the ranges
                // it gives its children — so the neighbour is replaced by a copy along the edge
                // that grows, down to its leaf.
                let (n, rightmost) = if i > 0 { (i - 1, true) } else { (0, false) };
                let copy = self.copy_edge(PPtr::from_raw(kids[n].1), rightmost, fresh, retired)?;
                kids[n].1 = copy.raw();
            }
            retired.push(parent.at_ptr());
            repl = if kids.len() == 1 && path.is_empty() {
                // A root left with one child: the child becomes the root.
                kids
            } else if kids.is_empty() {
                kids
            } else {
                self.inner_nodes(kids, fresh)?
            };
        }
        // The root changes: a new root over the pieces, or the one piece, or none.
        while repl.len() > 1 {
            repl = self.inner_nodes(repl, fresh)?;
        }
        // ORDERING/PERSIST: every node of `repl` is durable (written and persisted above) before
        // the engine's write makes it reachable; the engine's write is durable when it returns.
        match repl.first() {
            Some(&(_, root)) => self.index.upsert(x, root),
            None => {
                if self.index.remove(x)? {
                    Ok(())
                } else {
                    Err(Error::corrupted(
                        LAYER,
                        format!("index key {x:#x} vanished under its stripe lock"),
                    ))
                }
            }
        }
    }

    /// A copy of the subtree at `node` whose nodes along its rightmost (or leftmost) edge are
    /// fresh, down to the leaf; the rest is shared. The replaced edge goes to `retired`.
    fn copy_edge(
        &self,
        node: PPtr,
        rightmost: bool,
        fresh: &mut Fresh<'_>,
        retired: &mut Vec<PPtr>,
    ) -> Result<PPtr> {
        // SAFETY: `node` is linked under `x`, whose stripe lock we hold (Node::at's contract).
        let copy = match unsafe { Node::at(&self.pool, node)? } {
            Node::Cell(c) => {
                return Err(Error::corrupted(
                    LAYER,
                    format!("cell {} below an inner node (cells are roots only)", c.at_ptr()),
                ))
            }
            Node::Leaf(r) => {
                let len = r.len();
                let p = fresh.alloc(len)?;
                // SAFETY: `p` was just allocated and is not published yet.
                unsafe {
                    write_record(&self.pool, p, len, r.count(), |emit| {
                        for e in r.entries() {
                            let (k, v) = e?;
                            emit(k, v);
                        }
                        Ok(())
                    })?
                };
                p
            }
            Node::Inner(n) => {
                let e = if rightmost { n.count() - 1 } else { 0 };
                let mut kids = Vec::with_capacity(n.count());
                for j in 0..n.count() {
                    kids.push((n.sep(j)?.to_vec(), n.child(j)?.raw()));
                }
                kids[e].1 =
                    self.copy_edge(PPtr::from_raw(kids[e].1), rightmost, fresh, retired)?.raw();
                let p = fresh.alloc(inner_bytes(&kids))?;
                // SAFETY: `p` was just allocated and is not published yet.
                unsafe { write_inner(&self.pool, p, &kids)? };
                p
            }
        };
        retired.push(node);
        Ok(copy)
    }

    /// Writes inner nodes over `children` (split as the limits require) and returns them with
    /// their separators.
    fn inner_nodes(
        &self,
        children: Vec<(Vec<u8>, u64)>,
        fresh: &mut Fresh<'_>,
    ) -> Result<Vec<(Vec<u8>, u64)>> {
        let mut out = Vec::new();
        for r in tree::inner_pieces(&children, &self.limits) {
            let part = &children[r];
            let p = fresh.alloc(inner_bytes(part))?;
            // SAFETY: `p` was just allocated and is not published yet.
            unsafe { write_inner(&self.pool, p, part)? };
            out.push((part[0].0.clone(), p.raw()));
        }
        Ok(out)
    }
}

/// The blocks one write allocated, freed if the write fails before publishing them.
struct Fresh<'a> {
    nsm: &'a Nsm,
    blocks: Vec<PPtr>,
}

impl Fresh<'_> {
    fn alloc(&mut self, len: usize) -> Result<PPtr> {
        let p = self.nsm.alloc(len)?;
        self.blocks.push(p);
        Ok(p)
    }

    fn free_all(&mut self) {
        for p in self.blocks.drain(..) {
            // SAFETY: `p` came from this allocator and was never linked: nobody can hold it.
            let _ = unsafe { self.nsm.free(p) };
        }
    }
}

impl Drop for Fresh<'_> {
    fn drop(&mut self) {
        // An early `?` return between allocation and the link leaves blocks here: unpublished.
        self.free_all();
    }
}
