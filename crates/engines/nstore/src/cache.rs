//! The RAF (Remote Access First) cache of papers/nstore.txt §III-B.
//!
//! A DRAM hash table of buckets with [`WAYS`] slots `{TF, node id, key, value}` each (the
//! bucket's mutex is the slots' lock). An access to an item stored on node `i` from a thread on
//! node `y` adds `l(i←y) / l(i←i)` to the item's TF (eq. 2): remote accesses weigh more, so items
//! that remote threads read stay cached. The weights come from the latency model (remote / local
//! read latency); [`CacheMode::Lfu`] weighs every access 1 (plain LFU, for comparison).
//!
//! - **Sampling**: only every `cache_sample`-th get of a thread (32 by default) updates a TF or
//!   admits a missed item; the others just look up.
//! - **Replacement**: a sampled miss replaces the bucket's coldest slot (smallest TF).
//! - **Overflow**: a TF that would pass [`TF_MAX`] halves every TF of its bucket.
//! - **Coherence**: a write bumps its bucket's epoch and then updates (or, for a delete, drops)
//!   the cached item; an admission checks that the epoch did not move since the miss, so a value
//!   read before a concurrent write is never cached after it (argument at [`Cache::admit`]).
//! - **Switching** (§III-B, three signals): per window of sampled operations, the cache is turned
//!   off when (1) fewer than 10 % of the window's gets hit it, (2) the hits are spread over items
//!   of similar TF (no item is markedly hotter than its admission weight), or (3) gets are fewer
//!   than 10 % of all operations. While off it is empty and not consulted. Switched off for (3),
//!   it is turned on again by the first window whose gets are back above 10 % of the operations;
//!   switched off for (1) or (2), it is retried after `backoff` read-heavy windows (1, doubling
//!   on every retry judged uniform again, at most [`MAX_BACKOFF`]; reset once a judged window
//!   keeps it on). Every time it is turned on it is judged again after a warm-up window.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use numakv_pmem::{account, LatencyModel};
use parking_lot::Mutex;

use crate::NStoreOptions;

/// Slots per bucket.
pub const WAYS: usize = 8;
/// Fixed-point unit of TF: an access of weight 1 adds this much.
const UNIT: u32 = 16;
/// A TF that would exceed this halves its bucket.
pub const TF_MAX: u32 = 1 << 20;
/// Sampled operations per switching window.
const WINDOW: u64 = 1024;
/// A hit on an item with at least this TF counts as a "hot" hit (signal 2).
const HOT_TF: u32 = 4 * UNIT;
/// Off because gets were under 10 % of the operations (signal 3, write-intensive).
const OFF_WRITES: u32 = 1;
/// Off because the gets looked uniform (signal 1 or 2).
const OFF_UNIFORM: u32 = 2;
/// Most read-heavy windows a uniform switch-off waits before retrying the cache.
pub const MAX_BACKOFF: u32 = 64;

/// Which cache sits in front of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// RAF: accesses weighted by the latency ratio of reader to owner node (the paper's).
    #[default]
    Raf,
    /// Plain LFU: every access weighs 1 (the comparison of Figs. 10–11).
    Lfu,
    /// No cache.
    Off,
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheMode::Raf => "raf",
            CacheMode::Lfu => "lfu",
            CacheMode::Off => "off",
        })
    }
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "raf" => Ok(CacheMode::Raf),
            "lfu" => Ok(CacheMode::Lfu),
            "off" | "none" => Ok(CacheMode::Off),
            other => Err(format!("unknown cache mode {other:?} (choices: raf, lfu, off)")),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// 0 = empty (0 is never a user key).
    key: u64,
    value: u64,
    tf: u32,
    /// Node that holds the item's log entry.
    node: u32,
}

/// A slot as the bucket stores it: atomics, so that an unsampled probe may read them without
/// the bucket's lock (a seqlock read, [`Bucket::peek`]).
#[derive(Debug, Default)]
struct AtomicSlot {
    key: AtomicU64,
    value: AtomicU64,
    tf: AtomicU32,
    node: AtomicU32,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Bumped by every write to a key of the bucket (see [`Cache::admit`]).
    epoch: AtomicU64,
    /// Occupied slots plus admissions in progress; writers skip the lock when 0.
    len: AtomicU32,
    /// Seqlock word of `slots`: odd while a holder of `lock` stores changed slots, bumped to
    /// the next even value when done. A state machine of two states per value: even = stable,
    /// odd = being written.
    seq: AtomicU64,
    /// Serialises every change of `slots` (and the sampled probes, admissions and writes).
    lock: Mutex<()>,
    slots: [AtomicSlot; WAYS],
}

impl Bucket {
    /// Takes the bucket's lock: the slots as a plain array, stored back on drop if changed.
    fn lock(&self) -> Locked<'_> {
        let guard = self.lock.lock();
        // Under the lock nobody else stores slots: Relaxed loads see the last stores.
        let slots = std::array::from_fn(|i| {
            let s = &self.slots[i];
            Slot {
                key: s.key.load(Ordering::Relaxed),
                value: s.value.load(Ordering::Relaxed),
                tf: s.tf.load(Ordering::Relaxed),
                node: s.node.load(Ordering::Relaxed),
            }
        });
        Locked { bucket: self, _guard: guard, slots, dirty: false }
    }

    /// A lock-free lookup of `key`: `Some(value if cached)` from a consistent view of the
    /// slots, `None` when a writer was storing slots meanwhile (the caller takes the lock).
    fn peek(&self, key: u64) -> Option<Option<u64>> {
        // ORDERING: Acquire; pairs with the Release store that ended the last write, so the
        // slot loads below see at least that write.
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let mut found = None;
        for s in &self.slots {
            if s.key.load(Ordering::Relaxed) == key {
                found = Some(s.value.load(Ordering::Relaxed));
                break;
            }
        }
        // ORDERING: the Acquire fence orders the slot loads before the re-read of `seq`: if a
        // writer's store was seen, its odd `seq` (stored before it, behind a Release fence) is
        // seen too, and the view is dropped.
        std::sync::atomic::fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == s1).then_some(found)
    }
}

/// The slots of a locked bucket ([`Bucket::lock`]).
struct Locked<'a> {
    bucket: &'a Bucket,
    _guard: parking_lot::MutexGuard<'a, ()>,
    slots: [Slot; WAYS],
    dirty: bool,
}

impl std::ops::Deref for Locked<'_> {
    type Target = [Slot; WAYS];
    fn deref(&self) -> &[Slot; WAYS] {
        &self.slots
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut [Slot; WAYS] {
        self.dirty = true;
        &mut self.slots
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if !self.dirty {
            return;
        }
        let b = self.bucket;
        let seq = b.seq.load(Ordering::Relaxed);
        // ORDERING: odd first, then a Release fence: a peek that sees any slot store below
        // also sees the odd value (or a later one) on its re-read.
        b.seq.store(seq + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (a, s) in b.slots.iter().zip(&self.slots) {
            a.key.store(s.key, Ordering::Relaxed);
            a.value.store(s.value, Ordering::Relaxed);
            a.tf.store(s.tf, Ordering::Relaxed);
            a.node.store(s.node, Ordering::Relaxed);
        }
        // ORDERING: Release; pairs with the Acquire load that starts a peek.
        b.seq.store(seq + 2, Ordering::Release);
    }
}

/// Shards of the hit and miss counters (a thread always counts into one).
const COUNTER_SHARDS: usize = 16;

/// Hit and miss counts, sharded by thread so that readers on different cores do not contend on
/// one counter line.
#[derive(Debug, Default)]
struct Sharded([CachePadded<AtomicU64>; COUNTER_SHARDS]);

impl Sharded {
    fn add(&self) {
        // ORDERING: Relaxed; a statistic.
        self.0[SHARD.with(|s| *s)].fetch_add(1, Ordering::Relaxed);
    }
    fn sum(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// The next thread's counter shard.
static NEXT_SHARD: AtomicU32 = AtomicU32::new(0);

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Cached value.
    Hit(u64),
    /// Not cached; `admit` says this get is sampled, `epoch` is the bucket's epoch to pass to
    /// [`Cache::admit`].
    Miss { epoch: u64, admit: bool },
    /// The cache is switched off.
    Off,
}

thread_local! {
    /// This thread's gets (probes), for "every `sample`-th get".
    static TICK: Cell<u32> = const { Cell::new(0) };
    /// This thread's writes, sampled apart from its gets: a shared counter made "every 32nd
    /// get" every 32nd operation, so a mixed workload sampled (and admitted) fewer gets.
    static WRITE_TICK: Cell<u32> = const { Cell::new(0) };
    static SHARD: usize =
        NEXT_SHARD.fetch_add(1, Ordering::Relaxed) as usize % COUNTER_SHARDS;
}

/// The cache.
#[derive(Debug)]
pub(crate) struct Cache {
    buckets: Box<[Bucket]>,
    /// `owner * nodes + reader` → weight in [`UNIT`]s.
    weights: Vec<u32>,
    nodes: usize,
    sample: u32,
    enabled: AtomicBool,
    /// Windows since the cache was last switched on (judged from 1 on).
    warm: AtomicU32,
    /// Why it is off: [`OFF_WRITES`] or [`OFF_UNIFORM`] (0 while on).
    off_reason: AtomicU32,
    /// Read-heavy windows seen since a uniform switch-off.
    off_windows: AtomicU32,
    /// Read-heavy windows to wait after a uniform switch-off before trying the cache again;
    /// doubles (up to [`MAX_BACKOFF`]) each time a retry is judged uniform again, back to 1
    /// once a judged window keeps the cache on.
    backoff: AtomicU32,
    win_ops: AtomicU64,
    win_gets: AtomicU64,
    win_hits: AtomicU64,
    win_hot: AtomicU64,
    hits: Sharded,
    misses: Sharded,
    admissions: AtomicU64,
    switches_off: AtomicU64,
    switches_on: AtomicU64,
}

impl Cache {
    /// The cache `opts` ask for on `nodes` nodes, `None` for [`CacheMode::Off`].
    pub(crate) fn new(opts: &NStoreOptions, nodes: usize) -> Option<Cache> {
        if opts.cache == CacheMode::Off {
            return None;
        }
        let slot = std::mem::size_of::<Slot>() as u64;
        let buckets = (opts.cache_bytes / (slot * WAYS as u64)).max(1) as usize;
        let ratio = match opts.cache {
            CacheMode::Lfu => 1.0,
            _ => {
                let m = opts.raf_latency.unwrap_or_else(account::latency);
                let m = if m.is_none() { LatencyModel::OPTANE } else { m };
                m.remote_read_ratio()
            }
        };
        let remote = (f64::from(UNIT) * ratio).round() as u32;
        let weights = (0..nodes * nodes)
            .map(|i| if i / nodes == i % nodes { UNIT } else { remote.max(1) })
            .collect();
        Some(Cache {
            buckets: (0..buckets).map(|_| Bucket::default()).collect(),
            weights,
            nodes,
            sample: opts.cache_sample,
            enabled: AtomicBool::new(true),
            warm: AtomicU32::new(0),
            off_reason: AtomicU32::new(0),
            off_windows: AtomicU32::new(0),
            backoff: AtomicU32::new(1),
            win_ops: AtomicU64::new(0),
            win_gets: AtomicU64::new(0),
            win_hits: AtomicU64::new(0),
            win_hot: AtomicU64::new(0),
            hits: Sharded::default(),
            misses: Sharded::default(),
            admissions: AtomicU64::new(0),
            switches_off: AtomicU64::new(0),
            switches_on: AtomicU64::new(0),
        })
    }

    /// Whether gets consult the cache now.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn bucket(&self, key: u64) -> &Bucket {
        &self.buckets[(crate::hash(key) as usize) % self.buckets.len()]
    }

    fn weight(&self, owner: usize, reader: usize) -> u32 {
        self.weights.get(owner * self.nodes + reader).copied().unwrap_or(UNIT)
    }

    /// True on this thread's every `sample`-th get.
    fn sampled(&self) -> bool {
        Self::every(&TICK, self.sample)
    }

    /// True on every `sample`-th call with the thread-local counter `tick`.
    fn every(tick: &'static std::thread::LocalKey<Cell<u32>>, sample: u32) -> bool {
        tick.with(|t| {
            let n = t.get().wrapping_add(1);
            t.set(n);
            n % sample == 0
        })
    }

    /// Looks `key` up for a get from `reader`'s node.
    pub(crate) fn probe(&self, key: u64, reader: usize) -> Probe {
        let sampled = self.sampled();
        if !self.enabled() {
            if sampled {
                self.window(true, false, false);
            }
            return Probe::Off;
        }
        let b = self.bucket(key);
        // ORDERING: SeqCst; see `admit`.
        let epoch = b.epoch.load(Ordering::SeqCst);
        if !sampled {
            // No TF to update: a lock-free look (a seqlock read of the slots; as current as a
            // look under the lock at the moment of the read).
            if let Some(found) = b.peek(key) {
                return match found {
                    Some(v) => {
                        self.hits.add();
                        Probe::Hit(v)
                    }
                    None => {
                        self.misses.add();
                        Probe::Miss { epoch, admit: false }
                    }
                };
            }
        }
        let mut slots = b.lock();
        if let Some(i) = slots.iter().position(|s| s.key == key) {
            let v = slots[i].value;
            let mut hot = false;
            if sampled {
                let w = self.weight(slots[i].node as usize, reader);
                hot = slots[i].tf >= HOT_TF;
                if slots[i].tf.saturating_add(w) > TF_MAX {
                    for s in slots.iter_mut() {
                        s.tf /= 2;
                    }
                }
                slots[i].tf += w;
            }
            drop(slots);
            self.hits.add();
            if sampled {
                self.window(true, true, hot);
            }
            return Probe::Hit(v);
        }
        drop(slots);
        self.misses.add();
        if sampled {
            self.window(true, false, false);
        }
        Probe::Miss { epoch, admit: sampled }
    }

    /// Caches `key → value` (stored on node `owner`, read from `reader`'s node) after a sampled
    /// miss whose probe saw bucket epoch `epoch`, replacing the bucket's coldest item.
    ///
    /// Coherence: a writer (1) updates the index, (2) bumps the epoch, (3) reads `len` and, if
    /// non-zero, fixes the cached item under the lock. An admission (a) increments `len`, (b)
    /// checks the epoch, (c) inserts — all under the lock. With SeqCst on (2), (3), (a), (b):
    /// if (b) precedes (2) in the total order, then (a) precedes (3), the writer sees `len > 0`
    /// and fixes the item after the admission releases the lock; otherwise (b) sees the new
    /// epoch and the admission — whose value may predate the write — is abandoned. A value read
    /// after (1) is current either way.
    pub(crate) fn admit(&self, key: u64, value: u64, owner: usize, reader: usize, epoch: u64) {
        let b = self.bucket(key);
        let mut slots = b.lock();
        // ORDERING: SeqCst; see above.
        b.len.fetch_add(1, Ordering::SeqCst);
        if b.epoch.load(Ordering::SeqCst) != epoch || slots.iter().any(|s| s.key == key) {
            b.len.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let coldest = (0..WAYS).min_by_key(|&i| (slots[i].key != 0, slots[i].tf)).unwrap_or(0);
        if slots[coldest].key != 0 {
            // A replacement: the count of occupied slots is unchanged.
            b.len.fetch_sub(1, Ordering::SeqCst);
        }
        slots[coldest] = Slot { key, value, tf: self.weight(owner, reader), node: owner as u32 };
        self.admissions.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps the cache coherent with a write of `key`: `Some((value, node))` after an update,
    /// `None` after a delete. Called after the index was updated.
    pub(crate) fn on_write(&self, key: u64, new: Option<(u64, usize)>) {
        let b = self.bucket(key);
        // ORDERING: SeqCst; see `admit`.
        b.epoch.fetch_add(1, Ordering::SeqCst);
        if b.len.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut slots = b.lock();
        if let Some(i) = slots.iter().position(|s| s.key == key) {
            match new {
                Some((value, node)) => {
                    slots[i].value = value;
                    slots[i].node = node as u32;
                }
                None => {
                    slots[i] = Slot::default();
                    b.len.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
    }

    /// Counts a write toward the switching window (sampled like gets).
    pub(crate) fn tick_write(&self) {
        if Self::every(&WRITE_TICK, self.sample) {
            self.window(false, false, false);
        }
    }

    /// Records one sampled operation; the thread that completes a window judges it.
    fn window(&self, get: bool, hit: bool, hot: bool) {
        // ORDERING: Relaxed throughout: the window counters are statistics; a judgement that
        // races with stragglers of the previous window is off by a few samples.
        if get {
            self.win_gets.fetch_add(1, Ordering::Relaxed);
        }
        if hit {
            self.win_hits.fetch_add(1, Ordering::Relaxed);
        }
        if hot {
            self.win_hot.fetch_add(1, Ordering::Relaxed);
        }
        let n = self.win_ops.fetch_add(1, Ordering::Relaxed) + 1;
        if n % WINDOW != 0 {
            return;
        }
        let gets = self.win_gets.swap(0, Ordering::Relaxed);
        let hits = self.win_hits.swap(0, Ordering::Relaxed);
        let hot = self.win_hot.swap(0, Ordering::Relaxed);
        let ops = WINDOW;
        let read_heavy = gets * 10 >= ops;
        if self.enabled() {
            let warm = self.warm.fetch_add(1, Ordering::Relaxed) >= 1;
            let low_hits = gets > 0 && hits * 10 < gets; // signal 1
            let flat = hits > 0 && hot * 10 < hits; // signal 2
            if !read_heavy {
                self.off_reason.store(OFF_WRITES, Ordering::Relaxed);
                self.switch(false);
            } else if warm && (low_hits || flat) {
                self.off_reason.store(OFF_UNIFORM, Ordering::Relaxed);
                self.off_windows.store(0, Ordering::Relaxed);
                self.switch(false);
            } else if warm {
                self.backoff.store(1, Ordering::Relaxed);
            }
        } else if read_heavy {
            if self.off_reason.load(Ordering::Relaxed) == OFF_WRITES {
                self.switch(true);
            } else {
                // Uniform: the gets are still there, but caching did not pay. Retry after a
                // growing number of windows, so that a workload that turns skewed gets its
                // cache back while a uniform one pays for one judged window in `backoff`.
                let waited = self.off_windows.fetch_add(1, Ordering::Relaxed) + 1;
                let backoff = self.backoff.load(Ordering::Relaxed);
                if waited >= backoff {
                    self.backoff.store((backoff * 2).min(MAX_BACKOFF), Ordering::Relaxed);
                    self.switch(true);
                }
            }
        } else {
            self.off_reason.store(OFF_WRITES, Ordering::Relaxed);
        }
    }

    fn switch(&self, on: bool) {
        if self.enabled.swap(on, Ordering::Relaxed) == on {
            return;
        }
        if on {
            self.warm.store(0, Ordering::Relaxed);
            self.off_reason.store(0, Ordering::Relaxed);
            self.switches_on.fetch_add(1, Ordering::Relaxed);
        } else {
            self.switches_off.fetch_add(1, Ordering::Relaxed);
            // Empty it, so that writers skip the buckets while it is off.
            for b in self.buckets.iter() {
                let mut slots = b.lock();
                b.epoch.fetch_add(1, Ordering::SeqCst);
                let n = slots.iter().filter(|s| s.key != 0).count() as u32;
                *slots = [Slot::default(); WAYS];
                b.len.fetch_sub(n, Ordering::SeqCst);
            }
        }
    }

    /// Items cached now.
    pub(crate) fn items(&self) -> u64 {
        self.buckets.iter().map(|b| b.lock().iter().filter(|s| s.key != 0).count() as u64).sum()
    }

    /// Counters for `stats()`.
    pub(crate) fn counters(&self) -> Vec<(&'static str, u64)> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("cache_hits", self.hits.sum()),
            ("cache_misses", self.misses.sum()),
            ("cache_admissions", g(&self.admissions)),
            ("cache_switched_off", g(&self.switches_off)),
            ("cache_switched_on", g(&self.switches_on)),
            ("cache_enabled", u64::from(self.enabled())),
            ("cache_items", self.items()),
        ]
    }

    /// DRAM bytes.
    pub(crate) fn dram_bytes(&self) -> u64 {
        (self.buckets.len() * std::mem::size_of::<Bucket>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(mode: CacheMode, sample: u32) -> Cache {
        let opts = NStoreOptions {
            cache: mode,
            cache_bytes: 64 * 1024,
            cache_sample: sample,
            raf_latency: Some(LatencyModel::OPTANE),
            ..Default::default()
        };
        Cache::new(&opts, 2).unwrap()
    }

    #[test]
    fn raf_weighs_remote_reads_more_than_lfu() {
        let raf = cache(CacheMode::Raf, 1);
        assert_eq!(raf.weight(0, 0), UNIT);
        assert_eq!(raf.weight(0, 1), (16.0f64 * 181.0 / 113.0).round() as u32);
        let lfu = cache(CacheMode::Lfu, 1);
        assert_eq!(lfu.weight(0, 1), UNIT);
    }

    #[test]
    fn miss_admit_hit_update_delete() {
        let c = cache(CacheMode::Raf, 1);
        let Probe::Miss { epoch, admit: true } = c.probe(9, 0) else { panic!("expected a miss") };
        c.admit(9, 90, 1, 0, epoch);
        assert_eq!(c.probe(9, 0), Probe::Hit(90));
        c.on_write(9, Some((91, 0)));
        assert_eq!(c.probe(9, 0), Probe::Hit(91));
        c.on_write(9, None);
        assert!(matches!(c.probe(9, 0), Probe::Miss { .. }));
        assert_eq!(c.items(), 0);
    }

    /// "Every `sample`-th get" counts gets only: writes between them do not shift the
    /// sampling (they shared one per-thread counter, so every 4th *operation* was sampled).
    #[test]
    fn writes_do_not_shift_the_sampling_of_gets() {
        std::thread::spawn(|| {
            let c = cache(CacheMode::Raf, 4);
            let mut admits = Vec::new();
            for k in 1..=8 {
                c.tick_write();
                match c.probe(k, 0) {
                    Probe::Miss { admit, .. } => admits.push(admit),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(admits, [false, false, false, true, false, false, false, true]);
        })
        .join()
        .unwrap();
    }

    /// The state inside `switch(false)` after `enabled` is cleared and before the buckets are
    /// emptied: a write then still fixes the cached item (writers check `len`, not `enabled`),
    /// so a `switch(true)` at that moment serves the current value, not a stale one.
    #[test]
    fn an_item_left_by_a_switch_off_in_progress_is_kept_current() {
        let c = cache(CacheMode::Raf, 1);
        let Probe::Miss { epoch, .. } = c.probe(9, 0) else { panic!("expected a miss") };
        c.admit(9, 90, 0, 0, epoch);
        c.enabled.store(false, Ordering::Relaxed); // switch(false), not yet emptied
        assert_eq!(c.probe(9, 0), Probe::Off);
        c.on_write(9, Some((91, 0)));
        c.enabled.store(true, Ordering::Relaxed); // a switch(true) overtakes the emptying
        assert_eq!(c.probe(9, 0), Probe::Hit(91));
        c.on_write(9, None);
        assert!(matches!(c.probe(9, 0), Probe::Miss { .. }));
    }

    #[test]
    fn an_admission_racing_a_write_is_dropped() {
        let c = cache(CacheMode::Raf, 1);
        let Probe::Miss { epoch, .. } = c.probe(5, 0) else { panic!("expected a miss") };
        c.on_write(5, Some((2, 0))); // the write lands between the miss and the admission
        c.admit(5, 1, 0, 0, epoch); // carries the value read before the write
        assert!(matches!(c.probe(5, 0), Probe::Miss { .. }));
    }

    #[test]
    fn coldest_is_replaced_and_overflow_halves() {
        let c = cache(CacheMode::Lfu, 1);
        // Fill one bucket: keys that hash to bucket 0.
        let keys: Vec<u64> = (1..u64::MAX)
            .filter(|&k| (crate::hash(k) as usize) % c.buckets.len() == 0)
            .take(WAYS + 1)
            .collect();
        for &k in &keys[..WAYS] {
            let Probe::Miss { epoch, .. } = c.probe(k, 0) else { panic!() };
            c.admit(k, k, 0, 0, epoch);
        }
        // Heat all but the first.
        for &k in &keys[1..WAYS] {
            assert_eq!(c.probe(k, 0), Probe::Hit(k));
        }
        let Probe::Miss { epoch, .. } = c.probe(keys[WAYS], 0) else { panic!() };
        c.admit(keys[WAYS], 1, 0, 0, epoch);
        assert!(matches!(c.probe(keys[0], 0), Probe::Miss { .. }), "the coldest was evicted");
        // Overflow: drive one TF to the cap; the bucket halves.
        {
            let b = c.bucket(keys[1]);
            let mut s = b.lock();
            let i = s.iter().position(|x| x.key == keys[1]).unwrap();
            s[i].tf = TF_MAX;
        }
        assert_eq!(c.probe(keys[1], 0), Probe::Hit(keys[1]));
        let b = c.bucket(keys[1]);
        let s = b.lock();
        let i = s.iter().position(|x| x.key == keys[1]).unwrap();
        assert_eq!(s[i].tf, TF_MAX / 2 + UNIT);
    }

    /// Drives `c` (sampling every get) with gets of keys from `key`, admitting every miss.
    fn gets(c: &Cache, n: u64, mut key: impl FnMut(u64) -> u64) {
        for i in 0..n {
            let k = key(i);
            if let Probe::Miss { epoch, admit: true } = c.probe(k, 0) {
                c.admit(k, k, 1, 0, epoch);
            }
        }
    }

    #[test]
    fn uniform_gets_switch_it_off_signal_1_and_skew_brings_it_back() {
        let c = cache(CacheMode::Raf, 1);
        // Signal 1: every get a different key, so no get hits.
        let mut next = 1u64 << 32;
        gets(&c, 2 * WINDOW, |_| {
            next += 1;
            next
        });
        assert!(!c.enabled(), "a window without hits leaves the cache on");
        assert_eq!(c.off_reason.load(Ordering::Relaxed), OFF_UNIFORM);
        assert_eq!(c.items(), 0, "switched off, the cache is emptied");
        // Still uniform: the cache stays off until the back-off expires, then retries once
        // (and is judged uniform again, doubling the back-off).
        gets(&c, WINDOW, |_| {
            next += 1;
            next
        });
        let retries = c.switches_on.load(Ordering::Relaxed);
        gets(&c, 8 * WINDOW, |_| {
            next += 1;
            next
        });
        assert!(c.backoff.load(Ordering::Relaxed) > 1, "repeated uniform retries back off");
        assert!(c.switches_on.load(Ordering::Relaxed) - retries <= 3);
        // Skewed gets (a few hot keys): the next retry keeps it on.
        gets(&c, 200 * WINDOW, |i| 1 + i % 64);
        assert!(c.enabled(), "a skewed read workload brings the cache back");
        assert_eq!(c.backoff.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn hits_on_cold_items_only_switch_it_off_signal_2() {
        let c = cache(CacheMode::Raf, 1);
        // Every key read exactly twice in a row: half the gets hit (signal 1 stays quiet), but
        // every hit is on an item of admission TF — no item is hotter than another.
        gets(&c, 2 * WINDOW, |i| (1 << 40) + i / 2);
        assert!(c.hits.sum() * 10 >= c.misses.sum());
        assert!(!c.enabled(), "flat TFs leave the cache on");
        assert_eq!(c.off_reason.load(Ordering::Relaxed), OFF_UNIFORM);
        // Retried after the back-off, it is judged flat again.
        gets(&c, 8 * WINDOW, |i| (1 << 41) + i / 2);
        assert!(c.switches_off.load(Ordering::Relaxed) >= 2);
    }

    #[test]
    fn skewed_gets_keep_it_on() {
        let c = cache(CacheMode::Raf, 1);
        gets(&c, 20 * WINDOW, |i| 1 + (i * 7) % 32);
        assert!(c.enabled());
        assert_eq!(c.switches_off.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn write_intensive_windows_switch_it_off_and_gets_back_on() {
        let c = cache(CacheMode::Raf, 1);
        for _ in 0..WINDOW {
            c.tick_write();
        }
        assert!(!c.enabled());
        assert_eq!(c.off_reason.load(Ordering::Relaxed), OFF_WRITES);
        // Mixed but still under 10 % gets: stays off.
        for i in 0..2 * WINDOW {
            if i % 20 == 0 {
                let _ = c.probe(i + 1, 0);
            } else {
                c.tick_write();
            }
        }
        assert!(!c.enabled());
        for k in 0..WINDOW {
            let _ = c.probe(k + 1, 0);
        }
        assert!(c.enabled());
    }
}
