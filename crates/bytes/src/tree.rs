//! The tree of one index key: the keys that share an 8-byte prefix live in a small copy-on-write
//! B+-tree whose root the engine maps the prefix to. A prefix with few keys is a single leaf (a
//! bucket record, the common case); once a leaf outgrows [`TreeLimits`] it splits, and the
//! prefix's root becomes an inner node. docs/design.md, "Byte-string layer".
//!
//! Every node is written whole and persisted before anything points at it. A write publishes
//! with **one** 8-byte store: an inner node's child slot (a leaf rewritten in place of the old
//! one) or the engine's `upsert` of the prefix (a new root). A split or a removal copies the
//! path above the leaf up to the first node that does not change shape, and links the copy there.
//! Writers of one prefix are serialised by its stripe lock, so nothing else changes the tree
//! while a writer builds; readers are lock-free (epoch-pinned) and see the old or the new node.

use numakv_index::{Error, Result};
use numakv_pmem::{PPtr, Pool};

use crate::cell::CELL_MAX_VALUE;
use crate::layout::{
    entry_bytes, inner_bytes, inner_fixed_bytes, separator, Inner, Node, Record, HEADER_BYTES,
    LAYER,
};

/// Deepest tree a reader follows before calling the store corrupted (a cycle or garbage): a
/// tree of fanout ≥ 2 over keys of ≤ 1 KiB never comes close.
pub(crate) const MAX_DEPTH: usize = 64;

/// When a prefix's nodes split. Any tree shape is valid whatever the limits, so they are not
/// persisted: a store may be reopened with other limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeLimits {
    /// Most entries in a leaf (≥ 1).
    pub leaf_entries: usize,
    /// Most bytes in a leaf, header included (a leaf of one larger entry stays whole).
    pub leaf_bytes: usize,
    /// Most children of an inner node (≥ 2).
    pub inner_children: usize,
    /// Most bytes in an inner node (an inner node of two children stays whole).
    pub inner_bytes: usize,
    /// Longest value a prefix's root of one pair keeps in a *cell* (rewritten in place with
    /// one fence, two value slots of the value's size; at most [`CELL_MAX_VALUE`]); `0`: no
    /// cells, every write of such a pair copies a record (half the space for small values,
    /// a second fence and a deferred free per write).
    pub cell_value: usize,
}

impl Default for TreeLimits {
    /// 16 entries or 1 KiB per leaf (a rewrite copies at most ~16 lines of small pairs), 64
    /// children or 4 KiB per inner node (three levels hold ~2 M keys of a prefix), cells for
    /// values up to 1 KiB.
    fn default() -> TreeLimits {
        TreeLimits {
            leaf_entries: 16,
            leaf_bytes: 1024,
            inner_children: 64,
            inner_bytes: 4096,
            cell_value: CELL_MAX_VALUE,
        }
    }
}

impl TreeLimits {
    /// Refuses limits under which a node could not split.
    pub fn validate(&self) -> Result<()> {
        if self.leaf_entries == 0 || self.inner_children < 2 {
            return Err(Error::InvalidOptions(format!(
                "bytes tree limits: leaf_entries must be ≥ 1 and inner_children ≥ 2 (got {} and {})",
                self.leaf_entries, self.inner_children
            )));
        }
        if self.cell_value > CELL_MAX_VALUE {
            return Err(Error::InvalidOptions(format!(
                "bytes tree limits: cell_value must be ≤ {CELL_MAX_VALUE} (got {})",
                self.cell_value
            )));
        }
        Ok(())
    }

    /// Whether a root of the one pair `(_, value)` is written as a cell.
    pub(crate) fn cell_for(&self, value: &[u8]) -> bool {
        value.len() <= self.cell_value.min(CELL_MAX_VALUE) && self.cell_value > 0
    }

    pub(crate) fn leaf_fits(&self, count: usize, len: usize) -> bool {
        count <= self.leaf_entries && len <= self.leaf_bytes
    }
}

fn corrupted(what: impl std::fmt::Display) -> Error {
    Error::corrupted(LAYER, what.to_string())
}

/// The value of `key` in the tree at `root`, copied into `out`; `false` when absent.
///
/// # Safety
/// As for [`Node::at`]: `root` was read from the index while pinned, or under the stripe lock.
pub(crate) unsafe fn lookup(
    pool: &Pool,
    root: PPtr,
    key: &[u8],
    out: &mut Vec<u8>,
) -> Result<bool> {
    let mut p = root;
    for _ in 0..MAX_DEPTH {
        // SAFETY: forwarded contract; a child read from a reachable node is reachable.
        match unsafe { Node::at(pool, p)? } {
            Node::Leaf(r) => {
                return Ok(r
                    .find(key)?
                    .map(|v| {
                        out.clear();
                        out.extend_from_slice(v);
                    })
                    .is_some())
            }
            Node::Cell(c) => {
                if c.key() != key {
                    return Ok(false);
                }
                c.value_into(out)?;
                return Ok(true);
            }
            Node::Inner(n) => p = n.child(n.find_child(key)?)?,
        }
    }
    Err(corrupted(format_args!("tree at {root} deeper than {MAX_DEPTH}")))
}

/// A walk's visitor: gets each pair (borrowed for the call only) and says what comes next.
pub(crate) type Visit<'v> = dyn FnMut(&[u8], &[u8]) -> Result<Flow> + 'v;

/// What a walk's visitor wants next.
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// Visits the pairs of the tree at `root` whose key is ≥ `from` (> `from` when `exclusive`),
/// ascending, until `visit` stops. Returns `true` when it ran off the end of the tree.
///
/// # Safety
/// As for [`lookup`], and the caller stays pinned during the walk.
pub(crate) unsafe fn walk<'g>(
    pool: &'g Pool,
    root: PPtr,
    from: &[u8],
    exclusive: bool,
    visit: &mut Visit<'_>,
) -> Result<bool> {
    let mut value = Vec::new();
    let mut stack: Vec<(Inner<'g>, usize)> = Vec::new();
    let mut p = root;
    // Until the first leaf, descend towards `from`; afterwards every key is past it.
    let mut seeking = true;
    loop {
        if stack.len() > MAX_DEPTH {
            return Err(corrupted(format_args!("tree at {root} deeper than {MAX_DEPTH}")));
        }
        // SAFETY: forwarded contract; a child read from a reachable node is reachable.
        match unsafe { Node::at(pool, p)? } {
            Node::Inner(n) => {
                let i = if seeking { n.find_child(from)? } else { 0 };
                p = n.child(i)?;
                stack.push((n, i));
            }
            Node::Cell(c) => {
                // A root holding one pair, its value copied under the version's sequence lock.
                let k = c.key();
                if !stack.is_empty() {
                    return Err(corrupted(format_args!("tree at {root}: cell {p} below a node")));
                }
                if !(seeking && (k < from || (exclusive && k == from))) {
                    c.value_into(&mut value)?;
                    if let Flow::Stop = visit(k, &value)? {
                        return Ok(false);
                    }
                }
                return Ok(true);
            }
            Node::Leaf(r) => {
                for e in r.entries() {
                    let (k, v) = e?;
                    if seeking && (k < from || (exclusive && k == from)) {
                        continue;
                    }
                    if let Flow::Stop = visit(k, v)? {
                        return Ok(false);
                    }
                }
                seeking = false;
                // A scan has taken this leaf's pairs and is about to follow its parent (maybe
                // retired by now) to the next child.
                numakv_pmem::pause_point!("bytes.walk.leaf_done");
                // The next leaf: the next child of the deepest node that has one.
                loop {
                    let Some((n, i)) = stack.pop() else { return Ok(true) };
                    if i + 1 < n.count() {
                        p = n.child(i + 1)?;
                        stack.push((n, i + 1));
                        break;
                    }
                }
            }
        }
    }
}

/// Every node of the tree at `root`, appended to `out` (recovery's reachability walk).
///
/// # Safety
/// As for [`lookup`]; in recovery nothing runs concurrently.
pub(crate) unsafe fn collect_nodes(pool: &Pool, root: PPtr, out: &mut Vec<PPtr>) -> Result<()> {
    let mut todo = vec![(root, 0usize)];
    while let Some((p, depth)) = todo.pop() {
        if depth > MAX_DEPTH {
            return Err(corrupted(format_args!("tree at {root} deeper than {MAX_DEPTH}")));
        }
        out.push(p);
        // SAFETY: forwarded contract.
        if let Node::Inner(n) = unsafe { Node::at(pool, p)? } {
            for i in 0..n.count() {
                todo.push((n.child(i)?, depth + 1));
            }
        }
    }
    Ok(())
}

/// A node [`check_tree`] has still to visit: where, its depth, and its range (lower bound
/// inclusive, upper bound exclusive).
type Pending = (PPtr, usize, Option<Vec<u8>>, Option<Vec<u8>>);

/// What [`check_tree`] found.
#[derive(Debug, Default)]
pub(crate) struct TreeShape {
    pub(crate) entries: u64,
    pub(crate) nodes: u64,
    pub(crate) leaves: u64,
    pub(crate) height: usize,
}

/// Checks the tree at `root`: every node well formed and non-empty, separators strictly
/// ascending inside the node's range, every leaf's keys strictly ascending inside its range
/// and accepted by `key_ok`, every leaf at the same depth.
///
/// # Safety
/// As for [`lookup`], with no concurrent writer.
pub(crate) unsafe fn check_tree(
    pool: &Pool,
    root: PPtr,
    key_ok: &dyn Fn(&[u8]) -> Result<()>,
) -> Result<TreeShape> {
    let mut shape = TreeShape::default();
    let mut leaf_depth: Option<usize> = None;
    // (node, depth, lower bound inclusive, upper bound exclusive)
    let mut todo: Vec<Pending> = vec![(root, 0, None, None)];
    while let Some((p, depth, lo, hi)) = todo.pop() {
        if depth > MAX_DEPTH {
            return Err(corrupted(format_args!("tree at {root} deeper than {MAX_DEPTH}")));
        }
        shape.nodes += 1;
        let in_range = |k: &[u8]| {
            lo.as_deref().map_or(true, |l| l <= k) && hi.as_deref().map_or(true, |h| k < h)
        };
        // SAFETY: forwarded contract.
        match unsafe { Node::at(pool, p)? } {
            Node::Cell(c) => {
                if depth > 0 {
                    return Err(corrupted(format_args!(
                        "tree at {root}: cell {p} at depth {depth} (cells are roots only)"
                    )));
                }
                c.check()?;
                key_ok(c.key())?;
                shape.leaves += 1;
                shape.entries += 1;
                leaf_depth = Some(0);
            }
            Node::Leaf(r) => {
                shape.leaves += 1;
                if *leaf_depth.get_or_insert(depth) != depth {
                    return Err(corrupted(format_args!(
                        "tree at {root}: leaf {p} at depth {depth}, another at {leaf_depth:?}"
                    )));
                }
                let mut prev: Option<&[u8]> = None;
                for e in r.entries() {
                    let (k, _) = e?;
                    key_ok(k)?;
                    if prev.is_some_and(|q| q >= k) || !in_range(k) {
                        return Err(corrupted(format_args!(
                            "tree at {root}: leaf {p}: key {k:x?} out of order or outside \
                             [{lo:x?}, {hi:x?})"
                        )));
                    }
                    prev = Some(k);
                    shape.entries += 1;
                }
            }
            Node::Inner(n) => {
                for i in 0..n.count() {
                    let sep = n.sep(i)?;
                    let next =
                        if i + 1 < n.count() { Some(n.sep(i + 1)?.to_vec()) } else { hi.clone() };
                    if i > 0 && (!in_range(sep) || next.as_deref().is_some_and(|h| sep >= h)) {
                        return Err(corrupted(format_args!(
                            "tree at {root}: inner {p}: separator {i} {sep:x?} out of order or \
                             outside [{lo:x?}, {hi:x?})"
                        )));
                    }
                    let low = if i == 0 { lo.clone() } else { Some(sep.to_vec()) };
                    todo.push((n.child(i)?, depth + 1, low, next));
                }
            }
        }
    }
    shape.height = leaf_depth.unwrap_or(0);
    Ok(shape)
}

/// Splits `0..n` items into consecutive ranges that each fit (`fits(range)`), halving: by count
/// when `by_count(range)`, else by bytes (`size(i)`). A single item that does not fit stays
/// alone.
pub(crate) fn pieces(
    n: usize,
    fits: &dyn Fn(std::ops::Range<usize>) -> bool,
    by_count: &dyn Fn(std::ops::Range<usize>) -> bool,
    size: &dyn Fn(usize) -> usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let mut todo: Vec<std::ops::Range<usize>> = Vec::with_capacity(8);
    todo.push(0..n);
    while let Some(r) = todo.pop() {
        if r.len() <= 1 || fits(r.clone()) {
            out.push(r);
            continue;
        }
        let mid = if by_count(r.clone()) {
            r.start + r.len() / 2
        } else {
            let total: usize = r.clone().map(size).sum();
            let mut acc = 0;
            let mut m = r.start;
            while m < r.end && acc + size(m) <= total / 2 {
                acc += size(m);
                m += 1;
            }
            m.clamp(r.start + 1, r.end - 1)
        };
        // Pushed right first so that the left half pops first: `out` stays ascending.
        todo.push(mid..r.end);
        todo.push(r.start..mid);
    }
    out
}

/// The leaves to write for `entries` (ascending), under `limits`: ranges of entries, and each
/// range's separator (none for the first).
pub(crate) fn leaf_pieces(
    entries: &[(&[u8], &[u8])],
    limits: &TreeLimits,
) -> Vec<(std::ops::Range<usize>, Vec<u8>)> {
    let size = |i: usize| entry_bytes(entries[i].0, entries[i].1);
    let bytes = |r: std::ops::Range<usize>| HEADER_BYTES + r.map(size).sum::<usize>();
    let ranges = pieces(
        entries.len(),
        &|r| limits.leaf_fits(r.len(), bytes(r)),
        &|r| r.len() > limits.leaf_entries,
        &size,
    );
    ranges
        .into_iter()
        .map(|r| {
            let sep = if r.start == 0 {
                Vec::new()
            } else {
                separator(entries[r.start - 1].0, entries[r.start].0)
            };
            (r, sep)
        })
        .collect()
}

/// The inner nodes to write over `children` under `limits`: ranges of children (each range's
/// first separator becomes the node's separator in its parent).
pub(crate) fn inner_pieces(
    children: &[(Vec<u8>, u64)],
    limits: &TreeLimits,
) -> Vec<std::ops::Range<usize>> {
    let size = |i: usize| children[i].0.len() + inner_fixed_bytes(1) - HEADER_BYTES;
    pieces(
        children.len(),
        &|r| r.len() <= limits.inner_children && inner_bytes(&children[r]) <= limits.inner_bytes,
        &|r| r.len() > limits.inner_children,
        &size,
    )
}

/// Emits the entries of `rec` with `key` set to `value` (or removed when `None`), ascending.
pub(crate) fn merged<'a>(
    rec: Option<&Record<'a>>,
    key: &'a [u8],
    value: Option<&'a [u8]>,
    emit: &mut dyn FnMut(&'a [u8], &'a [u8]),
) -> Result<()> {
    let mut placed = false;
    if let Some(r) = rec {
        for e in r.entries() {
            let (k, v) = e?;
            if !placed && k >= key {
                placed = true;
                if let Some(nv) = value {
                    emit(key, nv);
                }
                if k == key {
                    continue;
                }
            }
            emit(k, v);
        }
    }
    if !placed {
        if let Some(nv) = value {
            emit(key, nv);
        }
    }
    Ok(())
}

/// [`merged`] collected: the entries borrowed, for splitting them into leaves.
pub(crate) fn merged_entries<'a>(
    rec: Option<&Record<'a>>,
    key: &'a [u8],
    value: Option<&'a [u8]>,
) -> Result<Vec<(&'a [u8], &'a [u8])>> {
    let mut out = Vec::with_capacity(rec.map_or(0, |r| r.count() as usize) + 1);
    merged(rec, key, value, &mut |k, v| out.push((k, v)))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_are_shortest_between() {
        assert_eq!(separator(b"key:0001", b"key:0002"), b"key:0002");
        assert_eq!(separator(b"key:00019", b"key:0002"), b"key:0002");
        assert_eq!(separator(b"ab", b"abc"), b"abc");
        assert_eq!(separator(b"abc", b"abd"), b"abd");
        assert_eq!(separator(b"a", b"b\xff\xff"), b"b");
        for (l, r) in [(&b"x"[..], &b"y"[..]), (b"ab", b"ab\0"), (b"aa\xff", b"ab")] {
            let s = separator(l, r);
            assert!(l < &s[..] && &s[..] <= r, "{l:?} {s:?} {r:?}");
        }
    }

    #[test]
    fn pieces_fit_cover_and_ascend() {
        let sizes = [10usize, 10, 10, 500, 10, 10, 10, 10, 10, 10];
        let out = pieces(
            sizes.len(),
            &|r: std::ops::Range<usize>| r.len() <= 4 && r.map(|i| sizes[i]).sum::<usize>() <= 100,
            &|r| r.len() > 4,
            &|i| sizes[i],
        );
        let mut next = 0;
        for r in &out {
            assert_eq!(r.start, next);
            assert!(!r.is_empty());
            assert!(
                r.len() == 1 || (r.len() <= 4 && r.clone().map(|i| sizes[i]).sum::<usize>() <= 100)
            );
            next = r.end;
        }
        assert_eq!(next, sizes.len());
        assert!(out.contains(&(3..4)), "{out:?}");
    }
}
