//! Scans (papers/nstore.txt §III-E): the addresses come from the volatile index in key order;
//! the values are read by *local read threads* of the node that holds each entry, so a scan
//! reads no remote PM. The calling thread reads its own node's entries itself.
//!
//! The caller keeps an epoch guard pinned from the index scan until every value is back, so no
//! file the addresses name is freed meanwhile; an address whose file GC already unlinked is
//! resolved again through the index (the key moved, or was deleted and is skipped).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use numakv_index::Result;
use numakv_pmem::alloc::epoch;
use parking_lot::Mutex;

use crate::layout::VAddr;
use crate::{my_node, Inner};

/// A batch for one node's read threads: `(position, key, address)`; the reply carries
/// `(position, value or None when the file is gone)`.
struct Job {
    items: Vec<(usize, u64, VAddr)>,
    reply: Sender<Result<Values>>,
}

/// A read thread's answer: `(position, value or None when the file is gone)`.
type Values = Vec<(usize, Option<u64>)>;

/// The local read threads.
#[derive(Debug)]
pub(crate) struct ScanPool {
    /// Per node: the job queue of its read threads.
    senders: Vec<Mutex<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Job({} items)", self.items.len())
    }
}

impl ScanPool {
    /// Starts `scan_threads_per_node` threads per node; `None` when that is 0 or one node (the
    /// caller's own reads are local then).
    pub(crate) fn start(inner: &Arc<Inner>) -> Option<ScanPool> {
        let per = inner.opts.scan_threads_per_node;
        let nodes = inner.nlog.nodes;
        if per == 0 || nodes < 2 {
            return None;
        }
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for node in 0..nodes {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..per {
                let inner = Arc::clone(inner);
                let rx = Arc::clone(&rx);
                let h = std::thread::Builder::new()
                    .name(format!("nstore-read-{node}.{i}"))
                    .spawn(move || reader(&inner, node, &rx));
                match h {
                    Ok(h) => threads.push(h),
                    Err(_) => return None,
                }
            }
            senders.push(Mutex::new(tx));
        }
        Some(ScanPool { senders, threads })
    }

    /// Closes the queues and joins the threads.
    pub(crate) fn stop(self) {
        drop(self.senders);
        for h in self.threads {
            let _ = h.join();
        }
    }
}

fn reader(inner: &Inner, node: usize, rx: &Mutex<Receiver<Job>>) {
    numakv_numa::set_current_node(node);
    loop {
        let job = rx.lock().recv();
        let Ok(job) = job else { return };
        // Pinned for the reads themselves: the caller's guard keeps the files alive only while
        // the caller waits, and a caller that gives up early (another node's batch failed)
        // must not leave this thread reading pages GC may free.
        let guard = epoch::pin();
        let out: Result<Vec<_>> =
            job.items.iter().map(|&(i, k, va)| inner.read_at(k, va).map(|v| (i, v))).collect();
        drop(guard);
        // This thread's reads are part of the caller's scan: close them into the thread's
        // totals (no operation of its own), so that the accounting sees them.
        numakv_pmem::account::op_split();
        let _ = job.reply.send(out);
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// [`numakv_index::Index::scan`] for NStore: up to `max` pairs from the first key ≥ `start`.
/// A key the index listed that is gone by the time its value is read (GC moved it, then it was
/// deleted) leaves a hole, which is filled from the keys after the window, so that a batch
/// comes back short only at the end of the keys (a caller pages until a short batch).
pub(crate) fn scan(
    inner: &Inner,
    pool: Option<&ScanPool>,
    start: u64,
    max: usize,
    out: &mut Vec<(u64, u64)>,
) -> Result<usize> {
    let before = out.len();
    let mut from = start;
    loop {
        let want = max - (out.len() - before);
        let (last, listed) = scan_window(inner, pool, from, want, out)?;
        let got = out.len() - before;
        // The index had fewer keys than asked for: the end of the keys.
        if got >= max || listed < want {
            return Ok(got);
        }
        match last.checked_add(1).filter(|&k| k < u64::MAX) {
            Some(k) => from = k,
            None => return Ok(got),
        }
    }
}

/// One window of [`scan`]: the index's first `max` keys from `start`, with their values; returns
/// the last key listed and how many were listed.
fn scan_window(
    inner: &Inner,
    pool: Option<&ScanPool>,
    start: u64,
    max: usize,
    out: &mut Vec<(u64, u64)>,
) -> Result<(u64, usize)> {
    let _guard = epoch::pin();
    let mut addrs = Vec::with_capacity(max.min(1024));
    inner.index.scan(start, max, &mut addrs);
    numakv_pmem::pause_point!("nstore.scan.listed");
    let mut values: Vec<Option<u64>> = vec![None; addrs.len()];
    let me = my_node(inner.nlog.nodes);
    let mut batches: Vec<Vec<(usize, u64, VAddr)>> = vec![Vec::new(); inner.nlog.nodes];
    for (i, &(k, va)) in addrs.iter().enumerate() {
        match (pool, va.node()) {
            (Some(_), n) if n != me && n < batches.len() => batches[n].push((i, k, va)),
            _ => values[i] = inner.read_at(k, va)?,
        }
    }
    if let Some(pool) = pool {
        let (tx, rx) = mpsc::channel();
        let mut sent = 0;
        // The first error; returned only once every batch sent is answered (the read threads
        // pin their own guards, but the replies name positions of this call's vectors).
        let mut failed = None;
        for (n, items) in batches.into_iter().enumerate() {
            if items.is_empty() {
                continue;
            }
            let job = Job { items, reply: tx.clone() };
            if let Err(mpsc::SendError(job)) = pool.senders[n].lock().send(job) {
                // The read threads are gone (shutdown in progress): read here.
                for (i, k, va) in job.items {
                    match inner.read_at(k, va) {
                        Ok(v) => values[i] = v,
                        Err(e) => {
                            failed.get_or_insert(e);
                        }
                    }
                }
                continue;
            }
            sent += 1;
        }
        drop(tx);
        for _ in 0..sent {
            let Ok(r) = rx.recv() else { break };
            match r {
                Ok(r) => {
                    for (i, v) in r {
                        values[i] = v;
                    }
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
    }
    for (i, &(k, _)) in addrs.iter().enumerate() {
        let v = match values[i] {
            Some(v) => Some(v),
            // The file was reclaimed after the index scan: the key moved (or went away).
            None => inner.lookup(k)?.map(|(v, _)| v),
        };
        if let Some(v) = v {
            out.push((k, v));
        }
    }
    Ok((addrs.last().map_or(start, |a| a.0), addrs.len()))
}
