//! Allocators built on the page heap.
