//! NUMA topology: which CPUs belong to which node, read from sysfs or emulated.
//!
//! numakv addresses nodes by a *dense index* `0..node_count()` everywhere (per-node arrays, thread
//! contexts, placement); the kernel's node number, which may be sparse, is only needed to talk to
//! the kernel and is available from [`Topology::os_node_id`].

use std::fs;
use std::path::Path;

use crate::affinity;
use crate::error::NumaError;

/// CPU numbers must be below this. It bounds the memory a hostile or corrupt cpulist
/// (`"0-18446744073709551615"`) can make us allocate, and is far above any real machine (Linux
/// caps `NR_CPUS` at 8192 on x86).
pub const MAX_CPUS: usize = 1 << 16;

/// The most nodes a topology may have: the pool's limit on node files (1..=256), and a bound
/// on the per-node tables a caller's node count sizes (`with_nodes(1 << 50)` is refused, not an
/// allocation failure).
pub const MAX_NODES: usize = 256;

/// Where the kernel describes the NUMA nodes.
pub const SYSFS_NODE_DIR: &str = "/sys/devices/system/node";

/// Parses a Linux cpulist, the format of sysfs `cpulist` files and of `taskset -c`.
///
/// Accepted elements, separated by commas: `N`, `A-B` (inclusive), `A-B:S` (every `S`-th CPU
/// from `A`), and the kernel's `A-B:U/G` (the first `U` CPUs of every group of `G` starting at
/// `A`). Surrounding whitespace (sysfs's trailing newline) is ignored and an empty list is valid
/// (a memory-only node). The result is sorted and deduplicated, so callers can compare lists and
/// binary-search them.
///
/// # Errors
///
/// [`NumaError::BadCpuList`] on anything else: empty elements, signs or other non-digits,
/// reversed ranges (`5-3`), zero strides, numbers that overflow or are not below [`MAX_CPUS`].
pub fn parse_cpulist(s: &str) -> Result<Vec<usize>, NumaError> {
    let text = s.trim();
    let bad = |reason: String| NumaError::BadCpuList { text: text.to_owned(), reason };
    let mut cpus = Vec::new();
    if text.is_empty() {
        return Ok(cpus);
    }
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(bad("empty element".to_owned()));
        }
        let (range, step) = match item.split_once(':') {
            Some((range, step)) => (range, Some(step)),
            None => (item, None),
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (parse_cpu(a).map_err(&bad)?, parse_cpu(b).map_err(&bad)?),
            None if step.is_some() => {
                return Err(bad(format!("stride on a single cpu in {item:?}")));
            }
            None => {
                let cpu = parse_cpu(range).map_err(&bad)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(bad(format!("reversed range {item:?}")));
        }
        // (used, group): take the first `used` cpus of every `group` cpus.
        let (used, group) = match step {
            None => (1, 1),
            Some(step) => {
                let (used, group) = match step.split_once('/') {
                    Some((u, g)) => (parse_num(u).map_err(&bad)?, parse_num(g).map_err(&bad)?),
                    None => (1, parse_num(step).map_err(&bad)?),
                };
                if used == 0 || group == 0 || used > group {
                    return Err(bad(format!("bad stride in {item:?}")));
                }
                (used, group)
            }
        };
        let mut start = first;
        while start <= last {
            let end = start.saturating_add(used - 1).min(last);
            cpus.extend(start..=end);
            match start.checked_add(group) {
                Some(next) => start = next,
                None => break,
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Parses an unsigned decimal number, rejecting everything `usize::from_str` is lenient about
/// (a leading `+`).
fn parse_num(s: &str) -> Result<usize, String> {
    if s.is_empty() {
        return Err("missing number".to_owned());
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a number: {s:?}"));
    }
    s.parse::<usize>().map_err(|_| format!("number too large: {s}"))
}

/// Parses a CPU number and checks it against [`MAX_CPUS`].
fn parse_cpu(s: &str) -> Result<usize, String> {
    let cpu = parse_num(s)?;
    if cpu >= MAX_CPUS {
        return Err(format!("cpu {cpu} not below the limit {MAX_CPUS}"));
    }
    Ok(cpu)
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The kernel's node number (what `mbind` wants); for emulated nodes, the dense index.
    pub id: usize,
    /// The node's CPUs, sorted and deduplicated. Empty for memory-only nodes (e.g. persistent
    /// memory exposed as a CPU-less node); emulated nodes may share CPUs.
    pub cpus: Vec<usize>,
}

/// The machine's nodes, as seen by numakv.
///
/// Invariant: at least one node, and at least one node with a CPU — so placement always has
/// somewhere to put a thread. Nodes are ordered by kernel id; a node's position in
/// [`nodes`](Self::nodes) is its dense index.
#[derive(Clone, Debug)]
pub struct Topology {
    nodes: Vec<Node>,
    emulated: bool,
}

impl Topology {
    /// Builds a topology, enforcing the invariant.
    fn build(nodes: Vec<Node>, emulated: bool) -> Result<Topology, NumaError> {
        if nodes.is_empty() {
            return Err(NumaError::NoNodes);
        }
        if nodes.iter().all(|n| n.cpus.is_empty()) {
            return Err(NumaError::NoCpus);
        }
        Ok(Topology { nodes, emulated })
    }

    /// The machine's topology, for when there is nothing sensible to do about a failure.
    ///
    /// Reads [`SYSFS_NODE_DIR`]; memory-only nodes are kept, without CPUs. If sysfs is absent or
    /// unreadable (containers, non-NUMA kernels), the result is a single node holding the CPUs
    /// this thread may run on (`sched_getaffinity`, else `0..available_parallelism`). That
    /// fallback is marked [emulated](Self::is_emulated): the kernel never confirmed the node
    /// exists, so [`bind_memory`](Self::bind_memory) does not try to bind against it.
    pub fn detect() -> Topology {
        if let Ok(topology) = Topology::from_sysfs(Path::new(SYSFS_NODE_DIR)) {
            return topology;
        }
        let cpus = match affinity::current_affinity() {
            Ok(cpus) if !cpus.is_empty() => cpus,
            _ => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n).collect()
            }
        };
        Topology { nodes: vec![Node { id: 0, cpus }], emulated: true }
    }

    /// Reads a directory laid out like `/sys/devices/system/node`: one `nodeN/cpulist` per node.
    ///
    /// Taking the root as a parameter makes topology handling testable against fake trees. Node
    /// ids may be sparse (`node0`, `node2`); they are kept as [`Node::id`] and the nodes are
    /// sorted by them. Entries not named `node<digits>` are ignored.
    ///
    /// # Errors
    ///
    /// [`NumaError::Io`] if the root or a node's `cpulist` cannot be read,
    /// [`NumaError::BadCpuList`] if a cpulist is malformed, [`NumaError::NoNodes`] if there is no
    /// node directory, [`NumaError::NoCpus`] if no node has a CPU.
    pub fn from_sysfs(root: &Path) -> Result<Topology, NumaError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| NumaError::Io { path, source }
        };
        let mut nodes = Vec::new();
        for entry in fs::read_dir(root).map_err(io(root))? {
            let entry = entry.map_err(io(root))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|d| d.parse::<usize>().ok())
            else {
                continue;
            };
            let path = entry.path().join("cpulist");
            let text = fs::read_to_string(&path).map_err(io(&path))?;
            nodes.push(Node { id, cpus: parse_cpulist(&text)? });
        }
        nodes.sort_by_key(|n| n.id);
        Topology::build(nodes, false)
    }

    /// A made-up topology of `nodes` nodes over `cpus`, for exercising NUMA code paths on a
    /// machine with fewer real nodes.
    ///
    /// The CPUs are split into contiguous groups as evenly as possible (the first
    /// `cpus.len() % nodes` nodes get one extra). With fewer CPUs than nodes, node `i` gets
    /// `cpus[i % cpus.len()]`, so nodes share CPUs. Node ids are the dense indices.
    ///
    /// # Errors
    ///
    /// [`NumaError::NoNodes`] if `nodes == 0`, [`NumaError::NoCpus`] if `cpus` is empty.
    pub fn emulated(nodes: usize, cpus: &[usize]) -> Result<Topology, NumaError> {
        if nodes == 0 {
            return Err(NumaError::NoNodes);
        }
        if nodes > MAX_NODES {
            return Err(NumaError::TooManyNodes { nodes, max: MAX_NODES });
        }
        if cpus.is_empty() {
            return Err(NumaError::NoCpus);
        }
        let list = if cpus.len() < nodes {
            (0..nodes).map(|i| Node { id: i, cpus: vec![cpus[i % cpus.len()]] }).collect()
        } else {
            let (base, extra) = (cpus.len() / nodes, cpus.len() % nodes);
            let mut start = 0;
            (0..nodes)
                .map(|i| {
                    let len = base + usize::from(i < extra);
                    let mut group = cpus[start..start + len].to_vec();
                    group.sort_unstable();
                    group.dedup();
                    start += len;
                    Node { id: i, cpus: group }
                })
                .collect()
        };
        Topology::build(list, true)
    }

    /// A topology of exactly `n` nodes: the machine's first `n` nodes with CPUs if it has that
    /// many, otherwise `n` emulated nodes over all of the machine's CPUs.
    ///
    /// Benchmarks use it to run "on `n` nodes" identically on big and small machines.
    ///
    /// # Errors
    ///
    /// [`NumaError::NoNodes`] if `n == 0`, [`NumaError::TooManyNodes`] if `n` is above
    /// [`MAX_NODES`] (checked before anything is sized by `n`).
    pub fn with_nodes(n: usize) -> Result<Topology, NumaError> {
        if n == 0 {
            return Err(NumaError::NoNodes);
        }
        if n > MAX_NODES {
            return Err(NumaError::TooManyNodes { nodes: n, max: MAX_NODES });
        }
        let detected = Topology::detect();
        let with_cpus: Vec<Node> =
            detected.nodes.iter().filter(|node| !node.cpus.is_empty()).cloned().collect();
        if !detected.emulated && with_cpus.len() >= n {
            return Topology::build(with_cpus.into_iter().take(n).collect(), false);
        }
        Topology::emulated(n, &detected.all_cpus())
    }

    /// All distinct CPUs, sorted.
    fn all_cpus(&self) -> Vec<usize> {
        let mut cpus: Vec<usize> = self.nodes.iter().flat_map(|n| n.cpus.iter().copied()).collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }

    /// How many nodes, including memory-only ones; dense indices run `0..node_count()`.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The nodes, indexed by dense index.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node at dense index `idx` (not the kernel id).
    pub fn node(&self, idx: usize) -> Option<&Node> {
        self.nodes.get(idx)
    }

    /// The kernel's id for dense index `idx`, the number `mbind` and `numactl` understand.
    pub fn os_node_id(&self, idx: usize) -> Option<usize> {
        self.nodes.get(idx).map(|n| n.id)
    }

    /// Whether the nodes are made up rather than the kernel's; emulated topologies are not
    /// pinned by default and never bind memory.
    pub fn is_emulated(&self) -> bool {
        self.emulated
    }

    /// How many distinct CPUs (emulated nodes may share CPUs; those count once).
    pub fn cpu_count(&self) -> usize {
        self.all_cpus().len()
    }

    /// The dense index of the first node that has `cpu`.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus.binary_search(&cpu).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::path::PathBuf;

    fn fake_sysfs(nodes: &[(&str, Option<&str>)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, cpulist) in nodes {
            let node = dir.path().join(name);
            fs::create_dir(&node).expect("mkdir");
            if let Some(list) = cpulist {
                fs::write(node.join("cpulist"), list).expect("write");
            }
        }
        // Noise that real sysfs has too.
        fs::write(dir.path().join("online"), "0-1\n").expect("write");
        fs::create_dir(dir.path().join("power")).expect("mkdir");
        dir
    }

    #[test]
    fn cpulist_examples() {
        assert_eq!(parse_cpulist("0-3,8-11").unwrap(), vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(parse_cpulist("0").unwrap(), vec![0]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("4-7,12-15\n").unwrap(), vec![4, 5, 6, 7, 12, 13, 14, 15]);
        assert_eq!(parse_cpulist("0-7:2").unwrap(), vec![0, 2, 4, 6]);
        assert_eq!(parse_cpulist("0-8:3").unwrap(), vec![0, 3, 6]);
        assert_eq!(parse_cpulist("0-9:2/4").unwrap(), vec![0, 1, 4, 5, 8, 9]);
        assert_eq!(parse_cpulist("5,1,3-4,1").unwrap(), vec![1, 3, 4, 5]);
        assert_eq!(parse_cpulist("3-3").unwrap(), vec![3]);
    }

    #[test]
    fn cpulist_garbage_rejected() {
        for bad in [
            "5-3",
            "a",
            "1,,2",
            ",",
            "1,",
            "-1",
            "1-",
            "+1",
            "1-2-3",
            "0-3:0",
            "0-3:",
            "3:2",
            "0-3:3/2",
            "0-3:0/2",
            "1 2",
            "0x1",
            "18446744073709551616",
            "0-18446744073709551615",
            "65536",
        ] {
            match parse_cpulist(bad) {
                Err(NumaError::BadCpuList { .. }) => {}
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn cpulist_roundtrip(set in proptest::collection::btree_set(0usize..4096, 0..64)) {
            // Format the set as maximal runs, the way the kernel does.
            let cpus: Vec<usize> = set.into_iter().collect();
            let mut parts = Vec::new();
            let mut i = 0;
            while i < cpus.len() {
                let mut j = i;
                while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
                    j += 1;
                }
                parts.push(if i == j {
                    cpus[i].to_string()
                } else {
                    format!("{}-{}", cpus[i], cpus[j])
                });
                i = j + 1;
            }
            let text = parts.join(",") + "\n";
            prop_assert_eq!(parse_cpulist(&text).unwrap(), cpus);
        }

        #[test]
        fn cpulist_stride_matches_step_by(a in 0usize..500, len in 0usize..500, s in 1usize..40) {
            let b = a + len;
            let want: Vec<usize> = (a..=b).step_by(s).collect();
            prop_assert_eq!(parse_cpulist(&format!("{a}-{b}:{s}")).unwrap(), want);
        }

        #[test]
        fn cpulist_garbage_never_panics(text in "[0-9,:/ a-]{0,20}") {
            // Arbitrary text either parses into a sorted set or is rejected as a bad list.
            match parse_cpulist(&text) {
                Ok(cpus) => prop_assert!(cpus.windows(2).all(|w| w[0] < w[1])),
                Err(NumaError::BadCpuList { .. }) => {}
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn cpulist_with_letter_rejected(
            set in proptest::collection::btree_set(0usize..100, 1..8),
            pos in any::<prop::sample::Index>(),
            c in "[g-zG-Z!#.]",
        ) {
            let text = set.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
            let at = pos.index(text.len() + 1);
            let bad = format!("{}{}{}", &text[..at], c, &text[at..]);
            let is_bad = matches!(parse_cpulist(&bad), Err(NumaError::BadCpuList { .. }));
            prop_assert!(is_bad);
        }
    }

    #[test]
    fn sysfs_two_nodes() {
        let dir = fake_sysfs(&[("node0", Some("0-3,8-11\n")), ("node1", Some("4-7,12-15\n"))]);
        let t = Topology::from_sysfs(dir.path()).unwrap();
        assert!(!t.is_emulated());
        assert_eq!(t.node_count(), 2);
        assert_eq!(t.node(0).unwrap().cpus, vec![0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(t.node(1).unwrap().cpus, vec![4, 5, 6, 7, 12, 13, 14, 15]);
        assert_eq!(t.cpu_count(), 16);
        assert_eq!(t.node_of_cpu(9), Some(0));
        assert_eq!(t.node_of_cpu(12), Some(1));
        assert_eq!(t.node_of_cpu(16), None);
        assert_eq!(t.os_node_id(1), Some(1));
        assert!(t.node(2).is_none());
    }

    #[test]
    fn sysfs_sparse_ids_keep_real_ids() {
        let dir = fake_sysfs(&[("node2", Some("2-3\n")), ("node0", Some("0-1\n"))]);
        let t = Topology::from_sysfs(dir.path()).unwrap();
        assert_eq!(t.node_count(), 2);
        assert_eq!(t.os_node_id(0), Some(0));
        assert_eq!(t.os_node_id(1), Some(2));
        assert_eq!(t.os_node_id(2), None);
        assert_eq!(t.node(1).unwrap(), &Node { id: 2, cpus: vec![2, 3] });
        assert_eq!(t.node_of_cpu(3), Some(1));
    }

    #[test]
    fn sysfs_memory_only_node_kept() {
        let dir = fake_sysfs(&[("node0", Some("0-1\n")), ("node1", Some("\n"))]);
        let t = Topology::from_sysfs(dir.path()).unwrap();
        assert_eq!(t.node_count(), 2);
        assert!(t.node(1).unwrap().cpus.is_empty());
        assert_eq!(t.cpu_count(), 2);
    }

    #[test]
    fn sysfs_errors() {
        let missing = PathBuf::from("/nonexistent/numakv/node");
        match Topology::from_sysfs(&missing) {
            Err(NumaError::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("{other:?}"),
        }
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(Topology::from_sysfs(empty.path()), Err(NumaError::NoNodes)));
        let no_list = fake_sysfs(&[("node0", None)]);
        assert!(matches!(Topology::from_sysfs(no_list.path()), Err(NumaError::Io { .. })));
        let garbage = fake_sysfs(&[("node0", Some("zero\n"))]);
        assert!(matches!(Topology::from_sysfs(garbage.path()), Err(NumaError::BadCpuList { .. })));
        let cpuless = fake_sysfs(&[("node0", Some("\n"))]);
        assert!(matches!(Topology::from_sysfs(cpuless.path()), Err(NumaError::NoCpus)));
    }

    #[test]
    fn node_counts_above_the_limit_are_refused_before_any_table_is_sized() {
        for n in [MAX_NODES + 1, 1 << 50, usize::MAX] {
            assert!(matches!(
                Topology::with_nodes(n),
                Err(NumaError::TooManyNodes { nodes, max: MAX_NODES }) if nodes == n
            ));
            assert!(matches!(Topology::emulated(n, &[0]), Err(NumaError::TooManyNodes { .. })));
        }
        assert_eq!(Topology::with_nodes(MAX_NODES).unwrap().node_count(), MAX_NODES);
    }

    #[test]
    fn emulated_splits() {
        let t = Topology::emulated(2, &[0, 1, 2, 3]).unwrap();
        assert!(t.is_emulated());
        assert_eq!(
            t.nodes(),
            &[Node { id: 0, cpus: vec![0, 1] }, Node { id: 1, cpus: vec![2, 3] }]
        );

        let t = Topology::emulated(4, &[0, 1]).unwrap();
        let cpus: Vec<_> = t.nodes().iter().map(|n| n.cpus.clone()).collect();
        assert_eq!(cpus, vec![vec![0], vec![1], vec![0], vec![1]]);
        assert_eq!(t.cpu_count(), 2);
        assert_eq!(t.os_node_id(3), Some(3));

        let t = Topology::emulated(2, &[0, 1, 2, 3, 4]).unwrap();
        assert_eq!(t.node(0).unwrap().cpus, vec![0, 1, 2]);
        assert_eq!(t.node(1).unwrap().cpus, vec![3, 4]);

        assert!(matches!(Topology::emulated(0, &[0]), Err(NumaError::NoNodes)));
        assert!(matches!(Topology::emulated(2, &[]), Err(NumaError::NoCpus)));
    }

    #[test]
    fn detect_and_with_nodes() {
        let t = Topology::detect();
        assert!(t.node_count() >= 1);
        assert!(t.cpu_count() >= 1);
        let one = Topology::with_nodes(1).unwrap();
        assert_eq!(one.node_count(), 1);
        let many = Topology::with_nodes(t.node_count() + 3).unwrap();
        assert_eq!(many.node_count(), t.node_count() + 3);
        assert!(many.is_emulated());
        assert_eq!(many.cpu_count(), t.cpu_count());
        assert!(matches!(Topology::with_nodes(0), Err(NumaError::NoNodes)));
    }

    #[test]
    fn detect_matches_sysfs_when_present() {
        let root = Path::new(SYSFS_NODE_DIR);
        if let Ok(t) = Topology::from_sysfs(root) {
            let d = Topology::detect();
            assert!(!d.is_emulated());
            assert_eq!(d.nodes(), t.nodes());
        }
    }
}
