//! The traits every engine implements: [`Index`] (the operations, object-safe so the facade and
//! the benchmark driver hold a `dyn Index`) and [`Engine`] (create / open-with-recovery / close on
//! a pool).

use std::fmt::Debug;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use numakv_pmem::{EngineId, Pool};

use crate::error::{Error, Result};

/// The smallest key a user may store (0 is a sentinel).
pub const MIN_KEY: u64 = 1;
/// The largest key a user may store (`u64::MAX` is a sentinel).
pub const MAX_KEY: u64 = u64::MAX - 1;

/// Validates a user key against the contract of DESIGN.md §2.
#[inline]
pub fn check_key(key: u64) -> Result<()> {
    if (MIN_KEY..=MAX_KEY).contains(&key) {
        Ok(())
    } else {
        Err(Error::InvalidKey(key))
    }
}

/// Whether a pool whose header names `pool_engine` may hold engine `engine`: its own store, or a
/// layered one named `<layer>-<engine>` (e.g. `nap-fastfair`: Nap over FAST&FAIR, which creates
/// and opens the raw engine in the same pool).
pub fn hosts_engine(pool_engine: &str, engine: &str) -> bool {
    pool_engine == engine
        || pool_engine
            .strip_suffix(engine)
            .is_some_and(|layer| layer.len() > 1 && layer.ends_with('-'))
}

/// The pool checks an engine's `create` makes before it formats anything: the pool's header
/// names `engine` or a layer over it ([`hosts_engine`]), else [`Error::InvalidOptions`]
/// "pool belongs to engine …".
pub fn check_pool_engine(pool: &Pool, engine: &str) -> Result<()> {
    let name = &pool.header().engine.name;
    if hosts_engine(name, engine) {
        Ok(())
    } else {
        Err(Error::InvalidOptions(format!("pool belongs to engine {name:?}, not {engine}")))
    }
}

/// [`check_pool_engine`], then that root slot `meta_slot`, which holds the engine's format word
/// once a store exists, is still 0: else [`Error::InvalidOptions`] "pool already holds `what`"
/// (`what` names the store: "a nobtree").
pub fn check_fresh_pool(pool: &Pool, engine: &str, meta_slot: usize, what: &str) -> Result<()> {
    check_pool_engine(pool, engine)?;
    // ORDERING: Acquire, as any reader of a format word: a store that is there is seen whole.
    if pool.root(meta_slot)?.load(Ordering::Acquire) != 0 {
        return Err(Error::InvalidOptions(format!("pool already holds {what}")));
    }
    Ok(())
}

/// An ordered map from `u64` keys (`1..=u64::MAX-1`) to `u64` values (any value, 0 included),
/// safe to use from many threads at once.
///
/// Every operation is linearizable per key; `scan` is not a snapshot across keys (each returned
/// pair was present at some moment during the scan, keys ascend strictly, and a key present for
/// the whole scan is returned). A successful mutating call is durable when it returns, in the
/// persistence mode of the store.
pub trait Index: Send + Sync {
    /// The engine's name as recorded in store headers (e.g. `"fastfair"`).
    fn name(&self) -> &'static str;

    /// Inserts `key → value` if `key` is absent; `false` (and no change) if present.
    fn insert(&self, key: u64, value: u64) -> Result<bool>;

    /// Inserts or overwrites `key → value`.
    fn upsert(&self, key: u64, value: u64) -> Result<()>;

    /// Overwrites the value of `key` if present; `false` (and no change) if absent.
    fn update(&self, key: u64, value: u64) -> Result<bool>;

    /// The value of `key`, if present.
    fn get(&self, key: u64) -> Result<Option<u64>>;

    /// Removes `key`; `false` if it was absent.
    fn remove(&self, key: u64) -> Result<bool>;

    /// Appends to `out` up to `max` pairs in ascending key order, starting with the first key
    /// `≥ start` (any `start` is accepted); returns how many were appended.
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize>;

    /// Space and engine-specific counters.
    fn stats(&self) -> EngineStats;

    /// Structural check (fsck) of the persistent and volatile structure. Run it while no other
    /// thread mutates the index. Fails with [`Error::Corrupted`] naming the violated invariant.
    fn check(&self) -> Result<CheckReport>;

    /// Read-modify-write of a present key: when `key` is present, calls `f` with its value while
    /// no other writer can change that key, stores what `f` returns (`Some`; `None` leaves the
    /// value as it is) durably, and returns the value `f` saw; returns `None` (and does not
    /// call `f`) when `key` is absent. An error from `f` is returned with nothing written.
    ///
    /// The default is [`Index::get`] then [`Index::upsert`] — two descents, and no exclusion of
    /// other writers: a caller that needs it (the byte-string layer) serialises the writers of
    /// a key itself. An engine that can do it in one descent under its own leaf lock overrides
    /// it (FAST&FAIR).
    fn update_with(
        &self,
        key: u64,
        f: &mut dyn FnMut(u64) -> Result<Option<u64>>,
    ) -> Result<Option<u64>> {
        let Some(old) = self.get(key)? else { return Ok(None) };
        if let Some(new) = f(old)? {
            self.upsert(key, new)?;
        }
        Ok(Some(old))
    }

    /// Whether a write of this index may wait for an epoch grace period (NBTree's SMO waits for
    /// Calloc log slots that come back only after one). A layer above (the byte-string layer)
    /// must not hold an epoch pin across a write of such an index: the grace period would never
    /// end. An index that never waits returns `false`, and the layer may then pin once around
    /// the whole write, which makes the index's own pin a nested one (no fence). Default: `true`.
    fn writes_wait_for_grace(&self) -> bool {
        true
    }

    /// Waits, at most about `limit`, until the background work that operations already returned
    /// have caused is done (entries still to be evaluated into the tree, garbage a GC pass should
    /// reclaim, queued migrations, an upper-layer rebuild or a switch in progress), and returns
    /// what was still pending when it gave up: empty when the engine is idle. The work is done
    /// by the engine's background threads or, where the engine says so, on the calling thread.
    /// Engines without background threads return at once.
    ///
    /// The benchmark runner calls it before it closes a counted phase, so the phase's PM figures
    /// include that work (docs/design.md §11).
    fn quiesce(&self, limit: Duration) -> Result<Vec<Backlog>> {
        let _ = limit;
        Ok(Vec::new())
    }
}

/// Background work an engine still owed when [`Index::quiesce`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backlog {
    /// What is pending, e.g. `"entries to evaluate"`.
    pub what: &'static str,
    /// How much of it.
    pub count: u64,
}

impl std::fmt::Display for Backlog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.count, self.what)
    }
}

/// Polls `pending` every millisecond until it reports nothing or `limit` has passed, and returns
/// its last answer: the body of most [`Index::quiesce`] implementations, whose background threads
/// do the work while the caller waits.
pub fn wait_for_background(
    limit: Duration,
    mut pending: impl FnMut() -> Vec<Backlog>,
) -> Vec<Backlog> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let now = pending();
        if now.is_empty() || std::time::Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A concrete engine: how to create one on a fresh pool, recover one from a pool, and close it.
///
/// Dropping an engine without [`Engine::close`] is a crash as far as the store is concerned: the
/// next [`Engine::open`] runs recovery.
pub trait Engine: Index + Sized + 'static {
    /// Engine options with the paper's constants as defaults. Options that shape the persistent
    /// format are recorded in the store at create and read back at open (the values passed to
    /// `open` for those are ignored); the rest apply per session.
    type Options: Clone + Debug + Default + Send + Sync + 'static;

    /// Name recorded in the pool header.
    const NAME: &'static str;
    /// Version of the engine's persistent format; a store of another version is refused.
    const FORMAT_VERSION: u32;

    /// The header identity of this engine.
    fn engine_id() -> EngineId {
        EngineId::new(Self::NAME, Self::FORMAT_VERSION)
    }

    /// Builds an empty index on a freshly created `pool` (whose header names this engine).
    fn create(pool: Arc<Pool>, opts: &Self::Options) -> Result<Self>;

    /// Opens the index stored in `pool`, recovering it if it was not closed cleanly.
    fn open(pool: Arc<Pool>, opts: &Self::Options) -> Result<(Self, RecoveryReport)>;

    /// Clean shutdown: makes everything durable and marks the store clean.
    fn close(self) -> Result<()>;

    /// The pool the index lives in.
    fn pool(&self) -> &Arc<Pool>;
}

/// Space used and engine-specific counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Per NUMA node: PM bytes the engine holds (allocated from the pool), index = node.
    pub pm_bytes_per_node: Vec<u64>,
    /// DRAM bytes of volatile structures (approximate: the dominant structures).
    pub dram_bytes: u64,
    /// Engine-specific counters (splits, merges, migrations, GC runs, ...), name → value.
    pub counters: Vec<(&'static str, u64)>,
}

impl EngineStats {
    /// Total PM bytes across nodes.
    pub fn pm_bytes(&self) -> u64 {
        self.pm_bytes_per_node.iter().sum()
    }

    /// The counter called `name`, if the engine reports it.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
}

/// What [`Index::check`] verified.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Key/value entries found.
    pub entries: u64,
    /// PM blocks (allocator units) reachable from the engine's roots.
    pub reachable_blocks: u64,
    /// PM blocks the allocator considers allocated. Right after recovery this equals
    /// `reachable_blocks` (no leak); during a run it may exceed it by blocks awaiting their epoch
    /// grace period.
    pub allocated_blocks: u64,
}

/// What [`Engine::open`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Whether the store had been closed cleanly (no repair needed).
    pub was_clean: bool,
    /// Wall time of the open, recovery included.
    pub elapsed: Duration,
    /// Engine-specific recovery counters (entries replayed, nodes repaired, blocks reclaimed, ...).
    pub counters: Vec<(&'static str, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_keys_are_refused() {
        assert!(matches!(check_key(0), Err(Error::InvalidKey(0))));
        assert!(matches!(check_key(u64::MAX), Err(Error::InvalidKey(u64::MAX))));
        assert!(check_key(1).is_ok());
        assert!(check_key(u64::MAX - 1).is_ok());
    }

    #[test]
    fn layered_pools_host_their_raw_engine() {
        assert!(hosts_engine("fastfair", "fastfair"));
        assert!(hosts_engine("nap-fastfair", "fastfair"));
        assert!(!hosts_engine("-fastfair", "fastfair"));
        assert!(!hosts_engine("napfastfair", "fastfair"));
        assert!(!hosts_engine("not-fastfair2", "fastfair"));
    }

    #[test]
    fn create_refuses_foreign_and_formatted_pools() {
        use numakv_pmem::PoolConfig;
        let pool = Pool::volatile(PoolConfig::new(EngineId::new("nap-toy", 1), 1 << 20)).unwrap();
        assert!(check_pool_engine(&pool, "toy").is_ok());
        let e = check_pool_engine(&pool, "other").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidOptions(m) if m.contains("\"nap-toy\", not other")),
            "{e}"
        );
        assert!(check_fresh_pool(&pool, "toy", 3, "a toy").is_ok());
        pool.root(3).unwrap().store(1, Ordering::Release);
        let e = check_fresh_pool(&pool, "toy", 3, "a toy").unwrap_err();
        assert!(matches!(&e, Error::InvalidOptions(m) if m == "pool already holds a toy"), "{e}");
        assert!(
            matches!(check_fresh_pool(&pool, "other", 3, "an other"), Err(Error::InvalidOptions(m)) if m.contains("belongs to"))
        );
    }

    #[test]
    fn index_is_object_safe() {
        fn takes(_: Option<&dyn Index>) {}
        takes(None);
    }
}
