//! PM lines per phase of the engine's work, for the NUMA analysis of papers/f3tree.txt Figs.
//! 8-9: which part of a write — the producer's tree lookup, its PTFO append, the evaluator's
//! PTFO reads, the evaluator's tree write — touches local or remote PM.
//!
//! The substrate counts distinct lines per accounted *segment* of a thread
//! ([`numakv_pmem::account`]). At each phase boundary the engine closes the thread's segment
//! with [`account::op_split`] (lines counted, no operation counted) and charges the lines of that
//! segment to the phase. So every evaluated entry is its own segment — the tree write of an
//! evaluator is counted like one FAST&FAIR operation, not de-duplicated over a whole batch.
//! Nothing is done (one relaxed load) while accounting is off.

use std::sync::atomic::{AtomicU64, Ordering};

use numakv_pmem::account;

/// A phase of the engine's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A producer reading the global tree (insert-if-absent, update, remove).
    ProducerTree = 0,
    /// A producer writing its PTFO: the entry, a superseded entry's DEAD mark, FO links.
    ProducerPtfo = 1,
    /// An evaluator reading PTFO entries, marking them DEAD, unlinking FOs.
    EvalPtfo = 2,
    /// An evaluator writing the global tree.
    EvalTree = 3,
}

impl Phase {
    /// Every phase, in counter order.
    pub const ALL: [Phase; 4] =
        [Phase::ProducerTree, Phase::ProducerPtfo, Phase::EvalPtfo, Phase::EvalTree];

    /// The name used in the engine's counters (`pm_<name>_local`, `pm_<name>_remote`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::ProducerTree => "producer_tree",
            Phase::ProducerPtfo => "producer_ptfo",
            Phase::EvalPtfo => "eval_ptfo",
            Phase::EvalTree => "eval_tree",
        }
    }
}

/// Lines per phase: `[phase][reads local, reads remote, writes local, writes remote]`.
#[derive(Debug, Default)]
pub struct Phases([[AtomicU64; 4]; 4]);

impl Phases {
    /// Closes the calling thread's accounting segment and charges its lines to `phase`.
    #[inline]
    pub fn end(&self, phase: Phase) {
        if !account::enabled() {
            return;
        }
        let before = account::thread_stats();
        account::op_split();
        let d = account::thread_stats().since(&before);
        let c = &self.0[phase as usize];
        for (i, x) in
            [d.reads_local, d.reads_remote, d.writes_local, d.writes_remote].into_iter().enumerate()
        {
            if x != 0 {
                // ORDERING: Relaxed; statistics.
                c[i].fetch_add(x, Ordering::Relaxed);
            }
        }
    }

    /// `(local, remote)` lines (reads plus writes) charged to `phase` so far.
    pub fn lines(&self, phase: Phase) -> (u64, u64) {
        let c = &self.0[phase as usize];
        // ORDERING: Relaxed; statistics.
        let g = |i: usize| c[i].load(Ordering::Relaxed);
        (g(0) + g(2), g(1) + g(3))
    }
}
