//! NStore engine (papers/nstore.txt).
//!
//! Placeholder crate: the workspace layout of DESIGN.md §1 exists from the start so that the
//! dependency direction is fixed early. Its contents arrive with issue 9.
