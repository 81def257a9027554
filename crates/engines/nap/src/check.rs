//! `check()` and `stats()` of the layer.
//!
//! Invariants (names as they appear in errors, see docs/design.md "Nap"):
//! - `nal pointers`: the root slots name exactly the installed NALs, `GC` is 0 and no undo record
//!   is valid while no switch runs;
//! - `nal keys`: a NAL's keys ascend strictly and are valid keys;
//! - `pc-view latest`: for every entry written in a NAL, the highest version across its PC-views
//!   is the GV entry's version, with the GV value (or the deletion marker when absent);
//! - the raw engine's own invariants (its `check()`).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use numakv_index::{check_key, CheckReport, EngineStats, Error, Result};
use numakv_pmem::PPtr;

use crate::layout::{DEL, ENGINE, OWNER_NAP, SLOT_CUR, SLOT_GC, SLOT_PRE, SLOT_UNDO_STATE};
use crate::nal::Nal;
use crate::{Inner, Shared};

/// Sizes of the installed NALs, as `stats()` reports them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NalFigures {
    pub gv_bytes: u64,
    pub pc_bytes: u64,
    pub keys: u64,
    /// PC-views per NAL (one per node).
    pub views: usize,
}

fn bad(what: impl Into<String>) -> Error {
    Error::corrupted(ENGINE, what)
}

impl<I: Inner> Shared<I> {
    pub(crate) fn check(&self) -> Result<CheckReport> {
        let _g = self.switch_lock.lock();
        let raw = self.raw.check()?;
        let (cur, pre) = self.grace.pointers();
        // SAFETY: the switch lock keeps the installed NALs alive.
        let (cur, pre) = unsafe { (cur.as_ref(), pre.as_ref()) };
        let slot =
            |s| -> Result<PPtr> { Ok(PPtr::from_raw(self.pool.root(s)?.load(Ordering::Acquire))) };
        let root = |n: Option<&Nal>| n.map_or(PPtr::NULL, Nal::root);
        if slot(SLOT_CUR)? != root(cur) || slot(SLOT_PRE)? != root(pre) || !slot(SLOT_GC)?.is_null()
        {
            return Err(bad("nal pointers: root slots differ from the installed NALs"));
        }
        if self.pool.root(SLOT_UNDO_STATE)?.load(Ordering::Acquire) != 0 {
            return Err(bad("nal pointers: an undo record is valid outside a switch"));
        }
        let mut entries = raw.entries as i64;
        let mut reachable: HashSet<PPtr> = HashSet::new();
        let mut seen_keys: HashSet<u64> = HashSet::new();
        for nal in [cur, pre].into_iter().flatten() {
            reachable.extend(nal.views.iter().copied());
            if nal.keys.windows(2).any(|w| w[0] >= w[1])
                || nal.keys.iter().any(|&k| check_key(k).is_err())
            {
                return Err(bad(format!("nal keys: NAL {} keys not strictly ascending", nal.seq)));
            }
            for (i, &k) in nal.keys.iter().enumerate() {
                let st = *nal.entries[i].state.read();
                if st.version != 0 {
                    let (val, ver) = nal.pm_latest(i);
                    let want = if st.value.is_some() { st.version } else { st.version | DEL };
                    if ver != want || (st.value.is_some() && Some(val) != st.value) {
                        return Err(bad(format!(
                            "pc-view latest: key {k}: PM has ({val}, {ver:#x}), GV ({:?}, {want:#x})",
                            st.value
                        )));
                    }
                }
            }
        }
        // Entries: the raw index's, corrected for the keys whose latest state a NAL holds.
        for nal in [cur, pre].into_iter().flatten() {
            for (i, &k) in nal.keys.iter().enumerate() {
                if !seen_keys.insert(k) {
                    continue; // `cur` (first) decides
                }
                let st = *nal.entries[i].state.read();
                if !st.resolved && pre.is_some() {
                    continue;
                }
                let in_raw = self.raw.get(k)?.is_some();
                let in_nal = if st.resolved { st.value.is_some() } else { in_raw };
                entries += i64::from(in_nal) - i64::from(in_raw);
            }
        }
        let mut allocated = 0u64;
        for node in 0..self.pool.nodes() {
            for e in self.pool.extents(node)? {
                if e.owner == OWNER_NAP {
                    allocated += 1;
                    if !reachable.contains(&e.ptr) {
                        return Err(bad(format!(
                            "nal extents: extent {} is not a live PC-view",
                            e.ptr
                        )));
                    }
                }
            }
        }
        Ok(CheckReport {
            entries: entries.max(0) as u64,
            reachable_blocks: raw.reachable_blocks + reachable.len() as u64,
            allocated_blocks: raw.allocated_blocks + allocated,
        })
    }

    /// The installed NALs' sizes; the caller holds the switch lock (it keeps them alive).
    pub(crate) fn nal_figures_locked(&self) -> NalFigures {
        let (cur, pre) = self.grace.pointers();
        let mut f = NalFigures::default();
        // SAFETY: the caller holds the switch lock, which keeps the installed NALs alive.
        for nal in unsafe { [cur.as_ref(), pre.as_ref()] }.into_iter().flatten() {
            f.gv_bytes += nal.dram_bytes();
            f.pc_bytes += nal.pm_bytes();
            f.keys += nal.keys.len() as u64;
            f.views = f.views.max(nal.views.len());
        }
        f
    }

    pub(crate) fn stats(&self) -> EngineStats {
        let mut s = self.raw.stats();
        // A running switch holds the switch lock for as long as it lasts (a large hot set's
        // flush: hundreds of ms); stats then report the NALs as the last switch left them
        // rather than make a monitoring caller wait.
        let nal = match self.switch_lock.try_lock() {
            Some(_g) => {
                let f = self.nal_figures_locked();
                *self.nal_figures.lock() = f;
                f
            }
            None => *self.nal_figures.lock(),
        };
        let (gv, keys) = (nal.gv_bytes, nal.keys);
        let per_node = nal.pc_bytes / nal.views.max(1) as u64;
        for (n, b) in s.pm_bytes_per_node.iter_mut().enumerate() {
            if n < nal.views {
                *b += per_node;
            }
        }
        let pc = nal.pc_bytes;
        let c = &self.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let rb = self.hot.dram_bytes();
        let (sk, hp) = (get(&c.sketch_bytes), get(&c.heap_bytes));
        s.dram_bytes += rb + sk + hp + gv;
        s.counters.extend([
            ("nap_switches", get(&c.switches)),
            ("nap_switches_with_previous", get(&c.switches_with_previous)),
            ("nap_switch_errors", get(&c.switch_errors)),
            ("nap_nal_keys", keys),
            ("nap_nal_hits", c.nal_hits.iter().map(|h| get(h)).sum()),
            ("nap_blocked_writes", get(&c.blocked_writes)),
            ("nap_switch_us_total", get(&c.switch_us_total)),
            ("nap_switch_us_max", get(&c.switch_us_max)),
            ("nap_record_buffer_bytes", rb),
            ("nap_sketch_bytes", sk),
            ("nap_heap_bytes", hp),
            ("nap_gv_bytes", gv),
            ("nap_pc_view_bytes", pc),
        ]);
        s
    }
}
