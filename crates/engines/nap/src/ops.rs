//! Index operations through the NAL (papers/nap.txt §4.2, §4.3, §4.5 "type ② threads").
//!
//! An operation takes a snapshot `(cur, pre)` and routes its key:
//! - in `cur`: the GV entry of `cur` (lookups read it, writes persist into the caller's node's
//!   PC-view, then update it); an entry not yet `resolved` (lazy initialisation) takes its value
//!   from `pre`'s entry if `pre` holds the key, else from the raw index;
//! - else in `pre` (range B of Fig. 8): lookups read `pre`'s entry, writes wait until the switch
//!   has flushed `pre` and cleared the pointer, then retry;
//! - else: the raw index.

use std::sync::atomic::Ordering;

use numakv_index::{check_key, Index, Result};
use numakv_pmem::numa;

use crate::grace::Snapshot;
use crate::layout::DEL;
use crate::nal::{GvState, Nal};
use crate::{Inner, Shared};

/// A mutating operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    Insert(u64),
    Upsert(u64),
    Update(u64),
    Remove,
}

impl Write {
    /// The new value (`None`: absent) and whether anything changes, given the current value.
    fn apply(self, cur: Option<u64>) -> (Option<u64>, bool) {
        match (self, cur) {
            (Write::Insert(v), None) => (Some(v), true),
            (Write::Insert(_), Some(_)) => (cur, false),
            (Write::Upsert(v), _) => (Some(v), true),
            (Write::Update(v), Some(_)) => (Some(v), true),
            (Write::Update(_), None) => (None, false),
            (Write::Remove, Some(_)) => (None, true),
            (Write::Remove, None) => (None, false),
        }
    }

    /// The operation's result: whether it changed something (upsert: always true).
    fn on_raw<I: Index>(self, raw: &I, key: u64) -> Result<bool> {
        match self {
            Write::Insert(v) => raw.insert(key, v),
            Write::Upsert(v) => raw.upsert(key, v).map(|()| true),
            Write::Update(v) => raw.update(key, v),
            Write::Remove => raw.remove(key),
        }
    }
}

/// Where a write must go after looking at the snapshot.
enum Route<T = bool> {
    Done(T),
    /// `cur` holds the key but is not writable yet: wait for the first grace period.
    WaitWritable(*const Nal),
    /// `pre` holds the key: wait until `pre` changes.
    WaitPre(*const Nal),
}

impl<I: Inner> Shared<I> {
    /// The value of a `pre` entry (or the raw index's when it was never resolved there).
    fn read_pre(&self, pre: &Nal, i: usize, key: u64) -> Result<Option<u64>> {
        let st = *pre.entries[i].state.read();
        if st.resolved {
            Ok(st.value)
        } else {
            self.raw.get(key)
        }
    }

    /// The value an unresolved `cur` entry stands for: `pre`'s if `pre` holds the key, else the
    /// raw index's.
    fn read_lazy(&self, snap: &Snapshot<'_>, key: u64) -> Result<Option<u64>> {
        if let Some(pre) = snap.pre {
            if let Some(j) = pre.find(key) {
                return self.read_pre(pre, j, key);
            }
        }
        self.raw.get(key)
    }

    pub(crate) fn get(&self, key: u64) -> Result<Option<u64>> {
        check_key(key)?;
        let (op, snap) = self.grace.begin()?;
        self.hot.sample(op.tid, op.count, key);
        if let Some(cur) = snap.cur {
            if let Some(i) = cur.find(key) {
                self.counters.hit(op.tid);
                let st = *cur.entries[i].state.read();
                if st.resolved {
                    return Ok(st.value);
                }
                // ORDERING: Acquire pairs with the Release that marks the NAL writable after
                // the switch's first grace period.
                if snap.pre.is_some() || !cur.writable.load(Ordering::Acquire) {
                    // The previous NAL may still change or be flushed, or (before the first
                    // grace period, also when there is no previous NAL) a writer whose snapshot
                    // predates this NAL may still write the key to the raw index: read through,
                    // do not cache. (Caching here lost such a write: `tests/interleavings.rs`.)
                    return self.read_lazy(&snap, key);
                }
                // Switch finished: nobody writes this key to the raw index any more, so its
                // value there is final until this NAL changes it; cache it (§4.5 phase 3).
                let mut st = cur.entries[i].state.write();
                if !st.resolved {
                    *st =
                        GvState { resolved: true, value: self.raw.get(key)?, version: st.version };
                }
                return Ok(st.value);
            }
        }
        if let Some(pre) = snap.pre {
            if let Some(j) = pre.find(key) {
                return self.read_pre(pre, j, key);
            }
        }
        self.raw.get(key)
    }

    pub(crate) fn write(&self, key: u64, w: Write) -> Result<bool> {
        check_key(key)?;
        loop {
            let route = {
                let (op, snap) = self.grace.begin()?;
                self.hot.sample(op.tid, op.count, key);
                self.route_write(&snap, op.tid, key, w)?
            };
            match route {
                Route::Done(r) => return Ok(r),
                Route::WaitWritable(nal) => self.wait(|| !self.grace.is_unwritable(nal))?,
                Route::WaitPre(pre) => {
                    self.counters.blocked_writes.fetch_add(1, Ordering::Relaxed);
                    self.wait(|| !self.grace.pre_is(pre))?
                }
            }
        }
    }

    /// [`Index::update_with`] (issue 36): routed like a write; for a key of `cur`, `f` runs
    /// under the GV entry's write lock (which excludes the key's other writers), its result is
    /// persisted into the local PC-view; for a key in neither NAL, the raw engine's own
    /// `update_with` (FAST&FAIR: one descent under the leaf lock, instead of the default's
    /// `get` and `upsert`).
    pub(crate) fn update_with(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        check_key(key)?;
        loop {
            let route = {
                let (op, snap) = self.grace.begin()?;
                self.hot.sample(op.tid, op.count, key);
                self.route_update_with(&snap, op.tid, key, &mut *f)?
            };
            match route {
                Route::Done(r) => return Ok(r),
                Route::WaitWritable(nal) => self.wait(|| !self.grace.is_unwritable(nal))?,
                Route::WaitPre(pre) => {
                    self.counters.blocked_writes.fetch_add(1, Ordering::Relaxed);
                    self.wait(|| !self.grace.pre_is(pre))?
                }
            }
        }
    }

    fn route_update_with(
        &self,
        snap: &Snapshot<'_>,
        tid: usize,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Route<Option<u64>>> {
        if let Some(cur) = snap.cur {
            if let Some(i) = cur.find(key) {
                // ORDERING: Acquire, as in `route_write`.
                if !cur.writable.load(Ordering::Acquire) {
                    return Ok(Route::WaitWritable(cur));
                }
                self.counters.hit(tid);
                let mut st = cur.entries[i].state.write();
                if !st.resolved {
                    // As in `write_nal`: `cur` is writable, the value read here is final.
                    st.value = self.read_lazy(snap, key)?;
                    st.resolved = true;
                }
                let Some(old) = st.value else { return Ok(Route::Done(None)) };
                let Some(new) = f(old)? else { return Ok(Route::Done(Some(old))) };
                let version = st.version + 1;
                cur.pc_write(numa::current_node(), i, new, version);
                st.version = version;
                st.value = Some(new);
                return Ok(Route::Done(Some(old)));
            }
        }
        if let Some(pre) = snap.pre {
            if pre.find(key).is_some() {
                return Ok(Route::WaitPre(pre));
            }
        }
        // As a write routed to the raw index: a switch installing a NAL over the key waits
        // for this operation (grace period 1).
        self.raw.update_with(key, f).map(Route::Done)
    }

    fn route_write(&self, snap: &Snapshot<'_>, tid: usize, key: u64, w: Write) -> Result<Route> {
        if let Some(cur) = snap.cur {
            if let Some(i) = cur.find(key) {
                // ORDERING: Acquire pairs with the Release that marks the NAL writable after
                // the first grace period.
                if !cur.writable.load(Ordering::Acquire) {
                    return Ok(Route::WaitWritable(cur));
                }
                self.counters.hit(tid);
                return self.write_nal(snap, cur, i, key, w).map(Route::Done);
            }
        }
        if let Some(pre) = snap.pre {
            if pre.find(key).is_some() {
                return Ok(Route::WaitPre(pre));
            }
        }
        // This operation's snapshot routes the key to the raw index; a switch that installs a
        // NAL over the key now waits (its first grace period) for this write to finish.
        numakv_pmem::pause_point!("nap.write.raw_routed");
        w.on_raw(&self.raw, key).map(Route::Done)
    }

    /// A write absorbed by `cur`: lock, resolve, persist into the local PC-view, update the GV.
    fn write_nal(
        &self,
        snap: &Snapshot<'_>,
        cur: &Nal,
        i: usize,
        key: u64,
        w: Write,
    ) -> Result<bool> {
        let mut st = cur.entries[i].state.write();
        if !st.resolved {
            // `cur` is writable, so the first grace period has passed: no thread writes this
            // key to `pre` or the raw index any more, the value read here is final.
            st.value = self.read_lazy(snap, key)?;
            st.resolved = true;
            // Resolved (from `pre` or the raw index), not yet persisted: the switch may flush
            // and unpublish `pre` meanwhile, but must not free it (grace period 2).
            numakv_pmem::pause_point!("nap.write.nal_resolved");
        }
        let (new, changed) = w.apply(st.value);
        if !changed {
            return Ok(false);
        }
        let version = st.version + 1;
        let (value, stored) = match new {
            Some(v) => (Some(v), version),
            None => (None, version | DEL),
        };
        cur.pc_write(numa::current_node(), i, value.unwrap_or(0), stored);
        st.version = version;
        st.value = value;
        Ok(true)
    }

    /// Waits (outside any operation, so grace periods do not wait for us) until `ready`, or
    /// fails if the switch stalled with an error.
    fn wait(&self, ready: impl Fn() -> bool) -> Result<()> {
        let mut spins = 0u32;
        while !ready() {
            if let Some(e) = self.stall_error() {
                return Err(e);
            }
            spins += 1;
            if spins < 32 {
                std::hint::spin_loop();
            } else if spins < 1_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// Scan: the raw index's pairs in `[start, ..)` merged with the NALs' (§4.2 "Range query"):
    /// a key a NAL holds takes the NAL's value (or is dropped when the NAL says absent).
    pub(crate) fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        if max == 0 || start == u64::MAX {
            return Ok(0);
        }
        let base = out.len();
        let mut pos = start.max(1);
        let mut chunk = Vec::new();
        loop {
            // One operation per chunk (grace.rs): a switch's grace period 2 waits for this
            // chunk, not for the whole scan; grace period 1 does not wait for scans at all.
            let (_op, snap) = self.grace.begin_scan()?;
            let want = (max - (out.len() - base)).max(16);
            chunk.clear();
            let n = self.raw.scan(pos, want, &mut chunk)?;
            // A raw chunk read, the NALs' values not merged yet: a switch may flush `pre` into
            // the raw index meanwhile (grace period 2 must wait for this snapshot).
            numakv_pmem::pause_point!("nap.scan.raw_chunk");
            // The raw chunk covers every raw key in [pos, hi]; past it, nothing when exhausted.
            let exhausted = n < want;
            let hi = if exhausted { u64::MAX - 1 } else { chunk[n - 1].0 };
            let mut nal_keys: Vec<u64> = Vec::new();
            for nal in [snap.cur, snap.pre].into_iter().flatten() {
                let from = nal.keys.partition_point(|&k| k < pos);
                let to = nal.keys.partition_point(|&k| k <= hi);
                nal_keys.extend_from_slice(&nal.keys[from..to]);
            }
            nal_keys.sort_unstable();
            nal_keys.dedup();
            let (mut a, mut b) = (0, 0);
            while out.len() - base < max && (a < chunk.len() || b < nal_keys.len()) {
                let ka = chunk.get(a).map_or(u64::MAX, |e| e.0);
                let kb = nal_keys.get(b).copied().unwrap_or(u64::MAX);
                let key = ka.min(kb);
                let raw_val = (ka == key).then(|| chunk[a].1);
                if ka == key {
                    a += 1;
                }
                if kb == key {
                    b += 1;
                    if let Some(v) = self.nal_value(&snap, key, raw_val) {
                        out.push((key, v));
                    }
                } else if let Some(v) = raw_val {
                    out.push((key, v));
                }
            }
            if out.len() - base >= max || exhausted || hi >= u64::MAX - 1 {
                return Ok(out.len() - base);
            }
            pos = hi + 1;
        }
    }

    /// The value of a NAL-held key during a scan; `raw` is the raw index's value from the chunk.
    fn nal_value(&self, snap: &Snapshot<'_>, key: u64, raw: Option<u64>) -> Option<u64> {
        let pre_value = || {
            snap.pre.and_then(|p| p.find(key).map(|j| (p, j))).map_or(raw, |(p, j)| {
                let st = *p.entries[j].state.read();
                if st.resolved {
                    st.value
                } else {
                    raw
                }
            })
        };
        if let Some(cur) = snap.cur {
            if let Some(i) = cur.find(key) {
                let st = *cur.entries[i].state.read();
                return if st.resolved { st.value } else { pre_value() };
            }
        }
        pre_value()
    }
}
