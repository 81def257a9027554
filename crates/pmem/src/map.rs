//! Memory mappings of node files: RAII over `mmap`/`munmap`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// How a mapping was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    /// `MAP_SHARED_VALIDATE | MAP_SYNC` on a DAX file system: CPU stores reach the media
    /// directly, so cache flushes are the whole durability story.
    SharedSync,
    /// `MAP_SHARED` on an ordinary file: stores reach the page cache; `msync` at close.
    Shared,
    /// `MAP_PRIVATE` of the file: the working memory of ADR shadow mode (copy-on-write, never
    /// written back).
    Private,
    /// Anonymous memory: a volatile pool.
    Anonymous,
}

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
    kind: MapKind,
}

// SAFETY: the mapping is plain memory owned by this value; all concurrent access to its contents
// goes through atomic accessor types or protocol-guarded byte views.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes only the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` shared. With `try_sync`, first asks for `MAP_SYNC` and falls
    /// back to plain `MAP_SHARED` when the file system is not DAX.
    pub(crate) fn shared(file: &File, len: usize, try_sync: bool) -> io::Result<Mapping> {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        if try_sync {
            let flags = libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC;
            if let Ok(m) = Self::map(Some(file), len, flags, MapKind::SharedSync) {
                return Ok(m);
            }
        }
        let _ = try_sync;
        Self::map(Some(file), len, libc::MAP_SHARED, MapKind::Shared)
    }

    /// Maps `len` bytes of `file` privately (copy-on-write).
    pub(crate) fn private(file: &File, len: usize) -> io::Result<Mapping> {
        Self::map(Some(file), len, libc::MAP_PRIVATE | libc::MAP_NORESERVE, MapKind::Private)
    }

    /// Maps `len` bytes of zero-filled anonymous memory.
    pub(crate) fn anonymous(len: usize) -> io::Result<Mapping> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        Self::map(None, len, flags, MapKind::Anonymous)
    }

    fn map(file: Option<&File>, len: usize, flags: i32, kind: MapKind) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let fd = file.map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a fresh mapping at a kernel-chosen address; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len, kind })
    }

    /// Asks the kernel for transparent huge pages over this mapping (`MADV_HUGEPAGE`); `true`
    /// when the advice was taken. Advice only: whether 2 MiB pages are granted depends on the
    /// kernel's THP settings (`/sys/kernel/mm/transparent_hugepage/enabled` for anonymous and
    /// private memory, the tmpfs `huge=` mount option or `shmem_enabled` for `/dev/shm`
    /// files, a 2 MiB-aligned DAX device) — see [`huge_page_bytes`] for what was granted. A
    /// pool's access pattern is random over its whole extent, and the TLB misses of 4 KiB pages
    /// were +25% on a FAST&FAIR search (issue 40).
    pub(crate) fn advise_huge_pages(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: advice over exactly this live mapping; MADV_HUGEPAGE changes no contents.
            unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_HUGEPAGE) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn kind(&self) -> MapKind {
        self.kind
    }

    /// Writes dirty pages of a shared mapping back to the file (`msync(MS_SYNC)`).
    pub(crate) fn sync(&self) -> io::Result<()> {
        if !matches!(self.kind, MapKind::Shared | MapKind::SharedSync) {
            return Ok(());
        }
        // SAFETY: `ptr..ptr+len` is exactly this live mapping.
        let rc = unsafe { libc::msync(self.ptr.cast(), self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns; nothing borrows it past its owner
        // (pool references are tied to the pool's lifetime).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Bytes of `[start, start + len)` that the kernel backs with huge pages now, and the bytes of
/// it that are resident, from `/proc/self/smaps` (`AnonHugePages`, `ShmemPmdMapped`,
/// `FilePmdMapped`; `Rss`); `None` where smaps cannot be read (not Linux, no procfs).
pub fn huge_page_bytes(start: usize, len: usize) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let end = start + len;
    let (mut huge, mut rss) = (0u64, 0u64);
    let mut inside = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                // A VMA header line: the mapping may be split into several VMAs.
                inside = a < end && b > start;
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = || fields.clone().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
        match first {
            "AnonHugePages:" | "ShmemPmdMapped:" | "FilePmdMapped:" => huge += kib(),
            "Rss:" => rss += kib(),
            _ => {}
        }
    }
    Some((huge, rss))
}
