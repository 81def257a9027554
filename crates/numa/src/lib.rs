//! NUMA awareness for numakv: where the nodes and CPUs are, which dense id and node the calling
//! thread has, where worker threads go, and how to pin threads and bind memory.
//!
//! Everything in numakv addresses nodes by a *dense index* `0..node_count()`; the kernel's
//! (possibly sparse) node ids appear only at the syscall boundary. On machines with fewer nodes
//! than an experiment needs, [`Topology::emulated`] fakes them so the same code paths run, with
//! pinning off and memory binding a no-op. Linux only.
//!
//! ```
//! use std::sync::Arc;
//! use numakv_numa::{current_node, Placement, Registry, Topology};
//!
//! # fn main() -> Result<(), numakv_numa::NumaError> {
//! // Two nodes, real if the machine has them, emulated otherwise.
//! let topology = Arc::new(Topology::with_nodes(2)?);
//! let registry = Arc::new(Registry::new(topology, Placement::Interleave).with_pinning(false));
//!
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let registry = Arc::clone(&registry);
//!         std::thread::spawn(move || {
//!             let reg = registry.register()?;
//!             // Hot paths pick their per-node structure with a thread-local read.
//!             assert_eq!(current_node(), reg.slot().node);
//!             Ok::<_, numakv_numa::NumaError>(reg.slot().node)
//!         })
//!     })
//!     .collect();
//! let mut nodes = Vec::new();
//! for w in workers {
//!     nodes.push(w.join().expect("worker panicked")?);
//! }
//! nodes.sort();
//! assert_eq!(nodes, [0, 0, 1, 1]);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod affinity;
mod error;
mod registry;
mod thread;
mod topology;

pub use affinity::{
    current_affinity, page_size, pin_current_thread, pin_current_thread_to, BindOutcome,
};
pub use error::NumaError;
pub use registry::{Placement, Registration, Registry, Slot};
pub use thread::{
    current, current_node, live_threads, set_current_node, tid, try_tid, ThreadCtx, MAX_THREADS,
};
pub use topology::{parse_cpulist, Node, Topology, MAX_CPUS, MAX_NODES, SYSFS_NODE_DIR};
