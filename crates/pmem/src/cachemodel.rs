//! A model of per-node last-level caches with coherence: PM accesses counted the way a socket's
//! hardware counters see them.
//!
//! Line accounting ([`crate::account`]) counts every distinct line an operation touches: what a
//! structure asks of memory. The papers' "remote memory accesses" come from hardware counters,
//! which see only what misses the caches: a tree's hot upper levels are served by the LLC, while a
//! line that another socket has just written, or that a `clflush` has evicted, goes over the
//! interconnect or to memory. This model replays the accesses of every thread, in the order they
//! reach it, through one set-associative LRU cache per node and a directory of which nodes hold
//! each line, and counts what would leave a node's cache.
//!
//! # Protocol (MESI-like, one cache per node, the cores' private caches folded into it)
//!
//! - A read by node `n` of a line in `n`'s cache hits.
//! - A read miss is served by another node's cache when that node holds the line dirty (a remote
//!   *transfer*; the owner's copy is written back to the line's home and stays, clean), otherwise
//!   by the home node's memory (a *memory read*, local or remote to `n`). `n` then holds a copy.
//! - A write by `n` first reads the line as above if `n` does not hold it (read for ownership),
//!   then invalidates the other nodes' copies: `n` holds the only copy, dirty.
//! - A flush writes a dirty copy back to the line's home (a *writeback*, local when the owner is
//!   the home node). [`FlushKind::Clflush`] also drops every copy, as `clflush` and
//!   `clflushopt` do (the F3-tree paper's Ivy Bridge machine has nothing else);
//!   [`FlushKind::Clwb`] keeps them.
//! - Evicting a dirty line (LRU within its set) writes it back.
//!
//! Remote, for a socket's counters, is a memory read from another node, a transfer from another
//! node's cache, or a writeback to another node's memory ([`CacheStats::remote`]).
//!
//! What it leaves out: DRAM (only PM lines are reported to accounting), prefetchers, the cores'
//! private caches, and clean cache-to-cache forwarding (a clean line missing here is read from
//! its home). The order of events is the order in which threads take the model's lock, which is
//! an order the hardware could have produced.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;

use crate::account::LineHasher;
use crate::persist::LINE;

/// What a flush does to the cached copies of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushKind {
    /// Write back and invalidate every copy (`clflush`, `clflushopt`).
    Clflush,
    /// Write back and keep the copies (`clwb` on hardware that retains the line).
    Clwb,
}

impl fmt::Display for FlushKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushKind::Clflush => "clflush",
            FlushKind::Clwb => "clwb",
        })
    }
}

/// Shape of every node's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Capacity of one node's cache in bytes (a multiple of `ways` lines).
    pub bytes_per_node: usize,
    /// Associativity.
    pub ways: usize,
    /// What a flush does to cached copies.
    pub flush: FlushKind,
}

impl CacheConfig {
    /// One socket of the F3-tree paper's machine (papers/f3tree.txt §5.1: four Xeon E5-4640 v2,
    /// 80 MiB of LLC in all): 20 MiB, 20-way, `clflush` only.
    pub const XEON_E5_4640_V2: CacheConfig =
        CacheConfig { bytes_per_node: 20 << 20, ways: 20, flush: FlushKind::Clflush };

    /// The same cache with a flush that keeps the line (`clwb` on later Xeons).
    pub const fn with_flush(self, flush: FlushKind) -> CacheConfig {
        CacheConfig { flush, ..self }
    }

    fn sets(&self) -> usize {
        (self.bytes_per_node / LINE / self.ways.max(1)).max(1)
    }
}

impl fmt::Display for CacheConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} MiB {}-way, {}", self.bytes_per_node >> 20, self.ways, self.flush)
    }
}

/// What the model counted (see the module docs for each event).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Accesses served by the accessing node's cache.
    pub hits: u64,
    /// Misses served by the accessing node's memory.
    pub memory_reads_local: u64,
    /// Misses served by another node's memory.
    pub memory_reads_remote: u64,
    /// Misses served by another node's cache (the line was dirty there).
    pub transfers_remote: u64,
    /// Dirty lines written back to the owner node's memory.
    pub writebacks_local: u64,
    /// Dirty lines written back to another node's memory.
    pub writebacks_remote: u64,
    /// Writes that invalidated copies in other nodes' caches.
    pub invalidations: u64,
}

impl CacheStats {
    /// Accesses that cross nodes: remote memory reads, remote transfers, remote writebacks.
    pub fn remote(&self) -> u64 {
        self.memory_reads_remote + self.transfers_remote + self.writebacks_remote
    }

    /// Every access that left a node's cache: misses and writebacks.
    pub fn memory_accesses(&self) -> u64 {
        self.memory_reads_local
            + self.memory_reads_remote
            + self.transfers_remote
            + self.writebacks_local
            + self.writebacks_remote
    }

    /// Counts a dirty line written back by node `owner` to node `home`'s memory.
    fn writeback(&mut self, owner: u8, home: u8) {
        if owner == home {
            self.writebacks_local += 1;
        } else {
            self.writebacks_remote += 1;
        }
    }

    /// Remote share of [`CacheStats::memory_accesses`] (0 when there were none).
    pub fn remote_share(&self) -> f64 {
        let all = self.memory_accesses();
        if all == 0 {
            0.0
        } else {
            self.remote() as f64 / all as f64
        }
    }
}

/// An access the model replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A load from the line.
    Read,
    /// A store to the line.
    Write,
    /// A cache-line flush of the line.
    Flush,
}

/// Most nodes the directory's holder masks can name.
pub const MAX_NODES: usize = 64;

/// Directory entry of a line held by at least one cache.
#[derive(Clone, Copy, Debug)]
struct Line {
    /// Nodes whose cache holds the line (bit per node).
    holders: u64,
    /// The node holding it dirty, if any (then the only holder).
    dirty: Option<u8>,
    /// The node whose memory the line belongs to.
    home: u8,
}

/// One node's cache: `sets` sets of at most `ways` (line, last use) pairs.
#[derive(Debug)]
struct NodeCache {
    sets: Vec<Vec<(usize, u64)>>,
    clock: u64,
}

impl NodeCache {
    fn new(sets: usize) -> NodeCache {
        NodeCache { sets: (0..sets).map(|_| Vec::new()).collect(), clock: 0 }
    }

    fn set_of(&self, line: usize) -> usize {
        // Fibonacci hashing of the line number: consecutive lines spread over the sets, as the
        // hardware's address hash spreads them over slices.
        let h = ((line / LINE) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 24) as usize % self.sets.len()
    }

    /// Marks `line` used now; false when it is not here.
    fn touch(&mut self, line: usize) -> bool {
        self.clock += 1;
        let (clock, s) = (self.clock, self.set_of(line));
        match self.sets[s].iter_mut().find(|e| e.0 == line) {
            Some(e) => {
                e.1 = clock;
                true
            }
            None => false,
        }
    }

    /// Adds `line` (not present), returning the least recently used line of a full set.
    fn fill(&mut self, line: usize, ways: usize) -> Option<usize> {
        self.clock += 1;
        let (clock, s) = (self.clock, self.set_of(line));
        let set = &mut self.sets[s];
        if set.len() < ways {
            set.push((line, clock));
            return None;
        }
        let lru = set.iter().enumerate().min_by_key(|(_, e)| e.1).map(|(i, _)| i)?;
        let victim = set[lru].0;
        set[lru] = (line, clock);
        Some(victim)
    }

    fn remove(&mut self, line: usize) {
        let s = self.set_of(line);
        self.sets[s].retain(|e| e.0 != line);
    }
}

/// Per-node caches and their directory; feed it with [`CacheModel::access`].
#[derive(Debug)]
pub struct CacheModel {
    config: CacheConfig,
    caches: Vec<NodeCache>,
    lines: HashMap<usize, Line, BuildHasherDefault<LineHasher>>,
    stats: CacheStats,
}

impl CacheModel {
    /// Empty caches of `config`'s shape (created per node on first use).
    pub fn new(config: CacheConfig) -> CacheModel {
        CacheModel {
            config,
            caches: Vec::new(),
            lines: HashMap::default(),
            stats: CacheStats::default(),
        }
    }

    /// The shape this model was built with.
    pub fn config(&self) -> CacheConfig {
        self.config
    }

    /// What was counted so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Replays one access to the line at `line` (64-byte aligned) whose memory is on node
    /// `home`, made by a thread of node `node`. Nodes at or above [`MAX_NODES`] are ignored.
    pub fn access(&mut self, line: usize, home: usize, node: usize, kind: Access) {
        if node >= MAX_NODES || home >= MAX_NODES {
            return;
        }
        let line = line & !(LINE - 1);
        while self.caches.len() <= node {
            self.caches.push(NodeCache::new(self.config.sets()));
        }
        match kind {
            Access::Read => self.read(line, home, node),
            Access::Write => self.write(line, home, node),
            Access::Flush => self.flush(line),
        }
    }

    fn holds(&mut self, line: usize, node: usize) -> bool {
        let listed = self.lines.get(&line).is_some_and(|l| l.holders & (1 << node) != 0);
        // The directory and the caches agree; touching also refreshes the LRU position.
        listed && self.caches[node].touch(line)
    }

    /// A miss of `node`: counts where the line comes from and gives `node` a copy.
    fn miss(&mut self, line: usize, home: usize, node: usize) {
        let entry =
            self.lines.entry(line).or_insert(Line { holders: 0, dirty: None, home: home as u8 });
        match entry.dirty {
            Some(owner) if owner as usize != node => {
                self.stats.transfers_remote += 1;
                // The owner's copy becomes clean: its data goes home too.
                self.stats.writeback(owner, entry.home);
                entry.dirty = None;
            }
            _ if entry.home as usize == node => self.stats.memory_reads_local += 1,
            _ => self.stats.memory_reads_remote += 1,
        }
        entry.holders |= 1 << node;
        if let Some(victim) = self.caches[node].fill(line, self.config.ways) {
            self.evict(victim, node);
        }
    }

    /// `victim` left `node`'s cache: written back if dirty there, forgotten when nobody holds it.
    fn evict(&mut self, victim: usize, node: usize) {
        let Some(l) = self.lines.get_mut(&victim) else { return };
        l.holders &= !(1 << node);
        if let Some(owner) = l.dirty.take_if(|&mut o| o as usize == node) {
            self.stats.writeback(owner, l.home);
        }
        if l.holders == 0 {
            self.lines.remove(&victim);
        }
    }

    /// Gives `node` a copy of the line: a hit, or a miss served as the module docs say.
    fn read(&mut self, line: usize, home: usize, node: usize) {
        if self.holds(line, node) {
            self.stats.hits += 1;
        } else {
            self.miss(line, home, node);
        }
    }

    fn write(&mut self, line: usize, home: usize, node: usize) {
        // Read for ownership, then take the only copy.
        self.read(line, home, node);
        let Some(l) = self.lines.get_mut(&line) else { return };
        let others = l.holders & !(1 << node);
        if others != 0 {
            self.stats.invalidations += 1;
            // A dirty copy elsewhere was already transferred (and cleaned) by the miss.
            for n in (0..self.caches.len()).filter(|n| others & (1 << n) != 0) {
                self.caches[n].remove(line);
            }
        }
        l.holders = 1 << node;
        l.dirty = Some(node as u8);
    }

    fn flush(&mut self, line: usize) {
        let Some(l) = self.lines.get_mut(&line) else { return };
        if let Some(owner) = l.dirty.take() {
            self.stats.writeback(owner, l.home);
        }
        if self.config.flush == FlushKind::Clflush {
            let holders = l.holders;
            self.lines.remove(&line);
            for n in (0..self.caches.len()).filter(|n| holders & (1 << n) != 0) {
                self.caches[n].remove(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Access::*;

    const BIG: CacheConfig =
        CacheConfig { bytes_per_node: 1 << 20, ways: 16, flush: FlushKind::Clwb };

    #[test]
    fn a_second_read_hits_and_a_first_read_goes_to_the_home_node() {
        let mut m = CacheModel::new(BIG);
        m.access(0, 0, 0, Read);
        m.access(0, 0, 0, Read);
        m.access(64, 1, 0, Read);
        let s = m.stats();
        assert_eq!((s.hits, s.memory_reads_local, s.memory_reads_remote), (1, 1, 1));
        assert_eq!(s.remote(), 1);
    }

    #[test]
    fn a_line_dirty_in_another_node_is_transferred_and_written_home() {
        let mut m = CacheModel::new(BIG);
        m.access(0, 0, 1, Write); // node 1 writes a node-0 line: remote read for ownership
        m.access(0, 0, 0, Read); // node 0 reads it: transfer from node 1, written back home
        let s = m.stats();
        assert_eq!(s.memory_reads_remote, 1);
        assert_eq!(s.transfers_remote, 1);
        assert_eq!(s.writebacks_remote, 1, "node 1's dirty copy goes to node 0's memory");
        // Both now hold it clean: reads hit on both sides.
        m.access(0, 0, 0, Read);
        m.access(0, 0, 1, Read);
        assert_eq!(m.stats().hits, 2);
    }

    #[test]
    fn a_write_invalidates_the_other_copies() {
        let mut m = CacheModel::new(BIG);
        m.access(0, 0, 0, Read);
        m.access(0, 0, 1, Read);
        m.access(0, 0, 0, Write); // hit, invalidates node 1's copy
        assert_eq!(m.stats().invalidations, 1);
        m.access(0, 0, 1, Read); // miss: transfer from node 0, which holds it dirty
        let s = m.stats();
        assert_eq!(s.transfers_remote, 1);
        assert_eq!(s.writebacks_local, 1, "node 0 owned a node-0 line");
    }

    #[test]
    fn flushes_write_back_dirty_lines_and_clflush_drops_them() {
        for flush in [FlushKind::Clwb, FlushKind::Clflush] {
            let mut m = CacheModel::new(BIG.with_flush(flush));
            m.access(0, 1, 0, Write);
            m.access(0, 1, 0, Flush);
            m.access(0, 1, 0, Flush); // clean now: nothing to write back
            let s = m.stats();
            assert_eq!(s.writebacks_remote, 1, "{flush}");
            m.access(0, 1, 0, Read);
            let s = m.stats();
            match flush {
                FlushKind::Clwb => assert_eq!(s.hits, 1, "clwb keeps the line"),
                FlushKind::Clflush => {
                    assert_eq!(s.memory_reads_remote, 2, "clflush dropped it: read again")
                }
            }
        }
    }

    #[test]
    fn the_least_recently_used_line_of_a_full_set_is_evicted_and_written_back() {
        // One set of two ways: every line maps to it.
        let tiny = CacheConfig { bytes_per_node: 2 * LINE, ways: 2, flush: FlushKind::Clwb };
        let mut m = CacheModel::new(tiny);
        m.access(0, 0, 0, Write);
        m.access(64, 0, 0, Read);
        m.access(0, 0, 0, Read); // line 0 used last: line 64 is the LRU
        m.access(128, 0, 0, Read); // evicts 64 (clean)
        assert_eq!(m.stats().writebacks_local, 0);
        m.access(256, 0, 0, Read); // evicts 0 (dirty)
        assert_eq!(m.stats().writebacks_local, 1);
        m.access(0, 0, 0, Read);
        assert_eq!(m.stats().memory_reads_local, 5, "0, 64, 128, 256, then 0 again");
        assert!(m.lines.len() <= 2, "the directory forgets lines nobody holds");
    }

    #[test]
    fn remote_share_counts_misses_and_writebacks() {
        let mut m = CacheModel::new(BIG);
        m.access(0, 0, 0, Read);
        m.access(64, 1, 0, Write);
        m.access(64, 1, 0, Flush);
        let s = m.stats();
        assert_eq!(s.memory_accesses(), 3);
        assert_eq!(s.remote(), 2);
        assert!((s.remote_share() - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(CacheStats::default().remote_share(), 0.0);
    }

    #[test]
    fn nodes_past_the_mask_are_ignored() {
        let mut m = CacheModel::new(BIG);
        m.access(0, 0, MAX_NODES, Read);
        m.access(0, MAX_NODES, 0, Read);
        assert_eq!(m.stats(), CacheStats::default());
    }
}
