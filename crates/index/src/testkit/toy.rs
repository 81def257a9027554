//! A deliberately simple engine for testing the test kit itself: a persistent slot array with a
//! DRAM `BTreeMap` index, all operations under one mutex. It is correct unless a [`Bug`] is
//! planted; each bug is one the kit must catch (crates/index/tests/testkit_selftest.rs).
//!
//! # Layout
//! One page-heap extent (owner [`OWNER_ENGINE`]) whose pointer is in root slot 0:
//! - line 0: `magic` (u64), `slots` (u64);
//! - from byte 64: `slots` × 32-byte [`Slot`]s `{key, value, seq, valid}`.
//!
//! A write goes out of place: the new slot (with the next sequence number) is persisted, then
//! marked valid and persisted, then the old slot is invalidated. Recovery keeps, per key, the
//! valid slot with the highest sequence number and invalidates the others.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use numakv_pmem::heap::OWNER_ENGINE;
use numakv_pmem::{PPtr, PmType, PmU64, Pool, PoolError};
use parking_lot::Mutex;

use crate::api::{check_key, CheckReport, Engine, EngineStats, Index, RecoveryReport};
use crate::error::{Error, Result};

const MAGIC: u64 = u64::from_le_bytes(*b"TOYSLOTS");
const SLOTS_OFF: u64 = 64;

/// A bug to plant in the toy engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bug {
    /// No bug: the toy is a correct engine.
    #[default]
    None,
    /// Inserts are never flushed: acknowledged inserts vanish in an ADR power failure.
    MissingFlush,
    /// Removes only update DRAM: the key comes back after a restart.
    ResurrectedDelete,
    /// Scans of two or more pairs return the first key twice.
    DuplicateScanKey,
    /// Every third insert is kept in DRAM only: acknowledged, then lost on restart.
    LostAckedInsert,
}

/// Options of the toy engine.
#[derive(Clone, Copy, Debug)]
pub struct ToyOptions {
    /// The planted bug.
    pub bug: Bug,
    /// Slots in the array (fixed at create; exhausting them is `OutOfSpace`).
    pub slots: u64,
}

impl Default for ToyOptions {
    fn default() -> Self {
        ToyOptions { bug: Bug::None, slots: 1 << 15 }
    }
}

/// One persistent slot. `valid` is 1 for a live slot, 0 otherwise.
#[repr(C)]
#[derive(Debug)]
struct Slot {
    key: PmU64,
    value: PmU64,
    seq: PmU64,
    valid: PmU64,
}

// SAFETY: four PM words; every bit pattern is a valid (if meaningless) slot.
unsafe impl PmType for Slot {}

const _: () = assert!(std::mem::size_of::<Slot>() == 32);

#[derive(Debug)]
struct State {
    /// key → (slot, value); slot `None` for the DRAM-only entries of `Bug::LostAckedInsert`.
    map: BTreeMap<u64, (Option<u64>, u64)>,
    free: Vec<u64>,
    seq: u64,
    inserts: u64,
}

/// The toy engine.
#[derive(Debug)]
pub struct Toy {
    pool: Arc<Pool>,
    base: PPtr,
    opts: ToyOptions,
    state: Mutex<State>,
}

impl Toy {
    fn slot(&self, i: u64) -> Result<&Slot> {
        let p = self
            .base
            .add(SLOTS_OFF + 32 * i)
            .ok_or_else(|| Error::corrupted("toy", "slot pointer overflow"))?;
        Ok(self.pool.get::<Slot>(p)?)
    }

    fn persist(&self, s: &Slot) {
        if self.opts.bug != Bug::MissingFlush {
            self.pool.persist_obj(s);
        }
    }

    /// Writes `key → value` into a fresh slot (persisted, then marked valid and persisted) and
    /// invalidates `old` afterwards.
    fn write(&self, st: &mut State, key: u64, value: u64, old: Option<u64>) -> Result<Option<u64>> {
        let Some(i) = st.free.pop() else {
            return Err(Error::Pool(PoolError::OutOfSpace { node: 0, requested: 32 }));
        };
        st.seq += 1;
        let s = self.slot(i)?;
        s.key.store(key, Ordering::Relaxed);
        s.value.store(value, Ordering::Relaxed);
        s.seq.store(st.seq, Ordering::Relaxed);
        // PERSIST: the slot's contents are durable before it is marked valid.
        self.persist(s);
        s.valid.store(1, Ordering::Release);
        // PERSIST: the new version is durable before the old one is invalidated.
        self.persist(s);
        if let Some(o) = old {
            let so = self.slot(o)?;
            so.valid.store(0, Ordering::Release);
            self.persist(so);
            st.free.push(o);
        }
        Ok(Some(i))
    }

    fn build(pool: Arc<Pool>, base: PPtr, opts: ToyOptions) -> Toy {
        let state = State { map: BTreeMap::new(), free: Vec::new(), seq: 0, inserts: 0 };
        Toy { pool, base, opts, state: Mutex::new(state) }
    }
}

impl Index for Toy {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        let mut st = self.state.lock();
        if st.map.contains_key(&key) {
            return Ok(false);
        }
        st.inserts += 1;
        let slot = if self.opts.bug == Bug::LostAckedInsert && st.inserts % 3 == 0 {
            None
        } else {
            self.write(&mut st, key, value, None)?
        };
        st.map.insert(key, (slot, value));
        Ok(true)
    }

    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        check_key(key)?;
        let mut st = self.state.lock();
        let old = st.map.get(&key).and_then(|e| e.0);
        let slot = self.write(&mut st, key, value, old)?;
        st.map.insert(key, (slot, value));
        Ok(())
    }

    fn update(&self, key: u64, value: u64) -> Result<bool> {
        check_key(key)?;
        let mut st = self.state.lock();
        let Some(&(old, _)) = st.map.get(&key) else { return Ok(false) };
        let slot = self.write(&mut st, key, value, old)?;
        st.map.insert(key, (slot, value));
        Ok(true)
    }

    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        Ok(self.state.lock().map.get(&key).map(|e| e.1))
    }

    fn remove(&self, key: u64) -> Result<bool> {
        check_key(key)?;
        let mut st = self.state.lock();
        let Some((slot, _)) = st.map.remove(&key) else { return Ok(false) };
        if let Some(i) = slot {
            if self.opts.bug != Bug::ResurrectedDelete {
                let s = self.slot(i)?;
                s.valid.store(0, Ordering::Release);
                // PERSIST: the delete is durable before it is acknowledged.
                self.persist(s);
                st.free.push(i);
            }
        }
        Ok(true)
    }

    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        let st = self.state.lock();
        let before = out.len();
        out.extend(st.map.range(start..).take(max).map(|(&k, e)| (k, e.1)));
        if self.opts.bug == Bug::DuplicateScanKey && out.len() - before >= 2 {
            out[before + 1] = out[before];
        }
        Ok(out.len() - before)
    }

    fn stats(&self) -> EngineStats {
        let mut pm = vec![0; self.pool.nodes()];
        pm[0] = SLOTS_OFF + 32 * self.opts.slots;
        EngineStats { pm_bytes_per_node: pm, dram_bytes: 0, counters: vec![] }
    }

    fn check(&self) -> Result<CheckReport> {
        let st = self.state.lock();
        for (&k, &(slot, v)) in &st.map {
            let Some(i) = slot else { continue };
            let s = self.slot(i)?;
            if s.valid.load_unaccounted(Ordering::Acquire) != 1
                || s.key.load_unaccounted(Ordering::Acquire) != k
                || s.value.load_unaccounted(Ordering::Acquire) != v
            {
                return Err(Error::corrupted("toy", format!("slot {i} does not hold key {k}")));
            }
        }
        let mut allocated = 0;
        for node in 0..self.pool.nodes() {
            allocated +=
                self.pool.extents(node)?.iter().filter(|e| e.owner == OWNER_ENGINE).count();
        }
        Ok(CheckReport {
            entries: st.map.len() as u64,
            reachable_blocks: 1,
            allocated_blocks: allocated as u64,
        })
    }
}

impl Engine for Toy {
    type Options = ToyOptions;
    const NAME: &'static str = "toy";
    const FORMAT_VERSION: u32 = 1;

    fn create(pool: Arc<Pool>, opts: &ToyOptions) -> Result<Toy> {
        let bytes = SLOTS_OFF + 32 * opts.slots;
        let pages = bytes.div_ceil(pool.page_size());
        let base = pool.alloc_pages(0, pages, OWNER_ENGINE, 0)?;
        let head: &[PmU64; 2] = pool.get(base)?;
        head[1].store(opts.slots, Ordering::Relaxed);
        head[0].store(MAGIC, Ordering::Relaxed);
        // Slots start invalid: zero their valid words (the extent may hold stale bytes).
        let toy = Toy::build(pool.clone(), base, *opts);
        for i in 0..opts.slots {
            let s = toy.slot(i)?;
            s.valid.store(0, Ordering::Relaxed);
        }
        // PERSIST: the header and the cleared slots are durable before the root names them.
        pool.persist(pool.resolve(base), bytes as usize);
        let root = pool.root(0)?;
        root.store(base.raw(), Ordering::Release);
        pool.persist_obj(root);
        toy.state.lock().free = (0..opts.slots).rev().collect();
        Ok(toy)
    }

    fn open(pool: Arc<Pool>, opts: &ToyOptions) -> Result<(Toy, RecoveryReport)> {
        let t0 = Instant::now();
        let base = PPtr::from_raw(pool.root(0)?.load(Ordering::Acquire));
        if base.is_null() {
            return Err(Error::corrupted("toy", "root slot 0 is empty: store never initialised"));
        }
        let head: &[PmU64; 2] = pool.get(base)?;
        if head[0].load(Ordering::Acquire) != MAGIC {
            return Err(Error::corrupted("toy", "bad magic"));
        }
        let slots = head[1].load(Ordering::Acquire);
        let toy = Toy::build(pool.clone(), base, ToyOptions { slots, ..*opts });
        let mut best: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new(); // key → (seq, slot, value)
        let mut st = State { map: BTreeMap::new(), free: Vec::new(), seq: 0, inserts: 0 };
        let mut stale = Vec::new();
        for i in 0..slots {
            let s = toy.slot(i)?;
            if s.valid.load(Ordering::Acquire) != 1 {
                st.free.push(i);
                continue;
            }
            let (k, v, seq) = (
                s.key.load(Ordering::Acquire),
                s.value.load(Ordering::Acquire),
                s.seq.load(Ordering::Acquire),
            );
            st.seq = st.seq.max(seq);
            match best.get(&k) {
                Some(&(bseq, _, _)) if bseq > seq => stale.push(i),
                Some(&(_, bslot, _)) => {
                    stale.push(bslot);
                    best.insert(k, (seq, i, v));
                }
                None => {
                    best.insert(k, (seq, i, v));
                }
            }
        }
        for i in stale {
            let s = toy.slot(i)?;
            s.valid.store(0, Ordering::Release);
            // PERSIST: an overwritten version is dropped for good.
            pool.persist_obj(s);
            st.free.push(i);
        }
        st.map = best.into_iter().map(|(k, (_, slot, v))| (k, (Some(slot), v))).collect();
        *toy.state.lock() = st;
        let report =
            RecoveryReport { was_clean: pool.was_clean(), elapsed: t0.elapsed(), counters: vec![] };
        Ok((toy, report))
    }

    fn close(self) -> Result<()> {
        Ok(self.pool.close()?)
    }

    fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}
