//! Range queries: the global tree's entries merged with the keys pending in PTFOs (the paper
//! leaves range queries open, §4.3; we answer them).
//!
//! The pending keys `≥ start` are snapshotted shard by shard (each value was current when its
//! shard was visited); the tree is scanned in chunks from `start`; a pending key overrides the
//! tree's entry of the same key (a pending delete hides it). Per the `Index::scan` contract this
//! is not a snapshot across keys, but every pair returned was the key's value at some moment of
//! the scan: a key pending at its shard's visit returns that value; a key not pending then had
//! its logical value in the tree from then on until a later write, and the tree only changes a
//! key to the value of that key's latest write. Keys strictly ascend (the merge takes each key
//! once), and a key present for the whole scan is found in the snapshot or the tree.
//!
//! Cost: the snapshot visits every pending key (the table is hashed, not ordered), O(M).

use numakv_index::{Index, Result};

use crate::Inner;

/// Tree entries fetched per chunk.
const CHUNK: usize = 256;

pub(crate) fn scan(
    inner: &Inner,
    start: u64,
    max: usize,
    out: &mut Vec<(u64, u64)>,
) -> Result<usize> {
    if max == 0 || start == u64::MAX {
        return Ok(0);
    }
    let start = start.max(1);
    let pending = inner.table.snapshot_from(start);
    let mut pi = 0;
    let mut n = 0;
    let mut cursor = start;
    let mut buf = Vec::with_capacity(CHUNK);
    let mut emit = |k: u64, v: Option<u64>, n: &mut usize| {
        if let Some(v) = v {
            out.push((k, v));
            *n += 1;
        }
    };
    loop {
        buf.clear();
        let want = CHUNK.max(max.saturating_sub(n).min(4 * CHUNK));
        let got = inner.tree.scan(cursor, want, &mut buf)?;
        for &(k, v) in &buf {
            while pi < pending.len() && pending[pi].0 < k {
                emit(pending[pi].0, pending[pi].1, &mut n);
                pi += 1;
                if n == max {
                    return Ok(n);
                }
            }
            if pi < pending.len() && pending[pi].0 == k {
                emit(k, pending[pi].1, &mut n);
                pi += 1;
            } else {
                emit(k, Some(v), &mut n);
            }
            if n == max {
                return Ok(n);
            }
        }
        let last = buf.last().map(|&(k, _)| k);
        match last {
            Some(k) if got == want && k < numakv_index::MAX_KEY => cursor = k + 1,
            _ => break,
        }
    }
    while pi < pending.len() && n < max {
        emit(pending[pi].0, pending[pi].1, &mut n);
        pi += 1;
    }
    Ok(n)
}
