//! F3-tree engine (papers/f3tree.txt).
//!
//! Placeholder crate: the workspace layout of DESIGN.md §1 exists from the start so that the
//! dependency direction is fixed early. Its contents arrive with issue 7.
