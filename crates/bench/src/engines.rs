//! The persistent engines as benchmark [`Target`]s, built through the `numakv` facade: one target
//! per engine with the paper's default options, plus named variants that change one mechanism
//! (e.g. NUMA-oblivious placement) so a run shows what the mechanism buys.
//!
//! Every run gets a fresh store in the runner's scratch directory, with the run's node count
//! (emulated nodes where the machine has fewer), persistence mode and topology, and node files
//! sized for the run's key count (files are sparse: only touched pages take memory).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv::{EngineKind, EngineOptions, Index, Options, Store};

use crate::error::{BenchError, Result};
use crate::target::{Reopen, Target, TargetEnv, TargetInstance};

/// PM bytes budgeted per key when sizing node files: generous for every engine (FAST&FAIR at
/// half-full 512-byte nodes needs about 40), since files are sparse and an out-of-space run is
/// a failed run.
const BYTES_PER_KEY: u64 = 256;

/// Node-file slack on top of the per-key budget (headers, page heap, allocator metadata).
const SLACK_BYTES: u64 = 64 << 20;

/// An engine, with options, as a benchmark target.
#[derive(Clone, Debug)]
pub struct EngineTarget {
    name: String,
    description: String,
    kind: EngineKind,
    options: EngineOptions,
}

impl EngineTarget {
    /// `kind` with its paper defaults, under the engine's own name.
    pub fn new(kind: EngineKind) -> EngineTarget {
        EngineTarget {
            name: kind.name().to_owned(),
            description: format!("{} engine, paper defaults ({})", kind.name(), describe(kind)),
            kind,
            options: kind.default_options(),
        }
    }

    /// A named variant of `kind`: its defaults with `settings` (`key`, `value`) applied.
    ///
    /// # Errors
    ///
    /// [`BenchError::Config`] if a setting is not one of the engine's options.
    pub fn variant(
        name: &str,
        description: &str,
        kind: EngineKind,
        settings: &[(&str, &str)],
    ) -> Result<EngineTarget> {
        let mut options = kind.default_options();
        for (key, value) in settings {
            options.set(key, value).map_err(|e| BenchError::Config(format!("{name}: {e}")))?;
        }
        Ok(EngineTarget {
            name: name.to_owned(),
            description: description.to_owned(),
            kind,
            options,
        })
    }

    /// The engine options this target creates stores with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }
}

fn describe(kind: EngineKind) -> String {
    let values = kind.default_options().values();
    values.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
}

/// A named variant of an engine: its paper defaults with some options changed.
struct Variant {
    name: &'static str,
    kind: EngineKind,
    settings: &'static [(&'static str, &'static str)],
    /// What the variant shows, for `--list`.
    description: &'static str,
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "fastfair-interleave",
        kind: EngineKind::FastFair,
        settings: &[("nsm_mode", "round-robin")],
        description: "fastfair engine with NUMA-oblivious placement: nodes from every NUMA node \
                      in turn (the original FAST&FAIR on interleaved PM)",
    },
    Variant {
        name: "nobtree-nomigrate",
        kind: EngineKind::Nobtree,
        settings: &[("migration", "off")],
        description: "nobtree engine with the migration coordinator off: replicated upper layer \
                      and round-robin bottom nodes only (papers/nobtree.txt §III-D ablation)",
    },
    Variant {
        name: "nstore-lfu",
        kind: EngineKind::NStore,
        settings: &[("cache", "lfu")],
        description: "nstore engine with an unweighted (plain LFU) cache instead of RAF: every \
                      access counts 1, local or remote (papers/nstore.txt Figs. 10-11)",
    },
    Variant {
        name: "nstore-nocache",
        kind: EngineKind::NStore,
        settings: &[("cache", "off")],
        description: "nstore engine without the DRAM cache (NStore-w/o-RAF, papers/nstore.txt \
                      Fig. 11)",
    },
    Variant {
        name: "nbtree-w",
        kind: EngineKind::NbTree,
        settings: &[("variant", "w")],
        description: "NBTree-W (papers/nbtree.txt Fig. 14): node-grained write locks on leaves \
                      instead of the lock-free write schemes; lock-free reads",
    },
    Variant {
        name: "nbtree-wr",
        kind: EngineKind::NbTree,
        settings: &[("variant", "wr")],
        description: "NBTree-WR (papers/nbtree.txt Fig. 14): node-grained locks on leaves for \
                      reads and writes",
    },
    Variant {
        name: "nbtree-coupled",
        kind: EngineKind::NbTree,
        settings: &[("coupled", "true")],
        description: "NBTree with coupled leaves (papers/nbtree.txt Fig. 13): leaf metadata \
                      kept in PM with the key-value entries",
    },
    Variant {
        name: "nbtree-naive",
        kind: EngineKind::NbTree,
        settings: &[("allocator", "naive")],
        description: "NBTree over the naive bump allocator (papers/nbtree.txt §VI-A, Fig. 15's \
                      ceiling): leaf blocks never freed, not recoverable",
    },
    Variant {
        name: "nbtree-pageheap",
        kind: EngineKind::NbTree,
        settings: &[("allocator", "page-heap")],
        description: "NBTree over the pool's page heap (Fig. 15's general-purpose allocators): \
                      a 4 KiB page per leaf block, persistent page metadata, freed after the \
                      grace period; not recoverable",
    },
    Variant {
        name: "f3tree-batched",
        kind: EngineKind::F3Tree,
        settings: &[("evaluation", "batched:1024")],
        description: "F3-tree(N) with node-based batched evaluation (the paper's F3-N: entries \
                      sorted by key before they are checkpointed); \"(N)\" is NUMA-aware, \
                      which every F3-tree variant but -nonuma is",
    },
    Variant {
        name: "f3tree-n2",
        kind: EngineKind::F3Tree,
        settings: &[("evaluators", "total:2")],
        description: "F3-tree(N2), papers/f3tree.txt Figs. 8-9: NUMA-aware (PTFOs local, \
                      evaluators node-bound) with two evaluate threads in total",
    },
    Variant {
        name: "f3tree-ni",
        kind: EngineKind::F3Tree,
        settings: &[("evaluators", "first-node:2")],
        description: "F3-tree(NI), Fig. 9's baseline (§3.2): PTFOs in the producer's local PM, \
                      two evaluate threads in total pinned to the first node serving every list",
    },
    Variant {
        name: "f3tree-nonuma",
        kind: EngineKind::F3Tree,
        settings: &[("numa_aware", "false"), ("evaluators", "unbound:2")],
        description: "F3-tree(I) as we run it (§3.2): FOs and tree nodes interleaved over the \
                      nodes; two unpinned evaluators per node serving any list (the paper's (I) \
                      has two in total, pinned to the first node)",
    },
    Variant {
        name: "f3tree-nohash",
        kind: EngineKind::F3Tree,
        settings: &[("hash_lookups", "false")],
        description: "F3-tree whose lookups search the PTFOs instead of the hash table \
                      (Fig. 10 \"No Hash\"; read-only runs)",
    },
];

/// Every engine with its paper defaults, then the variants, in [`EngineKind::all`] order.
pub fn all() -> Vec<Arc<dyn Target>> {
    let mut out: Vec<Arc<dyn Target>> = Vec::new();
    for &kind in EngineKind::all() {
        out.push(Arc::new(EngineTarget::new(kind)));
        for v in VARIANTS.iter().filter(|v| v.kind == kind) {
            // The variants are fixed above and tested below: a failure here is a bug.
            let target = EngineTarget::variant(v.name, v.description, v.kind, v.settings)
                .unwrap_or_else(|e| panic!("variant {}: {e}", v.name));
            out.push(Arc::new(target));
        }
    }
    out
}

/// Every target `numakv bench` knows: the engines and their variants, then the DRAM peers.
pub fn available() -> Vec<Arc<dyn Target>> {
    let mut out = all();
    out.extend(crate::peers::all());
    out
}

/// Engines left out of `default` (in `all` and by name): Nap over the engines its paper does
/// not evaluate it on (the issue names `nap-fastfair` and `nap-nbtree`); they would double the
/// default run for layers nobody compares against.
const NOT_IN_DEFAULT: &[EngineKind] =
    &[EngineKind::NapNobtree, EngineKind::NapNStore, EngineKind::NapF3Tree];

/// What the word `default` selects in `--engines`: every engine with its paper defaults, then
/// the DRAM peers — the comparison `numakv bench` runs without arguments (the variants, which
/// each change one mechanism, are for targeted runs and `all`).
pub fn default_names() -> Vec<String> {
    let engines = EngineKind::all()
        .iter()
        .filter(|k| !NOT_IN_DEFAULT.contains(k))
        .map(|k| k.name().to_owned());
    engines.chain(crate::peers::all().iter().map(|p| p.name())).collect()
}

/// [`crate::target::resolve`] over [`available`], where `default` stands for
/// [`default_names`] and `all` for everything.
///
/// # Errors
///
/// As [`crate::target::resolve`].
pub fn select(names: &[String]) -> Result<Vec<Arc<dyn Target>>> {
    let mut expanded = Vec::new();
    for entry in names.iter().flat_map(|n| n.split(',')).map(str::trim) {
        if entry.eq_ignore_ascii_case("default") {
            expanded.extend(default_names());
        } else {
            expanded.push(entry.to_owned());
        }
    }
    crate::target::resolve(&expanded, &available())
}

impl Target for EngineTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn persistent(&self) -> bool {
        true
    }

    fn bytes_twin(&self, key_size: usize, value_size: usize) -> Option<Arc<dyn Target>> {
        // Measurement stores (NBTree over the naive allocator or the page heap) stay u64-only.
        let measurement = self
            .options
            .values()
            .iter()
            .any(|(k, v)| *k == "allocator" && (v == "page-heap" || v == "naive"));
        (!measurement).then(|| {
            Arc::new(crate::bytes::BytesTarget::new(
                &self.name,
                self.kind,
                self.options.clone(),
                key_size,
                value_size,
            )) as Arc<dyn Target>
        })
    }

    fn open(&self, env: &TargetEnv) -> Result<Box<dyn TargetInstance>> {
        let nodes = env.topology.node_count();
        // The page heap gives an NBTree leaf block whole pages: small ones (NBTree refuses a
        // page far larger than its block).
        let page_heap_blocks =
            self.options.values().iter().any(|(k, v)| *k == "allocator" && v == "page-heap");
        let page = if page_heap_blocks { 4096 } else { numakv::Options::default().page_size };
        let capacity = env
            .max_keys
            .saturating_mul(BYTES_PER_KEY)
            .saturating_add(SLACK_BYTES)
            .saturating_add(self.options.min_capacity_per_node(page));
        // Round up to the page-heap page so the last page is whole.
        let capacity = capacity.div_ceil(page) * page;
        let opts = Options::default()
            .page_size(page)
            .nodes(nodes)
            .capacity_per_node(capacity)
            .mode(env.persist)
            .topology(Arc::clone(&env.topology))
            .engine(self.options.clone());
        let dir = env.dir.join("store");
        let store =
            Store::create(&dir, self.kind, opts.clone()).map_err(|e| BenchError::Target {
                target: self.name.clone(),
                message: format!("create in {}: {e}", dir.display()),
            })?;
        Ok(Box::new(EngineInstance {
            name: self.name.clone(),
            dir,
            opts,
            store: Some(Arc::new(store)),
            reopenable: !page_heap_blocks
                && !self.options.values().iter().any(|(k, v)| *k == "allocator" && v == "naive"),
        }))
    }
}

/// A live store of an [`EngineTarget`].
struct EngineInstance {
    name: String,
    dir: PathBuf,
    opts: Options,
    /// `None` only between a failed reopen and the drop.
    store: Option<Arc<Store>>,
    /// False for measurement stores that cannot be reopened (NBTree over the naive allocator
    /// or the page heap): `reopen` then answers `None` and leaves the store as it is.
    reopenable: bool,
}

impl EngineInstance {
    fn err(&self, what: &str, e: impl std::fmt::Display) -> BenchError {
        BenchError::Target { target: self.name.clone(), message: format!("{what}: {e}") }
    }
}

impl TargetInstance for EngineInstance {
    fn index(&self) -> Arc<dyn Index> {
        match &self.store {
            Some(s) => Arc::clone(s) as Arc<dyn Index>,
            // reopen() failed and the runner still asked: an index that reports the failure is
            // not worth the complexity; the runner never does this (it stops at the error).
            None => panic!("{}: index() after a failed reopen", self.name),
        }
    }

    fn reopen(&mut self, how: Reopen) -> Result<Option<Duration>> {
        if !self.reopenable {
            return Ok(None);
        }
        let store = self.store.take().ok_or_else(|| self.err("reopen", "store is gone"))?;
        let store = Arc::try_unwrap(store)
            .map_err(|_| self.err("reopen", "the index is still shared by a worker"))?;
        match how {
            Reopen::Clean => store.close().map_err(|e| self.err("close", e))?,
            // Dropping without close leaves the clean flag unset: the next open runs the
            // engine's recovery over what the process wrote (a process crash; every store
            // reached the page cache).
            Reopen::Crash => drop(store),
        }
        let start = Instant::now();
        let store = Store::open_with(&self.dir, &self.opts).map_err(|e| self.err("open", e))?;
        let elapsed = start.elapsed();
        self.store = Some(Arc::new(store));
        Ok(Some(elapsed))
    }
}

impl Drop for EngineInstance {
    fn drop(&mut self) {
        // Close cleanly so the scratch store is not left "crashed"; the directory is removed by
        // the runner anyway, so a failure here only matters to nobody.
        if let Some(store) = self.store.take().and_then(|s| Arc::try_unwrap(s).ok()) {
            let _ = store.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_and_variant_is_listed_with_a_distinct_name() {
        let targets = available();
        let mut names: Vec<String> = targets.iter().map(|t| t.name()).collect();
        for &kind in EngineKind::all() {
            assert!(names.iter().any(|n| n == kind.name()), "{names:?}");
        }
        for v in VARIANTS {
            assert!(names.iter().any(|n| n == v.name), "{names:?}");
        }
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate target names");
        assert!(targets.iter().take(all().len()).all(|t| t.persistent()));
    }

    #[test]
    fn default_is_every_engine_and_peer_without_variants() {
        let picked = select(&["default".into()]).unwrap();
        let names: Vec<String> = picked.iter().map(|t| t.name()).collect();
        assert_eq!(names, default_names());
        assert_eq!(
            names.len(),
            EngineKind::all().len() - NOT_IN_DEFAULT.len() + crate::peers::all().len()
        );
        assert!(VARIANTS.iter().all(|v| !names.iter().any(|n| n == v.name)));
        assert!(NOT_IN_DEFAULT.iter().all(|k| !names.iter().any(|n| n == k.name())));
        let mixed = select(&["fastfair-interleave,default".into()]).unwrap();
        assert_eq!(mixed.len(), names.len() + 1);
        assert_eq!(select(&["all".into()]).unwrap().len(), available().len());
    }

    #[test]
    fn bad_variant_settings_are_config_errors() {
        let e = EngineTarget::variant("x", "", EngineKind::FastFair, &[("no_such", "1")]);
        assert!(matches!(e, Err(BenchError::Config(m)) if m.contains("no_such")));
    }
}
