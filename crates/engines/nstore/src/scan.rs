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
        let out: Result<Vec<_>> =
            job.items.iter().map(|&(i, k, va)| inner.read_at(k, va).map(|v| (i, v))).collect();
        // This thread's reads are part of the caller's scan: close them into the thread's
        // totals (no operation of its own), so that the accounting sees them.
        numakv_pmem::account::op_split();
        let _ = job.reply.send(out);
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// [`numakv_index::Index::scan`] for NStore.
pub(crate) fn scan(
    inner: &Inner,
    pool: Option<&ScanPool>,
    start: u64,
    max: usize,
    out: &mut Vec<(u64, u64)>,
) -> Result<usize> {
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
        for (n, items) in batches.into_iter().enumerate() {
            if items.is_empty() {
                continue;
            }
            let job = Job { items, reply: tx.clone() };
            if let Err(mpsc::SendError(job)) = pool.senders[n].lock().send(job) {
                // The read threads are gone (shutdown in progress): read here.
                for (i, k, va) in job.items {
                    values[i] = inner.read_at(k, va)?;
                }
                continue;
            }
            sent += 1;
        }
        drop(tx);
        for _ in 0..sent {
            let Ok(r) = rx.recv() else { break };
            for (i, v) in r? {
                values[i] = v;
            }
        }
    }
    let before = out.len();
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
    Ok(out.len() - before)
}
