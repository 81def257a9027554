//! Ordered scans: the engine's `scan` walked in batches of index keys, each batch's trees walked
//! under one epoch pin and their in-range pairs queued, at most [`CHUNK`] pairs per refill. A
//! refill that stops inside a prefix's tree resumes there after its last key (looking the
//! prefix up again), so the iterator never holds more than one chunk, however large a tree.

use std::collections::VecDeque;

use numakv_index::{Index, Result, MAX_KEY};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{PPtr, Pool};

use crate::layout::index_key;
use crate::tree::{self, Flow};

/// Index keys read from the engine at a time.
const BATCH: usize = 32;
/// Pairs queued per refill at most (one leaf more may finish the last tree's leaf).
const CHUNK: usize = 256;

/// The first key after every key starting with `prefix` (`None`: no such bound — the prefix is
/// empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|&b| b != 0xff)?;
    let mut end = prefix[..=last].to_vec();
    end[last] += 1;
    Some(end)
}

/// An ascending scan over `start ≤ key < end`; yields `(key, value)` or the error that ended it.
pub struct Scan<'a> {
    index: &'a dyn Index,
    pool: &'a Pool,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
    end_x: u64,
    /// Next index key to ask the engine for; `None` when the engine is exhausted.
    next_x: Option<u64>,
    /// Set when the last refill stopped inside the tree of `next_x`: its last key queued.
    resume: Option<Vec<u8>>,
    left: usize,
    queue: VecDeque<(Vec<u8>, Vec<u8>)>,
    batch: Vec<(u64, u64)>,
}

impl std::fmt::Debug for Scan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("engine", &self.index.name())
            .field("next_x", &self.next_x)
            .field("left", &self.left)
            .finish_non_exhaustive()
    }
}

impl<'a> Scan<'a> {
    pub(crate) fn new(
        index: &'a dyn Index,
        pool: &'a Pool,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Scan<'a> {
        let empty = end.is_some_and(|e| e <= start);
        Scan {
            index,
            pool,
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            end_x: end.map_or(MAX_KEY, index_key),
            next_x: (!empty && limit > 0).then(|| index_key(start)),
            resume: None,
            left: limit,
            queue: VecDeque::new(),
            batch: Vec::with_capacity(BATCH),
        }
    }

    /// Queues the in-range pairs of the tree at `root` from `from` on (after it when
    /// `exclusive`), up to the chunk. Returns what the scan does next.
    ///
    /// # Safety
    /// `root` was read from the index while pinned, and the caller stays pinned.
    unsafe fn take(&mut self, root: PPtr, from: &[u8], exclusive: bool) -> Result<Next> {
        let mut next = Next::Tree;
        // Keys below the scan's start are skipped by the walk itself (`from` is the start, or
        // a key queued after it).
        let (queue, left, end) = (&mut self.queue, &mut self.left, &self.end);
        let budget = queue.len() + CHUNK;
        // SAFETY: forwarded contract.
        let exhausted = unsafe {
            tree::walk(self.pool, root, from, exclusive, &mut |k, v| {
                if end.as_deref().is_some_and(|e| k >= e) || *left == 0 {
                    next = Next::Done;
                    return Ok(Flow::Stop);
                }
                queue.push_back((k.to_vec(), v.to_vec()));
                *left -= 1;
                if *left == 0 {
                    next = Next::Done;
                    return Ok(Flow::Stop);
                }
                if queue.len() >= budget {
                    next = Next::Resume;
                    return Ok(Flow::Stop);
                }
                Ok(Flow::Continue)
            })?
        };
        Ok(if exhausted { Next::Tree } else { next })
    }

    /// Reads the next chunk into the queue.
    fn refill(&mut self) -> Result<()> {
        let Some(from) = self.next_x else { return Ok(()) };
        // Pinned before the engine read: the nodes read stay allocated until we have copied
        // their pairs out, even if writers replace them meanwhile.
        let _guard = epoch::pin();
        let after_from = from.checked_add(1).filter(|&n| n <= MAX_KEY && n <= self.end_x);
        if let Some(after) = self.resume.take() {
            // Continue inside the tree of `from` (re-read: it may have changed since).
            let next = match self.index.get(from)? {
                // SAFETY: `p` was read from the index while pinned.
                Some(p) => unsafe { self.take(PPtr::from_raw(p), &after, true)? },
                None => Next::Tree,
            };
            match next {
                Next::Tree => self.next_x = after_from,
                Next::Resume => self.resume = self.queue.back().map(|(k, _)| k.clone()),
                Next::Done => self.next_x = None,
            }
            return Ok(());
        }
        self.batch.clear();
        self.index.scan(from, BATCH, &mut self.batch)?;
        let full = self.batch.len() == BATCH;
        let batch = std::mem::take(&mut self.batch);
        self.next_x = None;
        let start = std::mem::take(&mut self.start);
        let mut result = Ok(());
        for &(x, p) in &batch {
            if x > self.end_x || self.left == 0 {
                self.next_x = None;
                break;
            }
            // SAFETY: `p` was read from the index while pinned.
            match unsafe { self.take(PPtr::from_raw(p), &start, false) } {
                Ok(Next::Tree) => {
                    // The engine's next batch starts after the last index key taken.
                    self.next_x = full
                        .then(|| x.checked_add(1).filter(|&n| n <= MAX_KEY && n <= self.end_x))
                        .flatten();
                }
                Ok(Next::Resume) => {
                    self.next_x = Some(x);
                    self.resume = self.queue.back().map(|(k, _)| k.clone());
                    break;
                }
                Ok(Next::Done) => {
                    self.next_x = None;
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.start = start;
        self.batch = batch;
        if self.left == 0 {
            self.next_x = None;
        }
        result
    }
}

/// What a scan does after a tree.
enum Next {
    /// The tree ended: go on with the next index key.
    Tree,
    /// The chunk is full inside the tree: resume after the last queued key.
    Resume,
    /// The range or the limit ended.
    Done,
}

impl Iterator for Scan<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.queue.is_empty() && self.next_x.is_some() {
            if let Err(e) = self.refill() {
                self.next_x = None;
                self.queue.clear();
                return Some(Err(e));
            }
        }
        self.queue.pop_front().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"user:"), Some(b"user;".to_vec()));
        assert_eq!(prefix_end(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
