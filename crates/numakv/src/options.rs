//! [`Options`]: how a store is created (geometry, persistence mode, engine options) and how a
//! session runs (crash simulation, NUMA binding, accounting, latency emulation).

use std::sync::Arc;

use numakv_pmem::numa::Topology;
use numakv_pmem::{LatencyModel, PersistMode, SimMode, DEFAULT_PAGE_SIZE};

use crate::registry::EngineOptions;

/// Default capacity of each node file: 1 GiB. Node files are sparse, so only touched pages use
/// disk or memory.
pub const DEFAULT_CAPACITY: u64 = 1 << 30;

/// Options of [`crate::Store::create`] and [`crate::Store::open_with`].
///
/// Built with [`Options::default`] and the builder methods. The store-shape fields (`nodes`,
/// `capacity_per_node`, `page_size`, `mode`) are fixed at create and ignored by `open_with`,
/// which reads them from the store; so are engine options that shape the persistent format
/// (e.g. FAST&FAIR's node size), which the engine records itself.
///
/// ```
/// use numakv::{EngineKind, Options, PersistMode};
///
/// let mut engine = EngineKind::FastFair.default_options();
/// engine.set("node_size", "1024")?;
/// let opts = Options::default()
///     .nodes(2)
///     .capacity_per_node(64 << 20)
///     .mode(PersistMode::Eadr)
///     .engine(engine);
/// assert_eq!(opts.nodes, 2);
/// # Ok::<(), numakv::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// NUMA nodes, i.e. node files (1..=256). Emulated when the machine has fewer. Default 1.
    pub nodes: usize,
    /// Bytes of each node file (sparse). Default [`DEFAULT_CAPACITY`].
    pub capacity_per_node: u64,
    /// Page-heap page size, a power of two ≥ 4 KiB. Default 256 KiB (NSM's page).
    pub page_size: u64,
    /// Persistence mode, fixed for the store's life. Default ADR.
    pub mode: PersistMode,
    /// Engine-specific options; `None` means the engine's (paper) defaults.
    pub engine: Option<EngineOptions>,
    /// Mapping / crash-simulation mode of this session. Default direct (production).
    pub sim: SimMode,
    /// Topology used to bind each node file's mapping to its NUMA node. Default none.
    pub topology: Option<Arc<Topology>>,
    /// Turn PM access accounting on or off — process-wide, for every store. `None` (default)
    /// leaves the process setting as it is.
    pub accounting: Option<bool>,
    /// Install a PM latency model — process-wide. `None` (default) leaves it as it is.
    pub latency: Option<LatencyModel>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 1,
            capacity_per_node: DEFAULT_CAPACITY,
            page_size: DEFAULT_PAGE_SIZE,
            mode: PersistMode::Adr,
            engine: None,
            sim: SimMode::Direct,
            topology: None,
            accounting: None,
            latency: None,
        }
    }
}

impl Options {
    /// Sets [`Options::nodes`].
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }
    /// Sets [`Options::capacity_per_node`] (bytes).
    pub fn capacity_per_node(mut self, bytes: u64) -> Self {
        self.capacity_per_node = bytes;
        self
    }
    /// Sets [`Options::page_size`] (bytes).
    pub fn page_size(mut self, bytes: u64) -> Self {
        self.page_size = bytes;
        self
    }
    /// Sets [`Options::mode`].
    pub fn mode(mut self, mode: PersistMode) -> Self {
        self.mode = mode;
        self
    }
    /// Sets [`Options::engine`].
    pub fn engine(mut self, opts: EngineOptions) -> Self {
        self.engine = Some(opts);
        self
    }
    /// Sets [`Options::sim`].
    pub fn sim(mut self, sim: SimMode) -> Self {
        self.sim = sim;
        self
    }
    /// Sets [`Options::topology`].
    pub fn topology(mut self, topology: Arc<Topology>) -> Self {
        self.topology = Some(topology);
        self
    }
    /// Sets [`Options::accounting`].
    pub fn accounting(mut self, on: bool) -> Self {
        self.accounting = Some(on);
        self
    }
    /// Sets [`Options::latency`].
    pub fn latency(mut self, model: LatencyModel) -> Self {
        self.latency = Some(model);
        self
    }

    /// Applies the process-wide knobs (accounting, latency) this session asks for.
    pub(crate) fn apply_process_knobs(&self) {
        if let Some(on) = self.accounting {
            numakv_pmem::account::set_enabled(on);
        }
        if let Some(model) = self.latency {
            numakv_pmem::account::set_latency(model);
        }
    }
}
