//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while discovering the topology, handing out thread ids, pinning
/// threads or binding memory.
///
/// Callers mostly propagate it; the variants carry enough context (the file, the text, the
/// syscall) to make a log line actionable without a debugger. New variants may be added, so match
/// with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NumaError {
    /// A sysfs file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory that failed.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },

    /// A Linux cpulist (`"0-3,8-11"`) was malformed.
    #[error("bad cpu list {text:?}: {reason}")]
    BadCpuList {
        /// The text as given (trimmed of surrounding whitespace).
        text: String,
        /// What was wrong with it.
        reason: String,
    },

    /// A topology with zero nodes was requested or found.
    #[error("no NUMA nodes")]
    NoNodes,

    /// More nodes were asked for than a topology may have.
    #[error("{nodes} nodes: a topology has at most {max}")]
    TooManyNodes {
        /// The count asked for.
        nodes: usize,
        /// The limit, [`MAX_NODES`](crate::MAX_NODES).
        max: usize,
    },

    /// No node of the topology has a CPU (or an emulated topology was given no CPUs), so no thread
    /// could ever run on it.
    #[error("no CPUs in the topology")]
    NoCpus,

    /// More than [`MAX_THREADS`](crate::MAX_THREADS) threads hold a dense thread id at once.
    #[error("too many live threads: at most {max} may hold a thread id at once")]
    TooManyThreads {
        /// The limit.
        max: usize,
    },

    /// The calling thread is being torn down and its thread-locals are gone, so it cannot be given
    /// a thread id any more.
    #[error("the calling thread is exiting; no thread id can be allocated")]
    ThreadExiting,

    /// A dense node index was not below the node count.
    #[error("node {node} out of range: the topology has {nodes} nodes")]
    NodeOutOfRange {
        /// The index asked for.
        node: usize,
        /// How many nodes there are.
        nodes: usize,
    },

    /// A CPU number too large for an affinity mask.
    #[error("cpu {cpu} out of range: affinity masks hold cpus below {limit}")]
    CpuOutOfRange {
        /// The CPU asked for.
        cpu: usize,
        /// The first CPU number that is not accepted.
        limit: usize,
    },

    /// An address handed to [`Topology::bind_memory`](crate::Topology::bind_memory) was not page
    /// aligned (the kernel would reject it with a bare `EINVAL`).
    #[error("address {addr:#x} is not aligned to the page size {page}")]
    Unaligned {
        /// The offending address.
        addr: usize,
        /// The page size it must be a multiple of.
        page: usize,
    },

    /// A placement name that is not one of the known policies.
    #[error("unknown placement {text:?}: expected one of \"fill\", \"interleave\"")]
    BadPlacement {
        /// The text as given.
        text: String,
    },

    /// A system call failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// The call's name, e.g. `"sched_setaffinity"`.
        call: &'static str,
        /// The errno, as an `io::Error`.
        source: io::Error,
    },
}
