//! Evaluate threads (papers/f3tree.txt §4.2–4.3, Algorithm 1 lines 21–31): the consumers that
//! checkpoint PTFO entries into the global tree.
//!
//! - **Placement** ([`crate::Evaluators`]): F3-tree(N) runs `n` evaluators per node, each pinned
//!   there and serving only lists of its node (the list's rank modulo the per-node count picks
//!   which) — the paper's `NUMA-Eval()`; N2 runs two in total, still node-bound; NI runs two in
//!   total on the first node serving every list; `f3tree-nonuma` runs unpinned evaluators that
//!   serve any list. An evaluator runs as a thread of its node.
//! - **Triggers.** A list is evaluated once it holds `count_threshold` unprocessed entries, or has
//!   any and was last evaluated `time_threshold` ago; always when its producer waits at the FO
//!   limit, when the engine drains (close), and for lists recovered at open.
//! - **Key-based (F3-K)**: entries in written order. **Node-based batched (F3-N)**: up to `batch`
//!   entries gathered from the list, sorted by key, so consecutive tree writes share leaves.
//!   Neither order matters for correctness: an entry is written into the tree only if the table
//!   still names exactly that entry (the latest version of its key); an entry the table no
//!   longer names was superseded and already marked DEAD by the writer that superseded it.
//! - **One evaluation** (`drain`): (1) apply each entry still the latest of its key — the tree
//!   write outside the key's shard lock, the key flagged `applying` meanwhile; (2) move the
//!   list's persistent `applied` watermark past the batch with one flush (instead of a DEAD mark
//!   per entry); (3) remove the applied keys from the table where it still names their entry;
//!   (4) unlink the FOs passed.
//! - **Reclamation.** An FO all of whose entries are processed and that is not the head is
//!   unlinked from the tail and freed (`ptfo::unlink_tail`). A recovered list is freed entirely
//!   once drained, and its directory slot reused.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use numakv_fastfair::LeafCursor;
use numakv_index::{Error, Index, Result};
use numakv_numa as numa;
use numakv_pmem::alloc::epoch;
use numakv_pmem::PPtr;

use crate::layout::{Fo, FoEntry, DEAD, ENGINE, TOMB, VERSION_MASK};
use crate::phase::Phase;
use crate::ptfo::{self, List};
use crate::{Evaluation, Inner};

/// Most entries one evaluation of a list processes in key-based mode before the evaluator
/// looks at its other lists.
const KEY_BASED_ROUND: usize = 4096;

/// Starts the evaluate threads.
pub(crate) fn spawn(inner: &Arc<Inner>) -> Result<Vec<JoinHandle<()>>> {
    let nodes = inner.pool.nodes();
    let ev = inner.opts.evaluators;
    // Pinned evaluators are bound to a CPU of their node (the paper binds them with numactl);
    // emulated nodes map onto the machine's CPUs.
    let topology = numa::Topology::with_nodes(nodes).ok();
    let total = ev.threads(nodes);
    let mut out = Vec::with_capacity(total);
    let mut on_node = vec![0usize; nodes];
    for g in 0..total {
        let (node, pinned) = ev.node_of(g, nodes);
        let node = node.min(nodes - 1);
        let j = on_node[node];
        on_node[node] += 1;
        let me = Arc::clone(inner);
        let cpu = topology
            .as_ref()
            .filter(|_| pinned)
            .and_then(|t| t.node(node))
            .filter(|n| !n.cpus.is_empty())
            .map(|n| n.cpus[j % n.cpus.len()]);
        let h = std::thread::Builder::new()
            .name(format!("f3-eval-{node}-{j}"))
            .spawn(move || {
                if pinned {
                    match cpu.map(numa::pin_current_thread) {
                        Some(Ok(())) => {
                            me.counters.evaluators_pinned.fetch_add(1, Ordering::Relaxed)
                        }
                        // E.g. a CPU outside this process's cpuset: evaluate unpinned.
                        _ => me.counters.pin_failures.fetch_add(1, Ordering::Relaxed),
                    };
                }
                run(&me, node, g)
            })
            .map_err(|e| Error::Unsupported(format!("cannot start an evaluate thread: {e}")));
        match h {
            Ok(h) => out.push(h),
            Err(e) => {
                // The threads already started exit on `stop`; join them before failing.
                inner.stop.store(true, Ordering::Relaxed);
                for h in out {
                    let _ = h.join();
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Whether evaluator `g` serves `l`.
fn serves(inner: &Inner, l: &List, g: usize) -> bool {
    // ORDERING: Relaxed; set once before the list is published under the lists' lock.
    let rank = l.rank.load(Ordering::Relaxed);
    inner.opts.evaluators.serves(g, inner.pool.nodes(), l.node, rank)
}

fn run(inner: &Inner, node: usize, g: usize) {
    // The evaluator is a thread of `node`: accounting counts its PM accesses against it, NSM
    // places the tree nodes it allocates there (local mode).
    numa::set_current_node(node);
    let idle =
        Duration::from_micros(200).min(inner.opts.time_threshold.max(Duration::from_micros(20)));
    // ORDERING: Relaxed; `stop` only ends the loop, it guards no data.
    while !inner.stop.load(Ordering::Relaxed) {
        let lists: Vec<Arc<List>> =
            inner.lists.read().iter().filter(|l| serves(inner, l, g)).cloned().collect();
        let mut worked = false;
        let mut retired = false;
        for l in &lists {
            if inner.stop.load(Ordering::Relaxed) {
                return;
            }
            let r = {
                let _g = inner.gate.read();
                drain(inner, l)
            };
            // One accounted "operation" per evaluation: the evaluate threads' PM lines (FO
            // reads, tree writes — local or remote to their node) show in the global access
            // statistics, which is where papers/f3tree.txt Figs. 8-9 count them.
            numakv_pmem::account::op_end();
            match r {
                Ok((n, done)) => {
                    worked |= n > 0;
                    retired |= done;
                    if n > 0 {
                        *inner.eval_oos.lock() = None;
                        // Tree nodes this evaluation retired (merges) sit in this thread's
                        // epoch bag: hand them over now, before the next gate, which `check()`
                        // may hold while it waits for their grace period to end.
                        epoch::pin().flush();
                    }
                }
                Err(e) => {
                    if inner.pool.has_crashed() {
                        return;
                    }
                    inner.counters.eval_errors.fetch_add(1, Ordering::Relaxed);
                    if e.is_out_of_space() {
                        *inner.eval_oos.lock() = Some(node);
                    } else {
                        *inner.eval_error.lock() = Some(e.to_string());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        if retired {
            inner.lists.write().retain(|l| !l.retired.load(Ordering::Relaxed));
        }
        if !worked {
            // Deferred frees of the tree (merges) sit in this thread's epoch bag: hand them
            // over so the grace period can end while the evaluator idles.
            epoch::pin().flush();
            std::thread::sleep(idle);
        }
    }
}

/// Evaluates `l` if it is due: returns the entries processed and whether the (recovered) list
/// was retired.
pub(crate) fn drain(inner: &Inner, l: &List) -> Result<(usize, bool)> {
    numakv_pmem::pause_point!("f3tree.evaluate.drain");
    if l.retired.load(Ordering::Relaxed) {
        return Ok((0, false));
    }
    let mut cur = l.cursor.lock();
    let pending = l.pending();
    let due = inner.draining.load(Ordering::Relaxed)
        || l.recovering
        || l.waiting.load(Ordering::Relaxed)
        || pending >= inner.opts.count_threshold.max(1)
        || (pending > 0 && cur.last_eval.elapsed() >= inner.opts.time_threshold);
    if !due {
        return Ok((0, false));
    }
    cur.last_eval = Instant::now();
    let max = match inner.opts.evaluation {
        Evaluation::KeyBased => KEY_BASED_ROUND,
        Evaluation::NodeBatched { batch } => batch,
    };
    // Gather entry locations from the cursor on; FOs passed completely are freed afterwards.
    let pool = &inner.pool;
    let mut items: Vec<PPtr> = Vec::new();
    let mut passed: Vec<(PPtr, PPtr)> = Vec::new();
    let (mut fo_p, mut idx) = (cur.fo, cur.idx);
    loop {
        let head = l.head();
        let fo = Fo::resolve(pool, fo_p)?;
        let avail = if fo_p == head {
            // ORDERING: Acquire; pairs with the producer's Release after the entry persisted.
            l.head_used.load(Ordering::Acquire).min(fo.cap)
        } else {
            fo.cap
        };
        while idx < avail && items.len() < max {
            items.push(fo.entry_ptr(idx));
            idx += 1;
        }
        if idx < fo.cap || fo_p == head || items.len() >= max {
            break;
        }
        let newer = fo.prev();
        if newer.is_null() {
            return Err(Error::corrupted(
                ENGINE,
                format!("list links: FO {fo_p} is not the head but has no newer FO"),
            ));
        }
        passed.push((fo_p, newer));
        fo_p = newer;
        idx = 0;
    }
    if let Evaluation::NodeBatched { .. } = inner.opts.evaluation {
        let key = |p: &PPtr| pool.get::<FoEntry>(*p).map_or(0, |e| e.key.load(Ordering::Relaxed));
        items.sort_by_cached_key(key);
    }
    inner.counters.phases.end(Phase::EvalPtfo);
    // 1. Apply: each entry still the latest of its key goes into the tree (durably).
    let mut applied: Vec<(u64, PPtr, u64)> = Vec::with_capacity(items.len());
    let mut skipped = 0u64;
    let mut tally = |r: Option<(u64, PPtr, u64)>| match r {
        Some(a) => applied.push(a),
        None => skipped += 1,
    };
    match inner.opts.evaluation {
        Evaluation::KeyBased => {
            for &loc in &items {
                tally(apply(inner, loc, None)?);
            }
        }
        Evaluation::NodeBatched { .. } => {
            // Node-based: the sorted batch is written leaf by leaf — keys that fall into the
            // leaf the previous key went to are written there without a new descent.
            let mut cursor = inner.tree.leaf_cursor();
            for &loc in &items {
                tally(apply(inner, loc, Some(&mut cursor))?);
            }
            inner.counters.leaf_reuses.fetch_add(cursor.hits(), Ordering::Relaxed);
        }
    }
    let desc = inner.desc(l.slot)?;
    // 2. One watermark for the whole batch: every entry before the new cursor is processed.
    if !items.is_empty() {
        let seq = Fo::resolve(pool, fo_p)?.seq(idx);
        ptfo::set_watermark(pool, desc, seq);
        numakv_pmem::pause_point!("f3tree.evaluate.watermarked");
    }
    // 3. The applied keys leave the table (those not superseded meanwhile). Only now: a writer
    //    superseding an applied entry before the watermark was durable marked it DEAD itself.
    for &(key, loc, version) in &applied {
        let mut shard = inner.table.lock(key);
        if shard.map.get(&key).is_some_and(|p| p.loc == loc && p.version == version) {
            shard.map.remove(&key);
        }
    }
    // 4. FOs passed completely are unlinked: no table entry names them any more.
    if !passed.is_empty() {
        numakv_pmem::pause_point!("f3tree.evaluate.unlinking");
    }
    for &(fo, newer) in &passed {
        ptfo::unlink_tail(pool, &inner.nsm, desc, fo, newer)?;
        l.fos.fetch_sub(1, Ordering::Relaxed);
        inner.counters.fos_freed.fetch_add(1, Ordering::Relaxed);
    }
    inner.counters.phases.end(Phase::EvalPtfo);
    cur.fo = fo_p;
    cur.idx = idx;
    l.consumed.fetch_add(items.len() as u64, Ordering::Relaxed);
    // ORDERING: Relaxed, all: statistics, added once per evaluation (a per-entry add on a line
    // every evaluator shares showed up as a third of the evaluators' time).
    inner.counters.applied.fetch_add(applied.len() as u64, Ordering::Relaxed);
    inner.counters.skipped.fetch_add(skipped, Ordering::Relaxed);
    inner.counters.evaluations.fetch_add(1, Ordering::Relaxed);
    let mut retired = false;
    if l.recovering && fo_p == l.head() && idx >= l.head_used.load(Ordering::Acquire) {
        ptfo::retire_list(pool, &inner.nsm, desc, fo_p)?;
        l.fos.store(0, Ordering::Relaxed);
        l.retired.store(true, Ordering::Relaxed);
        inner.counters.fos_freed.fetch_add(1, Ordering::Relaxed);
        inner.free_slots.lock().push(l.slot);
        retired = true;
    }
    Ok((items.len(), retired))
}

/// Writes the entry at `loc` into the tree if it is still the latest of its key (through the
/// batch's leaf cursor when node-batched); returns `(key, loc, version)` if it did, `None` if it
/// was superseded.
///
/// The tree write runs outside the key's shard lock — a split can take long, and producers of
/// the shard's other keys must not wait for it — with the key flagged `applying`, which keeps
/// other evaluators off the key until the write is done: the tree gets a key's versions in
/// order. The key stays in the table (its logical value unchanged: the entry is its latest)
/// until the caller has made the batch durably processed.
fn apply(
    inner: &Inner,
    loc: PPtr,
    cursor: Option<&mut LeafCursor<'_>>,
) -> Result<Option<(u64, PPtr, u64)>> {
    let pool = &inner.pool;
    let e = pool.get::<FoEntry>(loc)?;
    // ORDERING: Acquire; pairs with the Release of the meta word in `ptfo::append`.
    let meta = e.meta.load(Ordering::Acquire);
    if meta == 0 || meta & DEAD != 0 {
        return Ok(None);
    }
    let key = e.key.load(Ordering::Relaxed);
    let value = e.value.load(Ordering::Relaxed);
    let version = meta & VERSION_MASK;
    let phases = &inner.counters.phases;
    phases.end(Phase::EvalPtfo);
    let mut waited = false;
    loop {
        let mut shard = inner.table.lock(key);
        match shard.map.get_mut(&key) {
            Some(p) if p.loc == loc && p.version == version => {
                if p.applying {
                    // Another evaluator is writing an older version of the key (the flag
                    // passed to this entry when it superseded that one): let it finish.
                    drop(shard);
                    if !waited {
                        waited = true;
                        inner.counters.apply_waits.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::yield_now();
                    continue;
                }
                p.applying = true;
                break;
            }
            // Superseded: the superseding writer marked it DEAD (durably) before it replaced it
            // in the table, under this same lock.
            _ => return Ok(None),
        }
    }
    numakv_pmem::pause_point!("f3tree.evaluate.applying");
    let written = if meta & TOMB != 0 {
        inner.tree.remove(key).map(|_| ())
    } else if let Some(c) = cursor {
        c.upsert(key, value)
    } else {
        inner.tree.upsert(key, value)
    };
    phases.end(Phase::EvalTree);
    // Whatever the outcome, the key is free for the next writer of the tree. The table holds
    // the key still: only this evaluator's step 3 removes the entry it flagged, and a newer
    // entry inherited the flag.
    if let Some(p) = inner.table.lock(key).map.get_mut(&key) {
        p.applying = false;
    }
    written?;
    Ok(Some((key, loc, version)))
}

/// Waits until no key is pending and no recovered list remains; gives up after `timeout`, or
/// earlier when the evaluators made no progress for `stall` (e.g. the pool is out of space for
/// the tree). `true` if idle.
pub(crate) fn wait_idle(inner: &Inner, timeout: Duration, stall: Duration) -> bool {
    let t0 = Instant::now();
    let mut last = (usize::MAX, u64::MAX);
    let mut since = Instant::now();
    loop {
        let recovering = inner
            .lists
            .read()
            .iter()
            .filter(|l| l.recovering && !l.retired.load(Ordering::Relaxed))
            .count();
        let pending = inner.table.len();
        if pending == 0 && recovering == 0 {
            return true;
        }
        // ORDERING: Relaxed; progress is a heuristic.
        let progress = (pending + recovering, inner.counters.applied.load(Ordering::Relaxed));
        if progress != last {
            last = progress;
            since = Instant::now();
        }
        if t0.elapsed() >= timeout
            || since.elapsed() >= stall
            || inner.stop.load(Ordering::Relaxed)
            || inner.pool.has_crashed()
        {
            return false;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
