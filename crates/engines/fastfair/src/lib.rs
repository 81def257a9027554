//! FAST&FAIR B+-tree engine (FAST'18 baseline).
//!
//! Placeholder crate: the workspace layout of DESIGN.md §1 exists from the start so that the
//! dependency direction is fixed early. Its contents arrive with issue 3.
