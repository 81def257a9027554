//! What the runner benchmarks: anything that can produce a fresh [`Index`].
//!
//! A [`Target`] is a named factory (an engine through the `numakv` facade, one of its paper
//! variants, or a DRAM peer from [`crate::peers`]); [`Target::open`] builds a fresh, empty
//! [`TargetInstance`] in a scratch directory for each run. Instances of persistent targets may
//! support [`TargetInstance::reopen`] so the runner can time a clean close + open and a crash +
//! recovery.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use numakv_index::Index;
use numakv_numa::Topology;
use numakv_pmem::PersistMode;

use crate::error::{BenchError, Result};

/// Where and how a target instance is built.
#[derive(Clone, Debug)]
pub struct TargetEnv {
    /// An empty directory the instance may put its store files in; removed after the run.
    pub dir: PathBuf,
    /// The (real or emulated) nodes the run uses; `topology.node_count()` is `--nodes`.
    pub topology: Arc<Topology>,
    /// `--persist`.
    pub persist: PersistMode,
    /// At most this many keys will be present (loaded plus inserted), to size pools.
    pub max_keys: u64,
    /// Worker threads of the run.
    pub threads: usize,
}

/// How [`TargetInstance::reopen`] ends the current incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reopen {
    /// Clean shutdown (`Engine::close`), then open.
    Clean,
    /// A simulated crash (e.g. ADR shadow crash or dropping without close), then open with
    /// recovery.
    Crash,
}

/// A named thing to benchmark.
pub trait Target: Send + Sync {
    /// Lower-case name for `--engines` and reports (e.g. `fastfair`, `scc-treeindex`).
    fn name(&self) -> String;
    /// One line for `numakv bench --list`.
    fn description(&self) -> String;
    /// Whether the target keeps its data in (emulated) persistent memory.
    fn persistent(&self) -> bool;
    /// A fresh, empty instance.
    ///
    /// # Errors
    ///
    /// Whatever creating the store fails with (e.g. [`BenchError::Index`]).
    fn open(&self, env: &TargetEnv) -> Result<Box<dyn TargetInstance>>;

    /// The same target under the byte-string layer with `key_size`-byte keys and
    /// `value_size`-byte values ([`crate::bytes`]); `None` when it has none (DRAM peers).
    fn bytes_twin(&self, key_size: usize, value_size: usize) -> Option<Arc<dyn Target>> {
        let _ = (key_size, value_size);
        None
    }
}

/// One live store of a [`Target`].
pub trait TargetInstance {
    /// The index to run operations on. The runner clones it into its workers and drops every
    /// clone before calling [`reopen`](Self::reopen).
    fn index(&self) -> Arc<dyn Index>;

    /// Ends the current incarnation (cleanly or by a simulated crash) and opens the store again.
    /// Returns the wall time of the *open* (recovery included), or `None` if the target cannot
    /// do this (DRAM peers), in which case nothing changed.
    ///
    /// # Errors
    ///
    /// Close or open failed; the instance is then unusable.
    fn reopen(&mut self, how: Reopen) -> Result<Option<Duration>> {
        let _ = how;
        Ok(None)
    }
}

impl fmt::Debug for dyn Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target").field("name", &self.name()).finish()
    }
}

/// Picks targets by name from `available`: a comma-separated list in `names` (each entry may
/// itself be `a,b`), or `all`. Names are matched case-insensitively; order follows `names`
/// (for `all`, the order of `available`), duplicates dropped.
///
/// # Errors
///
/// [`BenchError::UnknownTarget`] naming the first unknown entry and listing the choices;
/// [`BenchError::Config`] if nothing is selected.
pub fn resolve(names: &[String], available: &[Arc<dyn Target>]) -> Result<Vec<Arc<dyn Target>>> {
    let mut out: Vec<Arc<dyn Target>> = Vec::new();
    let push = |t: &Arc<dyn Target>, out: &mut Vec<Arc<dyn Target>>| {
        if !out.iter().any(|o| o.name() == t.name()) {
            out.push(Arc::clone(t));
        }
    };
    for entry in names.iter().flat_map(|n| n.split(',')).map(str::trim).filter(|n| !n.is_empty()) {
        if entry.eq_ignore_ascii_case("all") {
            for t in available {
                push(t, &mut out);
            }
            continue;
        }
        match available.iter().find(|t| t.name().eq_ignore_ascii_case(entry)) {
            Some(t) => push(t, &mut out),
            None => {
                return Err(BenchError::UnknownTarget {
                    name: entry.to_owned(),
                    available: available.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
                })
            }
        }
    }
    if out.is_empty() {
        return Err(BenchError::Config("no engine selected".into()));
    }
    Ok(out)
}

/// One line per target, `name  description`, aligned — the body of `numakv bench --list`.
pub fn describe(targets: &[Arc<dyn Target>]) -> String {
    let width = targets.iter().map(|t| t.name().len()).max().unwrap_or(0);
    targets.iter().map(|t| format!("{:width$}  {}\n", t.name(), t.description())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_all_dedups_and_keeps_order() {
        let peers = crate::peers::all();
        let all = resolve(&["all".into()], &peers).unwrap();
        assert_eq!(all.len(), 3);
        let picked =
            resolve(&["RWLOCK-BTREEMAP, scc-treeindex".into(), "rwlock-btreemap".into()], &peers)
                .unwrap();
        let names: Vec<String> = picked.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["rwlock-btreemap", "scc-treeindex"]);
        assert!(matches!(resolve(&[" , ".into()], &peers), Err(BenchError::Config(_))));
        let text = describe(&peers);
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("crossbeam-skiplist  DRAM peer"));
    }
}
