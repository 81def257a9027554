//! Accessor types: the only way engines touch persistent memory.
//!
//! PM structures are `#[repr(C)]` structs of these types, resolved in place from a pool
//! ([`crate::Pool::get`]). Each access reports its address range to [`crate::account`], which is how
//! "PM lines read/written per operation" and local/remote shares are measured. All word types are
//! atomics, so lock-free readers racing with writers (FAST&FAIR, NBTree, ...) are data-race free;
//! `Relaxed` atomics compile to plain moves on x86-64. The accounting hook in front of each access
//! costs a flag check while accounting is switched off at run time, and nothing when the
//! `accounting` cargo feature is off (see [`crate::account`]).
//!
//! Writing an accessor does not make it durable: call [`crate::Pool::persist`] (ADR) — or rely on
//! eADR — as the engine's protocol requires.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::account::{record_read, record_write};

/// Types that may be placed in and resolved from persistent memory.
///
/// # Safety
/// Implementors must be valid for every bit pattern (a crash or a corrupted file can leave any
/// bytes behind), contain no references, heap pointers or `Drop` glue, and allow shared mutation
/// only through interior mutability (atomics or [`PmBytes`]'s unsafe methods).
pub unsafe trait PmType: Sized {}

macro_rules! pm_atomic {
    ($(#[$doc:meta])* $name:ident, $atomic:ty, $int:ty) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        #[repr(transparent)]
        pub struct $name($atomic);

        // SAFETY: a transparent atomic integer: every bit pattern is valid, no Drop, mutation only
        // through atomic operations.
        unsafe impl PmType for $name {}

        impl $name {
            /// A value for building a layout in DRAM (e.g. a shadow copy); PM objects are resolved
            /// from a pool instead.
            pub const fn new(v: $int) -> Self {
                Self(<$atomic>::new(v))
            }

            #[inline(always)]
            fn addr(&self) -> usize {
                self as *const Self as usize
            }

            /// Atomic load; accounted as a read of this word's line.
            #[inline(always)]
            pub fn load(&self, order: Ordering) -> $int {
                record_read(self.addr(), std::mem::size_of::<$int>());
                self.0.load(order)
            }

            /// Atomic store; accounted as a write of this word's line.
            #[inline(always)]
            pub fn store(&self, v: $int, order: Ordering) {
                record_write(self.addr(), std::mem::size_of::<$int>());
                self.0.store(v, order)
            }

            /// Atomic swap; accounted as a read and a write.
            #[inline(always)]
            pub fn swap(&self, v: $int, order: Ordering) -> $int {
                self.record_rmw();
                self.0.swap(v, order)
            }

            /// Compare-and-swap; accounted as a read and a write (the line is fetched exclusive
            /// whether or not the comparison succeeds).
            #[inline(always)]
            pub fn compare_exchange(
                &self,
                current: $int,
                new: $int,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$int, $int> {
                self.record_rmw();
                self.0.compare_exchange(current, new, success, failure)
            }

            /// Atomic add returning the previous value; accounted as a read and a write.
            #[inline(always)]
            pub fn fetch_add(&self, v: $int, order: Ordering) -> $int {
                self.record_rmw();
                self.0.fetch_add(v, order)
            }

            /// Atomic subtract returning the previous value; accounted as a read and a write.
            #[inline(always)]
            pub fn fetch_sub(&self, v: $int, order: Ordering) -> $int {
                self.record_rmw();
                self.0.fetch_sub(v, order)
            }

            /// Atomic OR returning the previous value; accounted as a read and a write.
            #[inline(always)]
            pub fn fetch_or(&self, v: $int, order: Ordering) -> $int {
                self.record_rmw();
                self.0.fetch_or(v, order)
            }

            /// Atomic AND returning the previous value; accounted as a read and a write.
            #[inline(always)]
            pub fn fetch_and(&self, v: $int, order: Ordering) -> $int {
                self.record_rmw();
                self.0.fetch_and(v, order)
            }

            /// Load that is not accounted: for recovery scans and consistency checks whose PM
            /// traffic is not part of any measured operation.
            #[inline(always)]
            pub fn load_unaccounted(&self, order: Ordering) -> $int {
                self.0.load(order)
            }

            #[inline(always)]
            fn record_rmw(&self) {
                record_read(self.addr(), std::mem::size_of::<$int>());
                record_write(self.addr(), std::mem::size_of::<$int>());
            }
        }
    };
}

pm_atomic!(
    /// An 8-byte word in PM: the unit of failure atomicity (an aligned 8-byte store is never torn).
    PmU64, AtomicU64, u64
);
pm_atomic!(
    /// A 4-byte word in PM.
    PmU32, AtomicU32, u32
);
pm_atomic!(
    /// A 2-byte word in PM.
    PmU16, AtomicU16, u16
);
pm_atomic!(
    /// A byte in PM.
    PmU8, AtomicU8, u8
);

// SAFETY: arrays of PM types are PM types (same argument element-wise, no padding between
// elements of a Sized type).
unsafe impl<T: PmType, const N: usize> PmType for [T; N] {}

/// A range of PM bytes without atomicity, for bulk payloads (variable-length values, log entries,
/// node images) whose concurrency is governed by the engine's protocol (written before being
/// published, immutable afterwards, or under a lock).
#[repr(transparent)]
pub struct PmBytes([UnsafeCell<u8>]);

impl std::fmt::Debug for PmBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PmBytes({} bytes at {:p})", self.len(), self.0.as_ptr())
    }
}

// SAFETY: all mutation goes through `write`/`fill`, whose contracts forbid concurrent conflicting
// access; sharing the handle itself is harmless.
unsafe impl Sync for PmBytes {}

impl PmBytes {
    /// Wraps `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay mapped for `'a` and be accessed by others only through
    /// accessor types or other `PmBytes` views under the same protocol.
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut u8, len: usize) -> &'a PmBytes {
        let slice = std::ptr::slice_from_raw_parts_mut(ptr.cast::<UnsafeCell<u8>>(), len);
        // SAFETY: `PmBytes` is a transparent wrapper of `[UnsafeCell<u8>]`, which has the layout
        // of `[u8]`; the caller guarantees the range is mapped for 'a.
        unsafe { &*(slice as *const PmBytes) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Start address (for flushing with [`crate::Pool::flush`]).
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr().cast()
    }

    fn check(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        (end <= self.len()).then(|| self.0.as_ptr().cast::<u8>().wrapping_add(offset).cast_mut())
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`; `false` (and nothing copied) when
    /// the range exceeds this view.
    ///
    /// # Safety
    /// No thread may write the source range concurrently (non-atomic read).
    pub unsafe fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(src) = self.check(offset, dst.len()) else { return false };
        record_read(src as usize, dst.len());
        // SAFETY: `check` keeps the range inside this mapped view; the caller excludes
        // concurrent writers; `dst` is a distinct DRAM buffer.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Copies `src` into this view at `offset`; `false` (and nothing written) when out of range.
    ///
    /// # Safety
    /// No thread may read or write the destination range concurrently (non-atomic write).
    pub unsafe fn write(&self, offset: usize, src: &[u8]) -> bool {
        let Some(dst) = self.check(offset, src.len()) else { return false };
        record_write(dst as usize, src.len());
        // SAFETY: as in `read`, with the caller excluding concurrent readers and writers.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        true
    }

    /// Sets `len` bytes at `offset` to `byte`; `false` when out of range.
    ///
    /// # Safety
    /// As for [`PmBytes::write`].
    pub unsafe fn fill(&self, offset: usize, len: usize, byte: u8) -> bool {
        let Some(dst) = self.check(offset, len) else { return false };
        record_write(dst as usize, len);
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(dst, byte, len) };
        true
    }
}
