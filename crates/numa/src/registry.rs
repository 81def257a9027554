//! Placement of worker threads on nodes.
//!
//! A [`Registry`] hands each worker that calls [`Registry::register`] the next slot (node + CPU)
//! of a deterministic sequence, records the node as the thread's
//! [`current_node`](crate::current_node) and optionally pins the thread there. Making the sequence
//! a pure function of the registration index ([`Registry::slot`]) keeps benchmark runs
//! reproducible and lets tests check placement without threads.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::affinity;
use crate::error::NumaError;
use crate::thread::{self, ThreadCtx};
use crate::topology::Topology;

/// How successive workers are spread over the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// Fill node 0's CPUs first, then node 1's, and so on — the pinning used in the papers numakv
    /// reproduces, so that small thread counts stay on one node and cross-node effects appear
    /// only once a node is full.
    #[default]
    Fill,
    /// Round-robin over nodes: worker `i` goes to node `i % nodes`, spreading load (and memory
    /// bandwidth) from the first threads on.
    Interleave,
}

impl Placement {
    /// The name accepted by [`FromStr`] and printed by [`Display`](fmt::Display).
    pub fn name(self) -> &'static str {
        match self {
            Placement::Fill => "fill",
            Placement::Interleave => "interleave",
        }
    }
}

impl FromStr for Placement {
    type Err = NumaError;

    /// Parses `"fill"` or `"interleave"` (ASCII case-insensitive, surrounding whitespace ignored),
    /// as given on command lines.
    fn from_str(s: &str) -> Result<Placement, NumaError> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("fill") {
            Ok(Placement::Fill)
        } else if t.eq_ignore_ascii_case("interleave") {
            Ok(Placement::Interleave)
        } else {
            Err(NumaError::BadPlacement { text: s.to_owned() })
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one worker goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Dense node index.
    pub node: usize,
    /// CPU of that node.
    pub cpu: usize,
}

/// Hands out slots to registering worker threads; share it (`Arc<Registry>`) among them.
#[derive(Debug)]
pub struct Registry {
    topology: Arc<Topology>,
    placement: Placement,
    pin: bool,
    next: AtomicUsize,
    /// The fill order: every (node, cpu) pair, node by node; nodes without CPUs contribute none.
    fill: Vec<Slot>,
    /// Dense indices of the nodes that have CPUs, in order.
    cpu_nodes: Vec<usize>,
}

impl Registry {
    /// A registry placing workers on `topology` by `placement`.
    ///
    /// Pinning defaults to on for real topologies with more than one node with CPUs (where it
    /// matters) and off otherwise — pinning emulated nodes would only pile threads onto shared
    /// CPUs. Override with [`with_pinning`](Self::with_pinning).
    pub fn new(topology: Arc<Topology>, placement: Placement) -> Registry {
        let cpu_nodes: Vec<usize> = (0..topology.node_count())
            .filter(|&i| topology.node(i).is_some_and(|n| !n.cpus.is_empty()))
            .collect();
        let fill = cpu_nodes
            .iter()
            .flat_map(|&node| {
                topology.nodes()[node].cpus.iter().map(move |&cpu| Slot { node, cpu })
            })
            .collect();
        let pin = !topology.is_emulated() && cpu_nodes.len() > 1;
        Registry { topology, placement, pin, next: AtomicUsize::new(0), fill, cpu_nodes }
    }

    /// Turns pinning on or off, e.g. off for a shared CI machine or on to test pinning itself.
    pub fn with_pinning(mut self, pin: bool) -> Registry {
        self.pin = pin;
        self
    }

    /// Whether [`register`](Self::register) pins threads.
    pub fn pinning(&self) -> bool {
        self.pin
    }

    /// The topology workers are placed on.
    pub fn topology(&self) -> &Arc<Topology> {
        &self.topology
    }

    /// The placement policy.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Where the `index`-th registered worker goes; pure, so placement can be planned and tested
    /// without threads.
    ///
    /// [`Fill`](Placement::Fill): node 0's CPUs first, then node 1's, …; past the last CPU it
    /// wraps around (`index % total`). [`Interleave`](Placement::Interleave): node
    /// `index % n`, CPU `(index / n) % len` of that node. Both skip nodes without CPUs (`n`
    /// counts only nodes with CPUs).
    pub fn slot(&self, index: usize) -> Slot {
        // The topology invariant guarantees at least one node with a CPU, so neither list is
        // empty and no node in `cpu_nodes` has an empty CPU list.
        match self.placement {
            Placement::Fill => self.fill[index % self.fill.len()],
            Placement::Interleave => {
                let n = self.cpu_nodes.len();
                let node = self.cpu_nodes[index % n];
                let cpus = &self.topology.nodes()[node].cpus;
                Slot { node, cpu: cpus[(index / n) % cpus.len()] }
            }
        }
    }

    /// Places the calling thread: takes the next slot, makes its node the thread's
    /// [`current_node`](crate::current_node), pins the thread to the slot's CPU if pinning is on,
    /// and makes sure the thread has a [`tid`](crate::tid).
    ///
    /// Keep the returned [`Registration`] alive for as long as the thread works for this
    /// registry; dropping it restores the previous current node.
    ///
    /// # Errors
    ///
    /// [`NumaError::TooManyThreads`] (no thread id), or [`NumaError::Syscall`] if pinning fails.
    /// On error the thread's current node is unchanged (the slot index is still used up).
    pub fn register(&self) -> Result<Registration, NumaError> {
        let tid = thread::try_tid()?;
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = self.slot(index);
        if self.pin {
            affinity::pin_current_thread(slot.cpu)?;
        }
        let previous = thread::current_node();
        thread::set_current_node(slot.node);
        Ok(Registration { slot, index, tid, previous, _not_send: PhantomData })
    }

    /// How many registrations have been handed out (including failed ones).
    pub fn registered(&self) -> usize {
        self.next.load(Ordering::Relaxed)
    }
}

/// Proof that the calling thread was placed by a [`Registry`], and what it was given.
///
/// It is `!Send` because it describes the thread that registered. Dropping it restores that
/// thread's previous [`current_node`](crate::current_node); pinning is left as is (the previous
/// affinity is not recorded, and worker threads usually end right after), and the thread keeps
/// its tid until it exits. Registrations nested on one thread must be dropped in reverse order.
#[derive(Debug)]
pub struct Registration {
    slot: Slot,
    index: usize,
    tid: usize,
    previous: usize,
    _not_send: PhantomData<*const ()>,
}

impl Registration {
    /// The node and CPU this thread was given.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// Which registration this was (0 for the first), e.g. to pick the worker's share of work.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The thread's id and node.
    pub fn ctx(&self) -> ThreadCtx {
        ThreadCtx { tid: self.tid, node: self.slot.node }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        thread::set_current_node(self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thread::{current_node, set_current_node, tid, TEST_LOCK};
    use crate::topology::SYSFS_NODE_DIR;
    use std::path::Path;

    fn two_by_four() -> Arc<Topology> {
        Arc::new(Topology::emulated(2, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap())
    }

    fn slots(r: &Registry, n: usize) -> Vec<(usize, usize)> {
        (0..n).map(|i| r.slot(i)).map(|s| (s.node, s.cpu)).collect()
    }

    #[test]
    fn fill_sequence() {
        let r = Registry::new(two_by_four(), Placement::Fill);
        let got = slots(&r, 10);
        assert_eq!(
            got,
            vec![(0, 0), (0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (1, 6), (1, 7), (0, 0), (0, 1)]
        );
    }

    #[test]
    fn interleave_sequence() {
        let r = Registry::new(two_by_four(), Placement::Interleave);
        let got = slots(&r, 10);
        assert_eq!(
            got,
            vec![(0, 0), (1, 4), (0, 1), (1, 5), (0, 2), (1, 6), (0, 3), (1, 7), (0, 0), (1, 4)]
        );
    }

    #[test]
    fn cpuless_nodes_skipped() {
        let dir = tempfile::tempdir().unwrap();
        for (name, list) in [("node0", "0-1\n"), ("node1", "\n"), ("node3", "2-3\n")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("cpulist"), list).unwrap();
        }
        let t = Arc::new(Topology::from_sysfs(dir.path()).unwrap());
        let fill = Registry::new(Arc::clone(&t), Placement::Fill);
        assert_eq!(slots(&fill, 5), vec![(0, 0), (0, 1), (2, 2), (2, 3), (0, 0)]);
        assert!(fill.pinning(), "real multi-node topologies pin by default");
        let inter = Registry::new(t, Placement::Interleave);
        assert_eq!(slots(&inter, 5), vec![(0, 0), (2, 2), (0, 1), (2, 3), (0, 0)]);
    }

    #[test]
    fn shared_cpus_emulated() {
        let t = Arc::new(Topology::emulated(4, &[0, 1]).unwrap());
        let fill = Registry::new(Arc::clone(&t), Placement::Fill);
        assert!(!fill.pinning(), "emulated topologies do not pin by default");
        assert_eq!(slots(&fill, 5), vec![(0, 0), (1, 1), (2, 0), (3, 1), (0, 0)]);
        let inter = Registry::new(t, Placement::Interleave);
        assert_eq!(slots(&inter, 5), vec![(0, 0), (1, 1), (2, 0), (3, 1), (0, 0)]);
    }

    #[test]
    fn placement_parse_and_display() {
        assert_eq!("fill".parse::<Placement>().unwrap(), Placement::Fill);
        assert_eq!(" Interleave\n".parse::<Placement>().unwrap(), Placement::Interleave);
        for p in [Placement::Fill, Placement::Interleave] {
            assert_eq!(p.to_string().parse::<Placement>().unwrap(), p);
        }
        assert_eq!(Placement::default(), Placement::Fill);
        let err = "numa".parse::<Placement>().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("fill") && msg.contains("interleave") && msg.contains("numa"),
            "{msg}"
        );
    }

    #[test]
    fn register_sets_node_of_registering_thread_only() {
        let _guard = TEST_LOCK.lock();
        let r = Arc::new(Registry::new(two_by_four(), Placement::Interleave));
        assert!(!r.pinning());
        let r2 = Arc::clone(&r);
        std::thread::spawn(move || {
            set_current_node(7);
            let reg = r2.register().unwrap();
            assert_eq!(reg.index(), 0);
            assert_eq!(reg.slot(), Slot { node: 0, cpu: 0 });
            assert_eq!(reg.ctx(), ThreadCtx { tid: tid(), node: 0 });
            assert_eq!(current_node(), 0);

            let r3 = Arc::clone(&r2);
            let other = std::thread::spawn(move || {
                let before = current_node();
                let reg = r3.register().unwrap();
                (before, reg.index(), reg.slot(), current_node())
            })
            .join()
            .unwrap();
            assert_eq!(other, (0, 1, Slot { node: 1, cpu: 4 }, 1));
            assert_eq!(current_node(), 0, "another thread's registration did not leak here");

            drop(reg);
            assert_eq!(current_node(), 7, "restored on drop");
        })
        .join()
        .unwrap();
        assert_eq!(r.registered(), 2);
    }

    #[test]
    fn register_pins_when_asked() {
        let _guard = TEST_LOCK.lock();
        let t = Arc::new(Topology::from_sysfs(Path::new(SYSFS_NODE_DIR)).unwrap());
        let multi = t.nodes().iter().filter(|n| !n.cpus.is_empty()).count() > 1;
        assert_eq!(Registry::new(Arc::clone(&t), Placement::Fill).pinning(), multi);
        let r = Arc::new(Registry::new(t, Placement::Fill).with_pinning(true));
        let r2 = Arc::clone(&r);
        let (slot, cpus) = std::thread::spawn(move || {
            let reg = r2.register().unwrap();
            (reg.slot(), crate::affinity::current_affinity().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(slot, r.slot(0));
        assert_eq!(cpus, vec![slot.cpu]);
    }
}
