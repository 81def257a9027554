//! Atomic write batches: several puts and deletes that take effect all or nothing, across a
//! crash too (docs/design.md, "Byte-string layer", Write batches).
//!
//! A batch ([`WriteBatch`]) is applied by [`ByteMap::write_batch`](crate::ByteMap::write_batch):
//!
//! 1. **Validate** every key and value: a bad argument fails the batch before anything is
//!    written, before any lock is taken.
//! 2. **Lock**: the batch mutex (one batch at a time: there is one log slot), then the stripe
//!    lock of every key's prefix exclusively, in ascending stripe order (single writes hold one
//!    stripe at a time, so no cycle). No other writer can touch the batch's keys until it ends.
//! 3. **Read** every key's current value (the undo image) and check the preconditions
//!    ([`WriteBatch::require_absent`]): a failed one ends the batch with nothing written.
//! 4. **Log**: one record with every key's new state (redo) and old state (undo), written to a
//!    fresh block of the layer's allocator and persisted; then its pointer is stored into root
//!    slot [`SLOT_BATCH`] and persisted — the **commit point**. A crash before it leaves an
//!    unlinked block (recovery's garbage collection frees it) and no change.
//! 5. **Apply** each key's new state with the ordinary write path (each write atomic and
//!    durable on its own). If one fails (the store is full), the log's state word turns to
//!    *rolling back* (persisted) and the keys written so far get their old state back.
//! 6. **End**: the slot is cleared and persisted, then the block freed.
//!
//! **Recovery** ([`recover`], run by [`Bytes::open`](crate::Bytes::open) before the store is
//! handed out, so before any other write): a log in the slot is finished — rolled forward
//! (every key set to its new state), or, if its state says *rolling back* or the roll forward
//! fails, rolled back (every key set to its old state) — then the slot is cleared. Both
//! directions set whole states and skip keys already there, so a crash during recovery just
//! runs it again. Whichever program opens the store next (the server, the CLI, the C ABI)
//! completes or rolls back the batch; a write made after that open is never overwritten.
//!
//! **Readers** take no lock: a reader running while a batch applies can see some of its keys
//! new and others old (as with the same writes made one by one). A caller that needs
//! isolation from its own readers (the server's EXEC) excludes them itself.
//!
//! **Log record** (little-endian, one NSM block): `magic: u32 = "NKW1"`, `count: u32`,
//! `state: u64` (1 rolling forward, 2 rolling back), `len: u64` (record bytes), then `count`
//! entries: `new: u8` (1 put, 2 delete), `old: u8` (1 present, 0 absent), `pad: u16`,
//! `key_len: u32`, `value_len: u32`, `old_len: u32`, then the key, the new value and the old
//! value.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use numakv_index::{Error, Index, Result};
use numakv_pmem::alloc::{epoch, PmAllocator};
use numakv_pmem::{PPtr, PoolError};

use crate::layout::{check_key, check_value, index_key, LAYER};
use crate::ops::{Stripes, Write};
use crate::Bytes;

/// Root slot (node 0) naming the log of the batch in progress, 0 when none is.
pub const SLOT_BATCH: usize = 17;
/// Magic of a batch log record ("NKW1" little-endian).
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"NKW1");
/// Log state: the batch is committed; recovery rolls it forward.
pub const STATE_FORWARD: u64 = 1;
/// Log state: the batch failed part-way; recovery rolls it back.
pub const STATE_BACK: u64 = 2;
/// Bytes of the log record's header.
pub const LOG_HEADER_BYTES: usize = 24;
/// Bytes of a log entry's header.
pub const LOG_ENTRY_BYTES: usize = 16;
/// Offset of the state word in the log record.
const STATE_OFF: u64 = 8;
/// Retries of one restore while rolling back a batch that ran out of space (each after a grace
/// period lets the blocks the batch retired go back to the allocator).
const ROLLBACK_RETRIES: usize = 200;

/// Puts and deletes of several keys, applied all or nothing by
/// [`ByteMap::write_batch`](crate::ByteMap::write_batch) (see the [module docs](self)).
///
/// Operations on one key: the last one wins. Keys and values are checked when the batch is
/// applied (1 B ..= [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) keys, values up to
/// [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN)); one bad argument fails the whole batch.
///
/// ```
/// use numakv_bytes::{BatchOutcome, ByteMap, Bytes, WriteBatch};
/// use numakv_fastfair::FastFair;
/// use numakv_pmem::{Pool, PoolConfig};
///
/// let pool = Pool::volatile(PoolConfig::new(numakv_bytes::engine_id::<FastFair>(), 16 << 20))?;
/// let b = Bytes::<FastFair>::create(pool, &Default::default())?;
/// b.put(b"a", b"old")?;
/// let mut batch = WriteBatch::new();
/// batch.put(b"a", b"1").put(b"b", b"2").delete(b"c");
/// let done = b.write_batch(&batch)?;
/// assert_eq!(done, BatchOutcome { applied: true, existed: vec![true, false, false] });
/// assert_eq!(b.get(b"b")?.as_deref(), Some(&b"2"[..]));
///
/// // One bad key: nothing is written.
/// let mut bad = WriteBatch::new();
/// bad.put(b"d", b"4").put(&[b'k'; 1025], b"x");
/// assert!(b.write_batch(&bad).is_err());
/// assert_eq!(b.get(b"d")?, None);
///
/// // A precondition (MSETNX): nothing is written when a key exists.
/// let mut nx = WriteBatch::new();
/// nx.put(b"a", b"9").put(b"e", b"5").require_absent(b"a").require_absent(b"e");
/// assert!(!b.write_batch(&nx)?.applied);
/// assert_eq!(b.get(b"e")?, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch {
    /// `(key, Some(value))` puts, `(key, None)` deletes, in the caller's order.
    ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Keys that must be absent for the batch to apply.
    absent: Vec<Vec<u8>>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Adds a put of `key → value` (insert or overwrite).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> &mut Self {
        self.ops.push((key.to_vec(), Some(value.to_vec())));
        self
    }

    /// Adds a delete of `key` (absent: nothing to do, not an error).
    pub fn delete(&mut self, key: &[u8]) -> &mut Self {
        self.ops.push((key.to_vec(), None));
        self
    }

    /// Adds a precondition: the batch applies only if `key` is absent when it runs (checked
    /// under the batch's locks); otherwise nothing is written and
    /// [`BatchOutcome::applied`] is `false`.
    pub fn require_absent(&mut self, key: &[u8]) -> &mut Self {
        self.absent.push(key.to_vec());
        self
    }

    /// Puts and deletes added so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no put or delete was added.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Forgets every operation and precondition.
    pub fn clear(&mut self) {
        self.ops.clear();
        self.absent.clear();
    }

    /// The operations in order: `(key, Some(value))` for a put, `(key, None)` for a delete.
    pub fn ops(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.ops.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Checks every key and value (what applying does first): the error the batch would fail
    /// with, before anything is written.
    pub fn validate(&self) -> Result<()> {
        for (k, v) in &self.ops {
            check_key(k)?;
            if let Some(v) = v {
                check_value(v)?;
            }
        }
        self.absent.iter().try_for_each(|k| check_key(k))
    }
}

/// What a batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// `false` when a precondition failed: nothing was written.
    pub applied: bool,
    /// Per operation, in the batch's order: whether its key was present before the batch
    /// (a delete's "removed something"; an operation repeated on one key repeats the answer).
    pub existed: Vec<bool>,
}

/// One key of a batch: its new state (redo) and old state (undo).
struct Entry<'a> {
    key: &'a [u8],
    new: Option<&'a [u8]>,
    old: Option<Vec<u8>>,
}

/// A parsed log record, read back from PM.
struct LoggedEntry {
    key: Vec<u8>,
    new: Option<Vec<u8>>,
    old: Option<Vec<u8>>,
}

fn put_u32(buf: &mut Vec<u8>, v: usize) {
    buf.extend_from_slice(&(v as u32).to_le_bytes());
}

/// The log record of `entries` in state `STATE_FORWARD`.
fn log_image(entries: &[Entry<'_>]) -> Vec<u8> {
    let len = LOG_HEADER_BYTES
        + entries
            .iter()
            .map(|e| {
                LOG_ENTRY_BYTES
                    + e.key.len()
                    + e.new.map_or(0, <[u8]>::len)
                    + e.old.as_ref().map_or(0, Vec::len)
            })
            .sum::<usize>();
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&BATCH_MAGIC.to_le_bytes());
    put_u32(&mut buf, entries.len());
    buf.extend_from_slice(&STATE_FORWARD.to_le_bytes());
    buf.extend_from_slice(&(len as u64).to_le_bytes());
    for e in entries {
        buf.push(if e.new.is_some() { 1 } else { 2 });
        buf.push(u8::from(e.old.is_some()));
        buf.extend_from_slice(&[0, 0]);
        put_u32(&mut buf, e.key.len());
        put_u32(&mut buf, e.new.map_or(0, <[u8]>::len));
        put_u32(&mut buf, e.old.as_ref().map_or(0, Vec::len));
        buf.extend_from_slice(e.key);
        buf.extend_from_slice(e.new.unwrap_or_default());
        buf.extend_from_slice(e.old.as_deref().unwrap_or_default());
    }
    debug_assert_eq!(buf.len(), len);
    buf
}

fn log_corrupted(at: PPtr, what: impl std::fmt::Display) -> Error {
    Error::corrupted(LAYER, format!("batch log at {at}: {what}"))
}

/// Reads and checks the log record at `at`: its state and entries.
fn read_log(pool: &numakv_pmem::Pool, at: PPtr) -> Result<(u64, Vec<LoggedEntry>)> {
    let head = pool.bytes(at, LOG_HEADER_BYTES)?;
    let mut h = [0u8; LOG_HEADER_BYTES];
    // SAFETY: recovery runs alone: nothing writes the log while we read it.
    if !unsafe { head.read(0, &mut h) } {
        return Err(log_corrupted(at, "header out of range"));
    }
    let word = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or_default());
    let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let count = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
    let (state, len) = (word(8), word(16));
    if magic != BATCH_MAGIC {
        return Err(log_corrupted(at, format!("magic {magic:#x}")));
    }
    if state != STATE_FORWARD && state != STATE_BACK {
        return Err(log_corrupted(at, format!("state {state}")));
    }
    let len = usize::try_from(len).map_err(|_| log_corrupted(at, "length"))?;
    if len < LOG_HEADER_BYTES || count > len / LOG_ENTRY_BYTES {
        return Err(log_corrupted(at, format!("{count} entries in {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    // SAFETY: as above.
    if !unsafe { pool.bytes(at, len)?.read(0, &mut buf) } {
        return Err(log_corrupted(at, "record out of range"));
    }
    let mut off = LOG_HEADER_BYTES;
    let mut take = |n: usize| -> Result<&[u8]> {
        let s = buf
            .get(off..off + n)
            .ok_or_else(|| log_corrupted(at, format!("entry past the end ({off} + {n})")))?;
        off += n;
        Ok(s)
    };
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let eh = take(LOG_ENTRY_BYTES)?.to_vec();
        let n = |o: usize| u32::from_le_bytes([eh[o], eh[o + 1], eh[o + 2], eh[o + 3]]) as usize;
        let (kind, had, klen, vlen, olen) = (eh[0], eh[1], n(4), n(8), n(12));
        if !(kind == 1 || kind == 2) || had > 1 {
            return Err(log_corrupted(at, format!("entry {i}: kind {kind}, old {had}")));
        }
        let key = take(klen)?.to_vec();
        let value = take(vlen)?.to_vec();
        let old = take(olen)?.to_vec();
        check_key(&key).map_err(|e| log_corrupted(at, format!("entry {i}: {e}")))?;
        entries.push(LoggedEntry {
            key,
            new: (kind == 1).then_some(value),
            old: (had == 1).then_some(old),
        });
    }
    Ok((state, entries))
}

impl<E: Index> Bytes<E> {
    /// [`crate::ByteMap::write_batch`].
    pub(crate) fn apply_batch(&self, batch: &WriteBatch) -> Result<BatchOutcome> {
        batch.validate()?;
        self.writable()?;
        if batch.ops.is_empty() && batch.absent.is_empty() {
            return Ok(BatchOutcome { applied: true, existed: Vec::new() });
        }
        // The last operation of each key, in key order.
        let mut last: BTreeMap<&[u8], Option<&[u8]>> = BTreeMap::new();
        for (k, v) in &batch.ops {
            last.insert(k, v.as_deref());
        }
        let _one = self.batch_lock.lock();
        let mut stripes: Vec<usize> = last
            .keys()
            .copied()
            .chain(batch.absent.iter().map(Vec::as_slice))
            .map(|k| Stripes::index_of(index_key(k)))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        // Ascending stripe order: two batches cannot deadlock (and they are serialised anyway),
        // and a single write holds one stripe.
        let _locks: Vec<_> = stripes.iter().map(|&i| self.stripes.lock_exclusive(i)).collect();
        // Re-checked under the locks: a batch that failed to roll back meanwhile stops us.
        self.writable()?;

        let mut entries = Vec::with_capacity(last.len());
        for (&key, &new) in &last {
            entries.push(Entry { key, new, old: ByteMapExt::get_value(self, key)? });
        }
        let had: BTreeMap<&[u8], bool> = entries.iter().map(|e| (e.key, e.old.is_some())).collect();
        let present = |k: &[u8]| -> Result<bool> {
            match had.get(k) {
                Some(&h) => Ok(h),
                None => Ok(ByteMapExt::get_value(self, k)?.is_some()),
            }
        };
        let existed = batch.ops.iter().map(|(k, _)| present(k)).collect::<Result<Vec<bool>>>()?;
        for k in &batch.absent {
            if present(k)? {
                return Ok(BatchOutcome { applied: false, existed });
            }
        }
        if entries.iter().all(|e| e.new.is_none() && e.old.is_none()) {
            // Only deletes of absent keys: nothing to write.
            return Ok(BatchOutcome { applied: true, existed });
        }
        if entries.len() == 1 {
            // One key: its write is atomic on its own, no log needed.
            let e = &entries[0];
            self.write_locked(index_key(e.key), e.key, op_of(e.new), e.new)?;
            return Ok(BatchOutcome { applied: true, existed });
        }

        let image = log_image(&entries);
        let log = self.nsm.alloc(image.len())?;
        let dst = match self.pool.bytes(log, image.len()) {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: `log` came from this allocator and was never linked.
                let _ = unsafe { self.nsm.free(log) };
                return Err(e.into());
            }
        };
        // SAFETY: `log` was just allocated and is not linked anywhere: ours alone.
        if !unsafe { dst.write(0, &image) } {
            // SAFETY: as above.
            let _ = unsafe { self.nsm.free(log) };
            return Err(log_corrupted(log, "log block too small"));
        }
        // PERSIST: the whole log record is durable before the slot names it (commit below).
        self.pool.persist(dst.as_ptr(), image.len());
        let slot = self.pool.root(SLOT_BATCH)?;
        // ORDERING: Release, as any publication of a durable structure (recovery reads the slot
        // single-threaded; nothing else reads it).
        slot.store(log.raw(), Ordering::Release);
        // PERSIST: the commit point — from here a crash rolls the batch forward at the next open.
        self.pool.persist_obj(slot);
        numakv_pmem::pause_point!("bytes.batch.committed");

        let mut failed = None;
        for (i, e) in entries.iter().enumerate() {
            let written = if numakv_pmem::fail_point!("bytes.batch.apply") {
                // Tests: this write runs out of space.
                Err(PoolError::OutOfSpace { node: 0, requested: e.key.len() as u64 }.into())
            } else {
                self.write_locked(index_key(e.key), e.key, op_of(e.new), e.new)
            };
            if let Err(err) = written {
                failed = Some((i, err));
                break;
            }
            numakv_pmem::pause_point!("bytes.batch.applied");
        }
        if let Some((i, err)) = failed {
            // Roll back what was written: the state word first, so a crash during the rollback
            // finishes it (not the batch) at the next open.
            let state = self.pool.get::<numakv_pmem::PmU64>(
                log.add(STATE_OFF).ok_or_else(|| log_corrupted(log, "state word"))?,
            )?;
            // ORDERING: Relaxed; only recovery reads it, after this process is gone.
            state.store(STATE_BACK, Ordering::Relaxed);
            // PERSIST: a crash from here rolls the batch back, not forward.
            self.pool.persist_obj(state);
            for e in entries[..=i].iter().rev() {
                if let Err(e2) = self.restore(e.key, e.old.as_deref()) {
                    self.poison(format!(
                        "a batch failed ({err}) and its rollback failed too ({e2}): \
                         reopen the store to roll it back"
                    ));
                    return Err(err);
                }
            }
            self.end_batch(log)?;
            return Err(err);
        }
        self.end_batch(log)?;
        Ok(BatchOutcome { applied: true, existed })
    }

    /// Sets `key` to `old` (`None`: absent) during a rollback, retrying after grace periods
    /// while the store is out of space (the batch's own retired blocks come back after one).
    fn restore(&self, key: &[u8], old: Option<&[u8]>) -> Result<()> {
        if ByteMapExt::get_value(self, key)?.as_deref() == old {
            return Ok(()); // the failed write itself, or one that changed nothing
        }
        let x = index_key(key);
        let mut tries = 0;
        loop {
            match self.write_locked(x, key, op_of(old), old) {
                Err(e) if e.is_out_of_space() && tries < ROLLBACK_RETRIES => {
                    tries += 1;
                    // A pin and flush lets this thread advance the epoch and run expired frees.
                    epoch::pin().flush();
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                r => return r.map(|_| ()),
            }
        }
    }

    /// Clears the log slot (durably), then frees the log block.
    fn end_batch(&self, log: PPtr) -> Result<()> {
        let slot = self.pool.root(SLOT_BATCH)?;
        // ORDERING: Release, as the store that set it.
        slot.store(0, Ordering::Release);
        // PERSIST: the batch is over; nothing is rolled forward or back at the next open.
        self.pool.persist_obj(slot);
        // SAFETY: the slot, the only link to `log`, is cleared; only batches (serialised by the
        // batch mutex, which our caller holds) use it.
        unsafe { self.nsm.free(log) }?;
        Ok(())
    }
}

fn op_of(v: Option<&[u8]>) -> Write<'_> {
    match v {
        Some(v) => Write::Put(v),
        None => Write::Delete,
    }
}

/// The value of a key through the layer's lock-free read.
trait ByteMapExt {
    fn get_value(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
}

impl<E: Index> ByteMapExt for Bytes<E> {
    fn get_value(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut v = Vec::new();
        Ok(self.read(key, &mut v)?.then_some(v))
    }
}

/// The log block named by [`SLOT_BATCH`], if any, for recovery's garbage collection to keep.
pub(crate) fn pending_log(pool: &numakv_pmem::Pool) -> Result<Option<PPtr>> {
    // ORDERING: Acquire, as any reader of a root slot.
    let raw = pool.root(SLOT_BATCH)?.load(Ordering::Acquire);
    Ok((raw != 0).then(|| PPtr::from_raw(raw)))
}

/// What recovery did with a batch left in the log: `(rolled forward, rolled back)`.
pub(crate) fn recover<E: Index>(b: &Bytes<E>, log: PPtr) -> Result<(u64, u64)> {
    let (state, entries) = read_log(&b.pool, log)?;
    let set = |forward: bool| -> Result<()> {
        for e in &entries {
            let want = if forward { e.new.as_deref() } else { e.old.as_deref() };
            // Already in that state (applied before the crash): nothing to write.
            if ByteMapExt::get_value(b, &e.key)?.as_deref() == want {
                continue;
            }
            let x = index_key(&e.key);
            let _lock = b.stripes.lock_exclusive(Stripes::index_of(x));
            b.write_locked(x, &e.key, op_of(want), want)?;
        }
        Ok(())
    };
    let mut outcome = (0, 0);
    if state == STATE_FORWARD {
        match set(true) {
            Ok(()) => outcome.0 = 1,
            Err(e) if e.is_out_of_space() => {
                let word = b.pool.get::<numakv_pmem::PmU64>(
                    log.add(STATE_OFF).ok_or_else(|| log_corrupted(log, "state word"))?,
                )?;
                // ORDERING: Relaxed; single-threaded recovery.
                word.store(STATE_BACK, Ordering::Relaxed);
                // PERSIST: a crash from here rolls the batch back.
                b.pool.persist_obj(word);
            }
            Err(e) => return Err(e),
        }
    }
    if outcome.0 == 0 {
        set(false)?;
        outcome.1 = 1;
    }
    let _one = b.batch_lock.lock();
    b.end_batch(log)?;
    Ok(outcome)
}
