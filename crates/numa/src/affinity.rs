//! Thread pinning (`sched_setaffinity`) and memory binding (`mbind`).
//!
//! Both are thin, checked wrappers: the point of the crate is that callers never build CPU or
//! node masks by hand, and that every failure comes back as a [`NumaError`] rather than an errno.

use std::io;
use std::mem::size_of;

use libc::c_ulong;

use crate::error::NumaError;
use crate::topology::{Topology, MAX_CPUS};

const BITS: usize = c_ulong::BITS as usize;

/// Restricts the calling thread to `cpu`, so its first-touch allocations and cache footprint stay
/// on that CPU's node.
///
/// # Errors
///
/// [`NumaError::CpuOutOfRange`] if `cpu >= MAX_CPUS`; [`NumaError::Syscall`] if the kernel
/// refuses (`EINVAL` for a CPU that does not exist or is outside the process's cpuset).
pub fn pin_current_thread(cpu: usize) -> Result<(), NumaError> {
    pin_current_thread_to(&[cpu])
}

/// Restricts the calling thread to the CPUs in `cpus` (e.g. all of one node's CPUs, so the
/// scheduler may still move it within the node).
///
/// # Errors
///
/// [`NumaError::CpuOutOfRange`] if a CPU is `>= MAX_CPUS`; [`NumaError::NoCpus`] if `cpus` is
/// empty; [`NumaError::Syscall`] if the kernel refuses (`EINVAL` when none of the CPUs exists
/// or is inside the process's cpuset).
pub fn pin_current_thread_to(cpus: &[usize]) -> Result<(), NumaError> {
    let Some(&top) = cpus.iter().max() else { return Err(NumaError::NoCpus) };
    if top >= MAX_CPUS {
        return Err(NumaError::CpuOutOfRange { cpu: top, limit: MAX_CPUS });
    }
    // At least a full cpu_set_t: old glibc versions reject smaller masks.
    let words = (top / BITS + 1).max(size_of::<libc::cpu_set_t>() / size_of::<c_ulong>());
    let mut mask: Vec<c_ulong> = vec![0; words];
    for &cpu in cpus {
        mask[cpu / BITS] |= 1 << (cpu % BITS);
    }
    // SAFETY: `mask` is a live, initialised buffer of exactly `words * size_of::<c_ulong>()`
    // bytes, the size passed; the kernel only reads it. A cpu_set_t is an array of c_ulong, so
    // the layout matches what the kernel expects.
    let rc = unsafe {
        libc::sched_setaffinity(
            0,
            words * size_of::<c_ulong>(),
            mask.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc != 0 {
        return Err(NumaError::Syscall {
            call: "sched_setaffinity",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The CPUs the calling thread may run on, sorted.
///
/// # Errors
///
/// [`NumaError::Syscall`] if `sched_getaffinity` fails for a reason other than a too-small mask
/// (which is retried with larger ones up to [`MAX_CPUS`] bits).
pub fn current_affinity() -> Result<Vec<usize>, NumaError> {
    let mut words = (size_of::<libc::cpu_set_t>() / size_of::<c_ulong>()).max(1);
    loop {
        let mut mask: Vec<c_ulong> = vec![0; words];
        // SAFETY: `mask` is a live, initialised, exclusively borrowed buffer of exactly
        // `words * size_of::<c_ulong>()` bytes, the size passed; the kernel writes at most that
        // many bytes. The c_ulong-array layout is that of cpu_set_t.
        let rc = unsafe {
            libc::sched_getaffinity(
                0,
                words * size_of::<c_ulong>(),
                mask.as_mut_ptr().cast::<libc::cpu_set_t>(),
            )
        };
        if rc == 0 {
            let mut cpus = Vec::new();
            for (w, &word) in mask.iter().enumerate() {
                let mut word = word;
                while word != 0 {
                    cpus.push(w * BITS + word.trailing_zeros() as usize);
                    word &= word - 1;
                }
            }
            return Ok(cpus);
        }
        let err = io::Error::last_os_error();
        // EINVAL: the kernel's mask is larger than ours.
        if err.raw_os_error() == Some(libc::EINVAL) && words * BITS < MAX_CPUS {
            words *= 2;
            continue;
        }
        return Err(NumaError::Syscall { call: "sched_getaffinity", source: err });
    }
}

/// What [`Topology::bind_memory`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindOutcome {
    /// The kernel now allocates the range's pages only on the requested node.
    Bound,
    /// The topology is emulated; nothing was asked of the kernel, pages go wherever it likes.
    Emulated,
}

/// The system page size, which `mbind` requires addresses to be aligned to.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

impl Topology {
    /// Makes the pages of `[addr, addr + len)` come from node `node` (a dense index), so a
    /// per-node structure really lives on its node.
    ///
    /// On a real topology this is `mbind(MPOL_BIND)` with the node's kernel id; it affects pages
    /// touched afterwards (already-faulted pages are not moved). On an emulated topology it is a
    /// no-op returning [`BindOutcome::Emulated`], so the same code runs everywhere.
    ///
    /// The function is safe: the kernel validates the range, and changing the placement policy of
    /// a mapping cannot invalidate memory. It only changes where future pages come from.
    ///
    /// # Errors
    ///
    /// [`NumaError::NodeOutOfRange`] if `node >= node_count()`; [`NumaError::Unaligned`] if
    /// `addr` is not page aligned (checked for emulated topologies too, so bugs show up there);
    /// [`NumaError::Syscall`] if the kernel refuses, e.g. `EFAULT` for an unmapped range.
    pub fn bind_memory(
        &self,
        addr: *mut u8,
        len: usize,
        node: usize,
    ) -> Result<BindOutcome, NumaError> {
        let os_id = self
            .os_node_id(node)
            .ok_or(NumaError::NodeOutOfRange { node, nodes: self.node_count() })?;
        let page = page_size();
        let at = addr as usize;
        if at % page != 0 {
            return Err(NumaError::Unaligned { addr: at, page });
        }
        if self.is_emulated() {
            return Ok(BindOutcome::Emulated);
        }
        let words = os_id / BITS + 1;
        let mut mask: Vec<c_ulong> = vec![0; words];
        mask[os_id / BITS] |= 1 << (os_id % BITS);
        // The kernel subtracts one from maxnode before using it as the mask's bit count.
        let maxnode = (words * BITS + 1) as c_ulong;
        // SAFETY: mbind only reads `words` c_ulongs from `mask` (maxnode - 1 bits), a live
        // buffer of that size. The range goes in as a plain integer and is never accessed from
        // user space; the kernel validates it and fails with EFAULT/EINVAL/ENOMEM instead of
        // faulting. Changing a mapping's NUMA policy never changes its contents or validity, so
        // no Rust reference can be invalidated.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                at,
                len,
                libc::MPOL_BIND,
                mask.as_ptr(),
                maxnode,
                0 as libc::c_uint,
            )
        };
        if rc != 0 {
            return Err(NumaError::Syscall { call: "mbind", source: io::Error::last_os_error() });
        }
        Ok(BindOutcome::Bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::SYSFS_NODE_DIR;
    use std::path::Path;
    use std::ptr;
    use std::thread;

    /// An anonymous private mapping, unmapped on drop.
    struct Map {
        ptr: *mut u8,
        len: usize,
    }

    impl Map {
        fn new(len: usize) -> Map {
            // SAFETY: a fresh anonymous private mapping at a kernel-chosen address; it aliases
            // nothing, and failure is checked below.
            let ptr = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
            Map { ptr: ptr.cast(), len }
        }
    }

    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: `ptr`/`len` are exactly what mmap returned and nothing borrows the region
            // past this point.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    #[test]
    fn pin_to_cpu0() {
        let cpus = thread::spawn(|| {
            pin_current_thread(0)?;
            current_affinity()
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(cpus, vec![0]);
        // The spawning thread was not affected.
        assert!(!current_affinity().unwrap().is_empty());
    }

    #[test]
    fn pin_to_a_cpu_set() {
        let all = current_affinity().unwrap();
        let want: Vec<usize> = all.iter().copied().take(2).collect();
        let got = thread::spawn(move || {
            pin_current_thread_to(&want)?;
            current_affinity().map(|c| (want, c))
        })
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(got.0, got.1);
        assert!(matches!(pin_current_thread_to(&[]), Err(NumaError::NoCpus)));
        assert!(matches!(
            pin_current_thread_to(&[0, MAX_CPUS]),
            Err(NumaError::CpuOutOfRange { cpu: MAX_CPUS, .. })
        ));
    }

    #[test]
    fn pin_rejects_bad_cpus() {
        assert!(matches!(
            pin_current_thread(MAX_CPUS),
            Err(NumaError::CpuOutOfRange { cpu: MAX_CPUS, .. })
        ));
        let nonexistent = thread::spawn(|| pin_current_thread(MAX_CPUS - 1)).join().unwrap();
        assert!(
            matches!(nonexistent, Err(NumaError::Syscall { call: "sched_setaffinity", .. })),
            "{nonexistent:?}"
        );
    }

    #[test]
    fn affinity_covers_topology_cpu() {
        let cpus = current_affinity().unwrap();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn bind_real_node() {
        let topology = Topology::from_sysfs(Path::new(SYSFS_NODE_DIR)).unwrap();
        let node = (0..topology.node_count())
            .find(|&i| topology.node(i).is_some_and(|n| !n.cpus.is_empty()))
            .unwrap();
        let map = Map::new(2 << 20);
        assert_eq!(topology.bind_memory(map.ptr, map.len, node).unwrap(), BindOutcome::Bound);
        // SAFETY: the mapping is live, writable and `len` bytes long; nothing else uses it.
        unsafe { ptr::write_bytes(map.ptr, 0xA5, map.len) };

        let page = page_size();
        // SAFETY: pointer arithmetic inside the mapping (1 < len); it is only compared, not read.
        let unaligned = unsafe { map.ptr.add(1) };
        assert!(matches!(
            topology.bind_memory(unaligned, page, node),
            Err(NumaError::Unaligned { page: p, .. }) if p == page
        ));
        assert!(matches!(
            topology.bind_memory(map.ptr, map.len, topology.node_count()),
            Err(NumaError::NodeOutOfRange { .. })
        ));

        // An aligned range that is never mapped (below mmap_min_addr): the kernel refuses.
        let addr = ptr::without_provenance_mut::<u8>(page);
        assert!(matches!(
            topology.bind_memory(addr, page, node),
            Err(NumaError::Syscall { call: "mbind", .. })
        ));
    }

    #[test]
    fn bind_emulated_is_noop() {
        let topology = Topology::emulated(2, &[0, 1]).unwrap();
        let map = Map::new(2 << 20);
        assert_eq!(topology.bind_memory(map.ptr, map.len, 1).unwrap(), BindOutcome::Emulated);
        // SAFETY: pointer arithmetic inside the mapping; only compared, not read.
        let unaligned = unsafe { map.ptr.add(8) };
        assert!(matches!(topology.bind_memory(unaligned, 64, 0), Err(NumaError::Unaligned { .. })));
        assert!(matches!(
            topology.bind_memory(map.ptr, map.len, 2),
            Err(NumaError::NodeOutOfRange { node: 2, nodes: 2 })
        ));
    }
}
