//! Position-independent persistent pointers.
//!
//! A [`PPtr`] is one 64-bit word: the NUMA node (pool file) in the top [`NODE_BITS`] bits and the
//! byte offset inside that node's file in the rest. Offset 0 of every node file is its header, so
//! no object ever lives there and the all-zero word serves as null. Because a pointer names a node
//! and an offset, never an address, pools can be mapped anywhere and the pointer survives restarts.

use std::fmt;

/// Bits of a [`PPtr`] that hold the node id.
pub const NODE_BITS: u32 = 8;
/// Bits of a [`PPtr`] that hold the offset (64 PiB per node).
pub const OFFSET_BITS: u32 = 64 - NODE_BITS;
/// Largest node count a pool can have.
pub const MAX_NODES: usize = 1 << NODE_BITS;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// A persistent pointer: `node << 56 | offset`. `PPtr::NULL` is 0.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct PPtr(u64);

impl PPtr {
    /// The null pointer.
    pub const NULL: PPtr = PPtr(0);

    /// A pointer to `offset` in node `node`'s file. Returns `None` when either part does not fit.
    #[inline]
    pub const fn new(node: usize, offset: u64) -> Option<PPtr> {
        if node >= MAX_NODES || offset > OFFSET_MASK {
            return None;
        }
        Some(PPtr(((node as u64) << OFFSET_BITS) | offset))
    }

    /// Reinterprets a raw word read from PM. Any word is a syntactically valid pointer; whether it
    /// points into a pool is checked when it is resolved.
    #[inline]
    pub const fn from_raw(raw: u64) -> PPtr {
        PPtr(raw)
    }

    /// The raw word, for storing in PM.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// True for the null pointer.
    #[inline]
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The node (pool file) the pointer refers to.
    #[inline]
    pub const fn node(self) -> usize {
        (self.0 >> OFFSET_BITS) as usize
    }

    /// The byte offset inside the node's file.
    #[inline]
    pub const fn offset(self) -> u64 {
        self.0 & OFFSET_MASK
    }

    /// The pointer `bytes` further on in the same node. `None` on overflow of the offset field.
    #[inline]
    pub const fn add(self, bytes: u64) -> Option<PPtr> {
        match self.offset().checked_add(bytes) {
            Some(off) => PPtr::new(self.node(), off),
            None => None,
        }
    }
}

impl fmt::Debug for PPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for PPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_null() {
            f.write_str("PPtr(null)")
        } else {
            write!(f, "PPtr(node {}, {:#x})", self.node(), self.offset())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn null_is_zero_and_default() {
        assert!(PPtr::NULL.is_null());
        assert_eq!(PPtr::default(), PPtr::NULL);
        assert_eq!(PPtr::new(0, 0), Some(PPtr::NULL));
        assert!(!PPtr::new(1, 0).unwrap().is_null());
    }

    #[test]
    fn out_of_range_parts_are_rejected() {
        assert_eq!(PPtr::new(MAX_NODES, 0), None);
        assert_eq!(PPtr::new(0, OFFSET_MASK + 1), None);
        assert_eq!(PPtr::new(3, OFFSET_MASK).unwrap().add(1), None);
    }

    proptest! {
        #[test]
        fn round_trips(node in 0usize..MAX_NODES, offset in 0u64..=OFFSET_MASK) {
            let p = PPtr::new(node, offset).unwrap();
            prop_assert_eq!(p.node(), node);
            prop_assert_eq!(p.offset(), offset);
            prop_assert_eq!(PPtr::from_raw(p.raw()), p);
        }
    }
}
