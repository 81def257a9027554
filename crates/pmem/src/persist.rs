//! Persistence primitives: the persistence mode, the cache-line arithmetic, and the flush and fence
//! instructions chosen at run time.
//!
//! Engines never call these directly: they call [`Pool::flush`](crate::Pool::flush),
//! [`Pool::fence`](crate::Pool::fence) and [`Pool::persist`](crate::Pool::persist), which add crash
//! simulation and accounting on top.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// Size of a CPU cache line, the unit of persistence and of access accounting.
pub const LINE: usize = 64;

/// When a store to PM becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PersistMode {
    /// Asynchronous DRAM Refresh: only the memory controller's queues are in the persistence
    /// domain, so a store is durable once its line has been flushed *and* a fence has completed.
    #[default]
    Adr,
    /// Extended ADR: the CPU caches are in the persistence domain; every globally visible store
    /// is durable and flushes are unnecessary (they are skipped).
    Eadr,
}

impl PersistMode {
    /// The code stored in the pool header.
    pub(crate) const fn code(self) -> u32 {
        match self {
            PersistMode::Adr => 1,
            PersistMode::Eadr => 2,
        }
    }

    pub(crate) const fn from_code(code: u32) -> Option<PersistMode> {
        match code {
            1 => Some(PersistMode::Adr),
            2 => Some(PersistMode::Eadr),
            _ => None,
        }
    }
}

impl fmt::Display for PersistMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PersistMode::Adr => "adr",
            PersistMode::Eadr => "eadr",
        })
    }
}

impl FromStr for PersistMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "adr" => Ok(PersistMode::Adr),
            "eadr" => Ok(PersistMode::Eadr),
            other => Err(format!("unknown persistence mode {other:?} (choices: adr, eadr)")),
        }
    }
}

/// The start address of every cache line that `[addr, addr + len)` touches, in ascending order.
/// An empty range touches no line.
#[inline]
pub fn lines(addr: usize, len: usize) -> impl Iterator<Item = usize> {
    let first = addr & !(LINE - 1);
    let count = line_count(addr, len);
    (0..count).map(move |i| first + i * LINE)
}

/// How many cache lines `[addr, addr + len)` touches.
#[inline]
pub const fn line_count(addr: usize, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let first = addr / LINE;
    let last = (addr + (len - 1)) / LINE;
    last - first + 1
}

/// The cache-line flush instruction this CPU offers, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushInstr {
    /// `clwb`: writes the line back and may keep it cached (Skylake-SP and later).
    Clwb,
    /// `clflushopt`: writes back and invalidates, weakly ordered.
    Clflushopt,
    /// `clflush`: writes back and invalidates, serialising.
    Clflush,
    /// No flush instruction (not x86-64): durability of mapped files relies on `msync` at close.
    None,
}

static INSTR: AtomicU8 = AtomicU8::new(0);

impl FlushInstr {
    /// The instruction in use, detected once with CPUID.
    pub fn detected() -> FlushInstr {
        match INSTR.load(Ordering::Relaxed) {
            1 => FlushInstr::Clwb,
            2 => FlushInstr::Clflushopt,
            3 => FlushInstr::Clflush,
            4 => FlushInstr::None,
            _ => {
                let instr = Self::detect();
                // ORDERING: Relaxed; the value is a pure function of the CPU, so a race only
                // repeats the detection.
                INSTR.store(instr.code(), Ordering::Relaxed);
                instr
            }
        }
    }

    const fn code(self) -> u8 {
        match self {
            FlushInstr::Clwb => 1,
            FlushInstr::Clflushopt => 2,
            FlushInstr::Clflush => 3,
            FlushInstr::None => 4,
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> FlushInstr {
        // CPUID leaf 7, sub-leaf 0, EBX: bit 24 = CLWB, bit 23 = CLFLUSHOPT (Intel SDM vol. 2A).
        // std's feature detection does not know these two, so ask CPUID directly.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on every x86-64 CPU and leaf 7 is defined (returns zeros
        // on CPUs that lack it, which selects clflush).
        let ebx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.ebx;
        if ebx & (1 << 24) != 0 {
            FlushInstr::Clwb
        } else if ebx & (1 << 23) != 0 {
            FlushInstr::Clflushopt
        } else {
            FlushInstr::Clflush
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> FlushInstr {
        FlushInstr::None
    }
}

/// Writes every cache line of `[addr, addr + len)` back towards memory with the detected
/// instruction. Ordering against later stores needs [`fence_instr`].
///
/// # Safety
/// The range must lie inside one live mapping of this process.
#[inline]
pub unsafe fn flush_instr(addr: *const u8, len: usize) {
    let instr = FlushInstr::detected();
    for line in lines(addr as usize, len) {
        // SAFETY: the caller guarantees the range is mapped; every line start computed by
        // `lines` lies within (or at the aligned start of) the range's first line.
        unsafe { flush_line(instr, line as *const u8) };
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn flush_line(instr: FlushInstr, p: *const u8) {
    // SAFETY: (all arms) the caller guarantees `p` is inside a live mapping; cache-line flush
    // instructions neither read nor write architectural memory state, and the matching CPUID bit
    // was checked by `FlushInstr::detect`.
    unsafe {
        match instr {
            FlushInstr::Clwb => {
                std::arch::asm!("clwb [{}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Clflushopt => {
                std::arch::asm!("clflushopt [{}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Clflush => std::arch::x86_64::_mm_clflush(p),
            FlushInstr::None => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn flush_line(_instr: FlushInstr, _p: *const u8) {}

/// A store fence: earlier flushes complete (reach the persistence domain) before later stores.
#[inline]
pub fn fence_instr() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no memory operands and is available on every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn aligned_and_unaligned_examples() {
        assert_eq!(lines(0, 0).count(), 0);
        assert_eq!(lines(0, 64).collect::<Vec<_>>(), vec![0]);
        assert_eq!(lines(0, 65).collect::<Vec<_>>(), vec![0, 64]);
        assert_eq!(lines(63, 2).collect::<Vec<_>>(), vec![0, 64]);
        assert_eq!(lines(100, 8).collect::<Vec<_>>(), vec![64]);
        assert_eq!(lines(120, 8).collect::<Vec<_>>(), vec![64]);
        assert_eq!(lines(121, 8).collect::<Vec<_>>(), vec![64, 128]);
    }

    proptest! {
        /// The lines produced are exactly the lines that contain some byte of the range.
        #[test]
        fn lines_cover_exactly_the_range(addr in 0usize..1 << 40, len in 0usize..1000) {
            let got: Vec<usize> = lines(addr, len).collect();
            prop_assert_eq!(got.len(), line_count(addr, len));
            let mut want: Vec<usize> = (addr..addr + len).map(|b| b & !(LINE - 1)).collect();
            want.dedup();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn flushing_a_real_buffer_is_harmless() {
        let buf = vec![7u8; 1000];
        // SAFETY: the range lies inside `buf`, which lives across the call.
        unsafe { flush_instr(buf.as_ptr().wrapping_add(3), 900) };
        fence_instr();
        assert!(buf.iter().all(|&b| b == 7));
        assert_ne!(FlushInstr::detected(), FlushInstr::None);
    }

    #[test]
    fn mode_parses() {
        assert_eq!("ADR".parse::<PersistMode>(), Ok(PersistMode::Adr));
        assert_eq!("eadr".parse::<PersistMode>(), Ok(PersistMode::Eadr));
        assert!("nvdimm".parse::<PersistMode>().unwrap_err().contains("choices"));
        for m in [PersistMode::Adr, PersistMode::Eadr] {
            assert_eq!(PersistMode::from_code(m.code()), Some(m));
        }
        assert_eq!(PersistMode::from_code(0), None);
    }
}
