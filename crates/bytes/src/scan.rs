//! Ordered scans: the engine's `scan` walked in batches of index keys, each batch's buckets read
//! under one epoch pin and their in-range pairs queued; the iterator never holds more than one
//! batch.

use std::collections::VecDeque;

use numakv_index::{Index, Result, MAX_KEY};
use numakv_pmem::alloc::epoch;
use numakv_pmem::{PPtr, Pool};

use crate::layout::{index_key, Record};

/// Index keys read from the engine at a time.
const BATCH: usize = 32;

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
            left: limit,
            queue: VecDeque::new(),
            batch: Vec::with_capacity(BATCH),
        }
    }

    fn in_range(&self, k: &[u8]) -> bool {
        k >= self.start.as_slice() && self.end.as_deref().map_or(true, |e| k < e)
    }

    /// Reads the next batch of buckets into the queue.
    fn refill(&mut self) -> Result<()> {
        let Some(from) = self.next_x else { return Ok(()) };
        self.batch.clear();
        // Pinned before the engine read: the buckets of this batch stay allocated until we have
        // copied them out, even if writers replace them meanwhile.
        let _guard = epoch::pin();
        self.index.scan(from, BATCH, &mut self.batch)?;
        if self.batch.len() < BATCH {
            self.next_x = None;
        }
        let batch = std::mem::take(&mut self.batch);
        for &(x, p) in &batch {
            if x > self.end_x || self.left == 0 {
                self.next_x = None;
                break;
            }
            self.next_x = self.next_x.and(x.checked_add(1).filter(|&n| n <= MAX_KEY));
            // SAFETY: `p` was read from the index while pinned (Record::at's contract).
            let rec = unsafe { Record::at(self.pool, PPtr::from_raw(p))? };
            for e in rec.entries() {
                let (k, v) = e?;
                if self.left == 0 {
                    break;
                }
                if self.in_range(k) {
                    self.queue.push_back((k.to_vec(), v.to_vec()));
                    self.left -= 1;
                } else if self.end.as_deref().is_some_and(|e| k >= e) {
                    break;
                }
            }
        }
        self.batch = batch;
        if self.left == 0 {
            self.next_x = None;
        }
        Ok(())
    }
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
