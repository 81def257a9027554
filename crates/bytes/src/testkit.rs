//! The byte-key mode of the conformance and crash kit (DESIGN.md §4), for every engine.
//!
//! Two parts:
//! - [`Codec<E>`] drives a [`Bytes<E>`] through the shared kit of `numakv-index` (differential,
//!   sequential, scans, concurrent disjoint/shared with linearizability, ADR shadow crashes,
//!   eADR kills, bad input, leak checks): each `u64` key becomes an order-preserving byte key of
//!   8–11 bytes — four consecutive keys share an 8-byte prefix, so buckets hold several keys and
//!   every copy-on-write rewrites neighbours — and each value a byte string of 8–30 bytes.
//! - Byte-native oracles on [`BytesKit`]: random sequences against
//!   `BTreeMap<Vec<u8>, Vec<u8>>` with short, colliding and extreme keys, empty and large values,
//!   range and prefix scans (also partly consumed) and clean/unclean reopens
//!   ([`BytesKit::differential`]); scans racing writers ([`BytesKit::scans_concurrent`]); the
//!   limits (empty key, 1 KiB + 1 key, 1 MiB + 1 value) refused with the store intact
//!   ([`BytesKit::bad_input`]).
//!
//! [`bytes_conformance_tests!`](crate::bytes_conformance_tests) makes the `#[test]`s of one
//! engine; put it alone in a test file (the eADR kill test re-executes the binary by test name).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use numakv_index::testkit::{seed, test_scale, Verdict, Violation};
use numakv_index::{
    check_key as check_u64_key, CheckReport, Engine, EngineStats, Error, Index, RecoveryReport,
    Result,
};
use numakv_pmem::{OpenConfig, PersistMode, Pool, PoolConfig};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

pub use numakv_index as index;

use crate::{engine_id, ByteMap, Bytes, TreeLimits, MAX_KEY_LEN, MAX_VALUE_LEN};

// ---------------------------------------------------------------------------------------------
// The codec: the shared u64 kit over byte keys
// ---------------------------------------------------------------------------------------------

/// Byte key of `k`: `(k >> 2)` big-endian, then `k & 3` bytes `'x'`. Order-preserving, and the
/// four keys of one `k >> 2` share their 8-byte prefix (one bucket).
pub fn key_of(k: u64) -> Vec<u8> {
    let mut b = (k >> 2).to_be_bytes().to_vec();
    b.resize(8 + (k & 3) as usize, b'x');
    b
}

/// Inverse of [`key_of`].
pub fn key_from(b: &[u8]) -> Option<u64> {
    let (head, tail) = (b.get(..8)?, &b[8..]);
    if tail.len() > 3 || tail.iter().any(|&c| c != b'x') {
        return None;
    }
    let hi = u64::from_be_bytes(head.try_into().ok()?);
    (hi <= u64::MAX >> 2).then_some((hi << 2) | tail.len() as u64)
}

/// Byte value of `v`: `v` little-endian, then `v % 23` pattern bytes.
pub fn value_of(v: u64) -> Vec<u8> {
    let mut b = v.to_le_bytes().to_vec();
    b.extend((0..(v % 23) as u8).map(|i| (v as u8).wrapping_add(i)));
    b
}

/// Inverse of [`value_of`]; `None` for a byte string it cannot have made (a torn value).
pub fn value_from(b: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let pad = &b[8..];
    (pad.len() as u64 == v % 23
        && pad.iter().enumerate().all(|(i, &c)| c == (v as u8).wrapping_add(i as u8)))
    .then_some(v)
}

/// Split limits of the kit's stores: two entries per leaf and two children per inner node, so
/// that the four keys of one prefix already form a tree of leaves and inner nodes, and the
/// shared kit's crashes and races land in splits, path copies and removals.
pub const TINY: TreeLimits = TreeLimits {
    leaf_entries: 2,
    leaf_bytes: 1024,
    inner_children: 2,
    inner_bytes: 4096,
    cell_value: crate::CELL_MAX_VALUE,
};

/// The split limits of the codec's stores: [`TINY`], unless `NUMAKV_KIT_TINY_TREES=0` asks for
/// the default ones (where the codec's four keys per prefix stay one leaf). With [`TINY`] the
/// kit found two bugs under load on 2026-11-26 that the default limits hid: Nap cached a value a
/// concurrent raw write replaced (lost updates in `crash_kill_eadr`), and NSM failed frees run
/// on exiting threads (whole epoch bags reported as leaked).
fn codec_limits() -> TreeLimits {
    if std::env::var_os("NUMAKV_KIT_TINY_TREES").is_some_and(|v| v == "0") {
        TreeLimits::default()
    } else {
        TINY
    }
}

/// Small limits for the byte-native oracles: trees several levels deep from a few hundred keys,
/// and no cells, so that a prefix's root of one pair is also tested as a record.
pub const SMALL: TreeLimits = TreeLimits {
    leaf_entries: 3,
    leaf_bytes: 300,
    inner_children: 3,
    inner_bytes: 400,
    cell_value: 0,
};

/// A [`Bytes<E>`] seen as a `u64` [`Engine`] through [`key_of`] / [`value_of`], so that the
/// shared kit drives the byte layer.
#[derive(Debug)]
pub struct Codec<E: Engine>(pub Bytes<E>);

fn torn(what: &str, b: &[u8]) -> Error {
    Error::corrupted("bytes-codec", format!("{what} {b:x?} was not written by the codec"))
}

impl<E: Engine> Index for Codec<E> {
    fn name(&self) -> &'static str {
        "bytes"
    }
    fn insert(&self, key: u64, value: u64) -> Result<bool> {
        check_u64_key(key)?;
        self.0.insert(&key_of(key), &value_of(value))
    }
    fn upsert(&self, key: u64, value: u64) -> Result<()> {
        check_u64_key(key)?;
        self.0.put(&key_of(key), &value_of(value))
    }
    fn update(&self, key: u64, value: u64) -> Result<bool> {
        check_u64_key(key)?;
        self.0.update(&key_of(key), &value_of(value))
    }
    fn get(&self, key: u64) -> Result<Option<u64>> {
        check_u64_key(key)?;
        match self.0.get(&key_of(key))? {
            None => Ok(None),
            Some(v) => value_from(&v).map(Some).ok_or_else(|| torn("value", &v)),
        }
    }
    fn remove(&self, key: u64) -> Result<bool> {
        check_u64_key(key)?;
        self.0.delete(&key_of(key))
    }
    fn scan(&self, start: u64, max: usize, out: &mut Vec<(u64, u64)>) -> Result<usize> {
        let mut n = 0;
        for r in self.0.scan(&key_of(start), None, max) {
            let (k, v) = r?;
            let k = key_from(&k).ok_or_else(|| torn("key", &k))?;
            let v = value_from(&v).ok_or_else(|| torn("value", &v))?;
            out.push((k, v));
            n += 1;
        }
        Ok(n)
    }
    fn stats(&self) -> EngineStats {
        self.0.stats()
    }
    fn check(&self) -> Result<CheckReport> {
        self.0.check()
    }
}

impl<E: Engine> Engine for Codec<E> {
    type Options = E::Options;
    const NAME: &'static str = "bytes";
    const FORMAT_VERSION: u32 = E::FORMAT_VERSION;

    fn engine_id() -> numakv_pmem::EngineId {
        engine_id::<E>()
    }
    fn create(pool: Arc<Pool>, opts: &E::Options) -> Result<Self> {
        let mut b = Bytes::create(pool, opts)?;
        b.set_tree_limits(codec_limits())?;
        Ok(Codec(b))
    }
    fn open(pool: Arc<Pool>, opts: &E::Options) -> Result<(Self, RecoveryReport)> {
        let (mut b, r) = Bytes::open(pool, opts)?;
        b.set_tree_limits(codec_limits())?;
        Ok((Codec(b), r))
    }
    fn close(self) -> Result<()> {
        self.0.close()
    }
    fn pool(&self) -> &Arc<Pool> {
        ByteMap::pool(&self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Byte-native oracles
// ---------------------------------------------------------------------------------------------

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Violation(format!($($fmt)+)));
        }
    };
}

fn fail<T>(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Verdict<T> {
    Err(Violation(format!("{what}: unexpected error: {e}")))
}

/// How the byte-native oracles drive one engine.
#[derive(Clone, Debug)]
pub struct BytesKit<E: Engine> {
    /// Engine options of every store.
    pub opts: E::Options,
    /// Emulated NUMA nodes.
    pub nodes: usize,
    /// Capacity per node (sparse).
    pub capacity_per_node: u64,
    /// Size factor (`NUMAKV_TEST_SCALE`).
    pub scale: usize,
}

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

impl<E: Engine> BytesKit<E> {
    /// 2 nodes of 256 MiB (sparse), scale from `NUMAKV_TEST_SCALE`.
    pub fn new(opts: E::Options) -> BytesKit<E> {
        BytesKit { opts, nodes: 2, capacity_per_node: 256 << 20, scale: test_scale() }
    }

    fn create_in(&self, dir: &Path, mode: PersistMode) -> Verdict<Bytes<E>> {
        let mut cfg = PoolConfig::new(engine_id::<E>(), self.capacity_per_node);
        cfg.nodes = self.nodes;
        cfg.mode = mode;
        let pool = Pool::create(dir, cfg).or_else(|e| fail("creating the pool", e))?;
        Bytes::create(pool, &self.opts).or_else(|e| fail("Bytes::create", e))
    }

    fn open_in(&self, dir: &Path) -> Verdict<Bytes<E>> {
        let pool = Pool::open(dir, OpenConfig::new(engine_id::<E>()))
            .or_else(|e| fail("opening the pool", e))?;
        Bytes::open(pool, &self.opts).map(|(b, _)| b).or_else(|e| fail("Bytes::open", e))
    }

    /// Random single-threaded sequences against `BTreeMap<Vec<u8>, Vec<u8>>`, in `mode`.
    pub fn differential(&self, mode: PersistMode) -> Verdict {
        let seed = seed();
        self.differential_seeded(mode, seed).map_err(|v| {
            Violation(format!("bytes differential {mode:?} (NUMAKV_TEST_SEED={seed}): {v}"))
        })
    }

    fn differential_seeded(&self, mode: PersistMode, seed: u64) -> Verdict {
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        for run in 0..4 * self.scale {
            // Runs alternate the split limits and the key space: keys of every shape, or keys
            // that all share one 8-byte prefix (one tree that splits, grows and shrinks).
            let limits = if run % 2 == 1 { SMALL } else { TreeLimits::default() };
            let keys = if run % 4 >= 2 { KeySpace::SharedPrefix } else { KeySpace::Mixed };
            let path = dir.path().join(format!("store{run}"));
            let mut b = self.create_in(&path, mode)?;
            b.set_tree_limits(limits).or_else(|e| fail("set_tree_limits", e))?;
            let mut model = Model::new();
            for i in 0..400 {
                let ctx = |v: Violation| Violation(format!("run {run} step {i}: {v}"));
                match rng.gen_range(0..100) {
                    0..=1 => {
                        if rng.gen_bool(0.5) {
                            b.close().or_else(|e| fail("close()", e))?;
                        } else {
                            drop(b);
                        }
                        b = self.open_in(&path).map_err(ctx)?;
                        b.set_tree_limits(limits).or_else(|e| fail("set_tree_limits", e))?;
                        check_all(&b, &model).map_err(ctx)?;
                    }
                    2..=9 => {
                        let (start, end) = (keys.key(&mut rng), keys.key(&mut rng));
                        let end = rng.gen_bool(0.7).then_some(end);
                        let limit = rng.gen_range(0..30);
                        let take = rng.gen_range(0..=limit);
                        check_scan(&b, &model, &start, end.as_deref(), limit, take).map_err(ctx)?;
                    }
                    10..=13 => {
                        let p: Vec<u8> =
                            keys.key(&mut rng).into_iter().take(rng.gen_range(0..11)).collect();
                        let limit = rng.gen_range(0..30);
                        let got = collect(b.scan_prefix(&p, limit)).map_err(ctx)?;
                        let want: Vec<_> = model
                            .iter()
                            .filter(|(k, _)| k.starts_with(&p))
                            .take(limit)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        ensure!(got == want, "run {run} step {i}: prefix scan {p:x?} limit {limit}: got {} pairs, want {}", got.len(), want.len());
                    }
                    _ => step(&b, &mut model, &mut rng, keys).map_err(ctx)?,
                }
            }
            check_all(&b, &model)?;
            leak_free(&b)?;
            b.close().or_else(|e| fail("close()", e))?;
            let b = self.open_in(&path)?;
            check_all(&b, &model)?;
            leak_free(&b)?;
            b.close().or_else(|e| fail("close()", e))?;
        }
        Ok(())
    }

    /// Scans racing writers: every scan ascends strictly, stays in its range and limit, and
    /// returns each key that no writer touches; values are never torn.
    pub fn scans_concurrent(&self) -> Verdict {
        let dir = scratch()?;
        let mut b = self.create_in(&dir.path().join("store"), PersistMode::Adr)?;
        // Trees of several levels per prefix: scans cross leaves and inner nodes that writers
        // split and remove meanwhile.
        b.set_tree_limits(TINY).or_else(|e| fail("set_tree_limits", e))?;
        // Stable keys: even k, never written after the load. Writers churn odd k.
        let n = 1_000 * self.scale as u64;
        for k in (2..=2 * n).step_by(2) {
            b.put(&key_of(k), &value_of(k)).or_else(|e| fail("load", e))?;
        }
        let done = AtomicBool::new(false);
        let verdict = std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let (b, done) = (&b, &done);
                    s.spawn(move || -> Verdict {
                        let mut rng = SmallRng::seed_from_u64(w);
                        // ORDERING: Relaxed; `done` only ends the loop.
                        while !done.load(Ordering::Relaxed) {
                            let k = rng.gen_range(0..n) * 2 + 1;
                            let r = if rng.gen_bool(0.5) {
                                b.put(&key_of(k), &value_of(rng.gen())).map(|_| ())
                            } else {
                                b.delete(&key_of(k)).map(|_| ())
                            };
                            r.or_else(|e| fail("writer", e))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut rng = SmallRng::seed_from_u64(seed());
            let mut v = Ok(());
            for _ in 0..200 * self.scale {
                let lo = rng.gen_range(1..2 * n);
                let hi = lo + rng.gen_range(0..400);
                let limit = rng.gen_range(1..300);
                let got = match collect(b.scan(&key_of(lo), Some(&key_of(hi)), limit)) {
                    Ok(g) => g,
                    Err(e) => {
                        v = Err(e);
                        break;
                    }
                };
                let r = (|| -> Verdict {
                    ensure!(got.len() <= limit, "scan returned {} > limit {limit}", got.len());
                    let ks: Vec<u64> = got.iter().map(|(k, _)| key_from(k).unwrap_or(0)).collect();
                    ensure!(
                        ks.windows(2).all(|w| w[0] < w[1]),
                        "scan keys not strictly ascending: {ks:?}"
                    );
                    ensure!(
                        ks.iter().all(|&k| (lo..hi).contains(&k)),
                        "scan [{lo}, {hi}) returned {ks:?}"
                    );
                    for (k, val) in &got {
                        ensure!(value_from(val).is_some(), "torn value under key {k:x?}");
                    }
                    let stable: Vec<u64> = ks.iter().copied().filter(|k| k % 2 == 0).collect();
                    let last = ks.last().copied();
                    let want: Vec<u64> = (lo..hi)
                        .filter(|k| k % 2 == 0 && *k <= 2 * n)
                        .filter(|&k| got.len() < limit || last.is_some_and(|l| k <= l))
                        .collect();
                    ensure!(
                        stable == want,
                        "scan [{lo}, {hi}) limit {limit}: stable keys {stable:?}, want {want:?}"
                    );
                    Ok(())
                })();
                if r.is_err() {
                    v = r;
                    break;
                }
            }
            done.store(true, Ordering::Relaxed);
            for h in writers {
                let r = h.join().unwrap_or_else(|_| Err(Violation("a writer panicked".into())));
                v = v.and(r);
            }
            v
        });
        verdict?;
        b.check().or_else(|e| fail("check()", e))?;
        b.close().or_else(|e| fail("close()", e))
    }

    /// One prefix's tree grown several levels deep and shrunk to nothing: keys that all share
    /// their 8-byte prefix, inserted in random order under [`SMALL`] limits, every key and a
    /// full scan checked, a reopen (clean, then unclean) between; then deleted in random order
    /// until the prefix is gone from the index, leaving no PM block behind.
    pub fn shared_prefix(&self) -> Verdict {
        let seed = seed();
        let ctx = |v: Violation| Violation(format!("shared prefix (NUMAKV_TEST_SEED={seed}): {v}"));
        let mut rng = SmallRng::seed_from_u64(seed);
        let dir = scratch()?;
        let path = dir.path().join("store");
        let mut b = self.create_in(&path, PersistMode::Adr)?;
        b.set_tree_limits(SMALL).or_else(|e| fail("set_tree_limits", e))?;
        let n = 1_500 * self.scale;
        let mut ids: Vec<usize> = (0..n).collect();
        ids.shuffle(&mut rng);
        let key = |i: usize| format!("key:{i:012}").into_bytes();
        let mut model = Model::new();
        for &i in &ids {
            let v = format!("value {i} ").repeat(1 + i % 5).into_bytes();
            b.put(&key(i), &v).or_else(|e| fail("put", e)).map_err(ctx)?;
            model.insert(key(i), v);
        }
        let height = b.prefix_height(&key(0)).or_else(|e| fail("prefix_height", e)).map_err(ctx)?;
        ensure!(height >= Some(3), "{n} keys of one prefix: tree height {height:?}, want ≥ 3");
        check_all(&b, &model).map_err(ctx)?;
        for (s, e) in [(10, 20), (0, n), (n / 3, n / 3 + 700)] {
            check_scan(&b, &model, &key(s), Some(&key(e)), usize::MAX, usize::MAX).map_err(ctx)?;
        }
        b.close().or_else(|e| fail("close()", e))?;
        let b = self.open_in(&path)?;
        check_all(&b, &model).map_err(ctx)?;
        drop(b); // unclean
        let mut b = self.open_in(&path)?;
        b.set_tree_limits(SMALL).or_else(|e| fail("set_tree_limits", e))?;
        check_all(&b, &model).map_err(ctx)?;
        leak_free(&b).map_err(ctx)?;
        ids.shuffle(&mut rng);
        for (j, &i) in ids.iter().enumerate() {
            let got = b.delete(&key(i)).or_else(|e| fail("delete", e)).map_err(ctx)?;
            ensure!(got, "delete of present key {i} returned false");
            model.remove(&key(i));
            if j % 500 == 0 {
                check_all(&b, &model).map_err(ctx)?;
            }
        }
        let height = b.prefix_height(&key(0)).or_else(|e| fail("prefix_height", e)).map_err(ctx)?;
        ensure!(
            height.is_none(),
            "every key deleted, the prefix still has a tree of height {height:?}"
        );
        check_all(&b, &model).map_err(ctx)?;
        leak_free(&b).map_err(ctx)?;
        b.close().or_else(|e| fail("close()", e))
    }

    /// Readers and scans racing writers inside one prefix's deep tree: writers insert and
    /// delete odd keys (splitting leaves, copying paths, removing leaves and inner nodes) while
    /// readers get every even key with its exact value and scans return every even key of
    /// their range.
    pub fn shared_prefix_concurrent(&self) -> Verdict {
        let dir = scratch()?;
        let mut b = self.create_in(&dir.path().join("store"), PersistMode::Adr)?;
        b.set_tree_limits(SMALL).or_else(|e| fail("set_tree_limits", e))?;
        let n = 600 * self.scale;
        let key = |i: usize| format!("key:{i:012}").into_bytes();
        let val = |i: usize| format!("stable {i}").into_bytes();
        for i in (0..2 * n).step_by(2) {
            b.put(&key(i), &val(i)).or_else(|e| fail("load", e))?;
        }
        let done = AtomicBool::new(false);
        let verdict = std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u64)
                .map(|w| {
                    let (b, done) = (&b, &done);
                    s.spawn(move || -> Verdict {
                        let mut rng = SmallRng::seed_from_u64(w ^ seed());
                        // ORDERING: Relaxed; `done` only ends the loop.
                        while !done.load(Ordering::Relaxed) {
                            let i = rng.gen_range(0..n) * 2 + 1;
                            if rng.gen_bool(0.6) {
                                let v = vec![b'w'; rng.gen_range(0..120)];
                                b.put(&key(i), &v).or_else(|e| fail("writer put", e))?;
                            } else {
                                b.delete(&key(i)).or_else(|e| fail("writer delete", e))?;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut rng = SmallRng::seed_from_u64(seed());
            let mut v: Verdict = Ok(());
            for round in 0..300 * self.scale {
                let r = (|| -> Verdict {
                    let i = rng.gen_range(0..n) * 2;
                    let got = b.get(&key(i)).or_else(|e| fail("get", e))?;
                    ensure!(got == Some(val(i)), "round {round}: get of stable key {i}: {got:?}");
                    let lo = rng.gen_range(0..2 * n);
                    let hi = lo + rng.gen_range(0..200);
                    let got = collect(b.scan(&key(lo), Some(&key(hi)), usize::MAX))?;
                    let ks: Vec<&Vec<u8>> = got.iter().map(|(k, _)| k).collect();
                    ensure!(
                        ks.windows(2).all(|w| w[0] < w[1]),
                        "round {round}: scan not ascending"
                    );
                    let index_of = |k: &[u8]| -> usize {
                        std::str::from_utf8(&k[4..])
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(usize::MAX)
                    };
                    let stable: Vec<usize> =
                        got.iter().map(|(k, _)| index_of(k)).filter(|i| i % 2 == 0).collect();
                    let want: Vec<usize> = (lo..hi.min(2 * n)).filter(|i| i % 2 == 0).collect();
                    ensure!(
                        stable == want,
                        "round {round}: scan [{lo}, {hi}): stable keys {stable:?}, want {want:?}"
                    );
                    for (k, v) in &got {
                        let i = index_of(k);
                        ensure!(
                            if i % 2 == 0 { *v == val(i) } else { v.iter().all(|&c| c == b'w') },
                            "round {round}: scan: torn or foreign value under key {i}"
                        );
                    }
                    Ok(())
                })();
                if r.is_err() {
                    v = r;
                    break;
                }
            }
            done.store(true, Ordering::Relaxed);
            for h in writers {
                let r = h.join().unwrap_or_else(|_| Err(Violation("a writer panicked".into())));
                v = v.and(r);
            }
            v
        });
        verdict?;
        b.check().or_else(|e| fail("check()", e))?;
        leak_free(&b)?;
        b.close().or_else(|e| fail("close()", e))
    }

    /// The limits: empty keys, keys over 1 KiB and values over 1 MiB are refused with typed
    /// errors naming the limit, nothing changes, and the store stays usable; the largest key and
    /// value are accepted and survive a reopen.
    pub fn bad_input(&self) -> Verdict {
        let dir = scratch()?;
        let path = dir.path().join("store");
        let b = self.create_in(&path, PersistMode::Adr)?;
        let mut model = Model::new();
        for i in 0..50u32 {
            let (k, v) = (format!("user:{i}").into_bytes(), format!("v{i}").into_bytes());
            b.put(&k, &v).or_else(|e| fail("put", e))?;
            model.insert(k, v);
        }
        let big_key = vec![0xab; MAX_KEY_LEN + 1];
        let big_value = vec![7u8; MAX_VALUE_LEN + 1];
        let empty = |r: Result<bool>, what: &str| -> Verdict {
            match r {
                Err(Error::EmptyKey { max }) => {
                    ensure!(max == MAX_KEY_LEN, "{what}: EmptyKey names {max}");
                    Ok(())
                }
                other => {
                    Err(Violation(format!("{what} with the empty key: {other:?}, want EmptyKey")))
                }
            }
        };
        empty(b.put(b"", b"x").map(|()| true), "put")?;
        empty(b.insert(b"", b"x"), "insert")?;
        empty(b.update(b"", b"x"), "update")?;
        empty(b.delete(b""), "delete")?;
        empty(b.get(b"").map(|v| v.is_some()), "get")?;
        let large = |r: Result<bool>, what: &str, limit: usize| -> Verdict {
            match r {
                Err(e @ Error::TooLarge { .. }) => {
                    ensure!(
                        e.to_string().contains(&format!("limit is {limit} bytes")),
                        "{what}: {e}"
                    );
                    Ok(())
                }
                other => Err(Violation(format!("{what}: {other:?}, want TooLarge"))),
            }
        };
        large(b.put(&big_key, b"x").map(|()| true), "put of a 1025-byte key", MAX_KEY_LEN)?;
        large(b.get(&big_key).map(|v| v.is_some()), "get of a 1025-byte key", MAX_KEY_LEN)?;
        large(
            b.put(b"user:1", &big_value).map(|()| true),
            "put of a 1 MiB + 1 value",
            MAX_VALUE_LEN,
        )?;
        large(b.insert(b"new", &big_value), "insert of a 1 MiB + 1 value", MAX_VALUE_LEN)?;
        large(b.update(b"user:2", &big_value), "update of a 1 MiB + 1 value", MAX_VALUE_LEN)?;
        check_all(&b, &model)?;
        // The largest key and value are fine, also beside neighbours in one bucket.
        let (mk, mv) = (vec![b'u'; MAX_KEY_LEN], vec![9u8; MAX_VALUE_LEN]);
        b.put(&mk, &mv).or_else(|e| fail("put of the largest key and value", e))?;
        model.insert(mk.clone(), mv.clone());
        b.put(b"user:1", &mv).or_else(|e| fail("put of a 1 MiB value", e))?;
        model.insert(b"user:1".to_vec(), mv);
        b.put(b"user:2", b"").or_else(|e| fail("put of an empty value", e))?;
        model.insert(b"user:2".to_vec(), Vec::new());
        check_all(&b, &model)?;
        b.close().or_else(|e| fail("close()", e))?;
        let b = self.open_in(&path)?;
        check_all(&b, &model)?;
        leak_free(&b)?;
        // A store that is not a bytes store of this format is refused with a typed error.
        let blank = dir.path().join("blank");
        let mut cfg = PoolConfig::new(engine_id::<E>(), self.capacity_per_node);
        cfg.nodes = self.nodes;
        let pool = Pool::create(&blank, cfg).or_else(|e| fail("creating a blank pool", e))?;
        match Bytes::<E>::open(pool, &self.opts) {
            Err(Error::Corrupted { .. }) => {}
            other => {
                return Err(Violation(format!(
                    "a never-initialised bytes store opened: {:?}",
                    other.map(|_| ())
                )))
            }
        }
        b.close().or_else(|e| fail("close()", e))
    }
}

fn scratch() -> Verdict<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let d = if shm.is_dir() {
        tempfile::Builder::new().prefix("numakv-bytes-kit-").tempdir_in(shm)
    } else {
        tempfile::Builder::new().prefix("numakv-bytes-kit-").tempdir()
    };
    d.or_else(|e| fail("creating a scratch directory", e))
}

/// Keys over a tiny alphabet (0x00, 0x01, 'a', 'b', 0xff) and lengths 1..=12, so that short
/// keys, shared 8-byte prefixes and the clamped extremes of the index key all occur.
fn rand_key(rng: &mut SmallRng) -> Vec<u8> {
    const ALPHA: [u8; 5] = [0x00, 0x01, b'a', b'b', 0xff];
    let len = if rng.gen_bool(0.3) { rng.gen_range(1..=3) } else { rng.gen_range(7..=12) };
    let mut k: Vec<u8> = (0..len).map(|_| ALPHA[rng.gen_range(0..ALPHA.len())]).collect();
    if rng.gen_bool(0.5) {
        k[..len.min(4)].copy_from_slice(&b"user"[..len.min(4)]);
    }
    k
}

/// Where the differential draws its keys from.
#[derive(Clone, Copy, Debug)]
enum KeySpace {
    /// [`rand_key`]: every shape.
    Mixed,
    /// `key:0000` then 1–6 bytes over a small alphabet: one 8-byte prefix for all, as
    /// redis-benchmark's `key:%012d` keys.
    SharedPrefix,
}

impl KeySpace {
    fn key(self, rng: &mut SmallRng) -> Vec<u8> {
        match self {
            KeySpace::Mixed => rand_key(rng),
            KeySpace::SharedPrefix => {
                const ALPHA: [u8; 4] = [0x00, b'1', b'2', 0xff];
                let mut k = b"key:0000".to_vec();
                let n = rng.gen_range(1..=6);
                k.extend((0..n).map(|_| ALPHA[rng.gen_range(0..ALPHA.len())]));
                k
            }
        }
    }
}

fn rand_value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.gen_range(0..20) {
        0..=2 => 0,
        3 => rng.gen_range(1_000..20_000),
        4 if rng.gen_bool(0.05) => MAX_VALUE_LEN,
        _ => rng.gen_range(1..40),
    };
    let b: u8 = rng.gen();
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

/// One random point operation on the store and the model, results compared.
fn step(b: &dyn ByteMap, model: &mut Model, rng: &mut SmallRng, keys: KeySpace) -> Verdict {
    let k = keys.key(rng);
    match rng.gen_range(0..6) {
        0 => {
            let v = rand_value(rng);
            let got = b.insert(&k, &v).or_else(|e| fail("insert", e))?;
            let want = !model.contains_key(&k);
            ensure!(got == want, "insert({k:x?}) returned {got}, want {want}");
            model.entry(k).or_insert(v);
        }
        1 | 2 => {
            let v = rand_value(rng);
            b.put(&k, &v).or_else(|e| fail("put", e))?;
            model.insert(k, v);
        }
        3 => {
            let v = rand_value(rng);
            let got = b.update(&k, &v).or_else(|e| fail("update", e))?;
            let want = model.contains_key(&k);
            ensure!(got == want, "update({k:x?}) returned {got}, want {want}");
            if let Some(slot) = model.get_mut(&k) {
                *slot = v;
            }
        }
        4 => {
            let got = b.delete(&k).or_else(|e| fail("delete", e))?;
            let want = model.remove(&k).is_some();
            ensure!(got == want, "delete({k:x?}) returned {got}, want {want}");
        }
        _ => {
            let got = b.get(&k).or_else(|e| fail("get", e))?;
            ensure!(
                got.as_ref() == model.get(&k),
                "get({k:x?}) returned {:?} bytes, want {:?}",
                got.map(|v| v.len()),
                model.get(&k).map(Vec::len)
            );
        }
    }
    Ok(())
}

fn collect(s: crate::Scan<'_>) -> Verdict<Vec<(Vec<u8>, Vec<u8>)>> {
    s.collect::<Result<Vec<_>>>().or_else(|e| fail("scan", e))
}

/// A scan of `[start, end)` with `limit`, of which only `take` items are consumed, against the
/// model.
fn check_scan(
    b: &dyn ByteMap,
    model: &Model,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
    take: usize,
) -> Verdict {
    let got: Vec<_> =
        b.scan(start, end, limit).take(take).collect::<Result<_>>().or_else(|e| fail("scan", e))?;
    let want: Vec<_> = model
        .range(start.to_vec()..)
        .take_while(|(k, _)| end.map_or(true, |e| k.as_slice() < e))
        .take(limit.min(take))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ensure!(
        got == want,
        "scan [{start:x?}, {end:x?}) limit {limit} take {take}: got keys {:x?}, want {:x?}",
        got.iter().map(|p| &p.0).collect::<Vec<_>>(),
        want.iter().map(|p| &p.0).collect::<Vec<_>>()
    );
    Ok(())
}

/// Every model pair by get, a full scan equal to the model, and `check()`.
fn check_all(b: &dyn ByteMap, model: &Model) -> Verdict {
    for (k, v) in model {
        let got = b.get(k).or_else(|e| fail("get", e))?;
        ensure!(
            got.as_ref() == Some(v),
            "get({k:x?}): {:?} bytes, want {}",
            got.map(|g| g.len()),
            v.len()
        );
    }
    let all = collect(b.scan(b"\0", None, usize::MAX))?;
    ensure!(
        all.len() == model.len() && all.iter().zip(model).all(|(a, (k, v))| &a.0 == k && &a.1 == v),
        "full scan: {} pairs, model {}",
        all.len(),
        model.len()
    );
    let r = b.check().or_else(|e| fail("check()", e))?;
    ensure!(
        r.entries == model.len() as u64,
        "check() counted {} entries, model {}",
        r.entries,
        model.len()
    );
    Ok(())
}

fn leak_free(b: &dyn ByteMap) -> Verdict {
    let r = b.check().or_else(|e| fail("check()", e))?;
    ensure!(
        r.reachable_blocks == r.allocated_blocks,
        "leak: {} PM blocks reachable, {} allocated (the layer's own blocks balance: its \
         check names them otherwise; so the surplus is the engine's)",
        r.reachable_blocks,
        r.allocated_blocks
    );
    Ok(())
}

/// The byte-key conformance tests of one engine: the shared kit over [`Codec`] plus the
/// byte-native oracles.
///
/// ```no_run
/// numakv_bytes::bytes_conformance_tests!(
///     engine = numakv_fastfair::FastFair,
///     opts = Default::default(),
///     modes = [adr, eadr],
/// );
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! bytes_conformance_tests {
    (engine = $engine:ty, opts = $opts:expr, modes = [$($mode:ident),+ $(,)?] $(,)?) => {
        $crate::testkit::index::conformance_tests!(
            engine = $crate::testkit::Codec<$engine>,
            kit = $crate::testkit::index::testkit::Kit::new($opts),
            modes = [$($mode),+],
        );

        fn __bytes_kit() -> $crate::testkit::BytesKit<$engine> {
            $crate::testkit::BytesKit::new($opts)
        }

        #[test]
        fn bytes_differential() {
            $( __bytes_kit().differential($crate::bytes_conformance_tests!(@mode $mode)).unwrap(); )+
        }

        #[test]
        fn bytes_scans_concurrent() {
            __bytes_kit().scans_concurrent().unwrap();
        }

        #[test]
        fn bytes_shared_prefix() {
            __bytes_kit().shared_prefix().unwrap();
        }

        #[test]
        fn bytes_shared_prefix_concurrent() {
            __bytes_kit().shared_prefix_concurrent().unwrap();
        }

        #[test]
        fn bytes_bad_input() {
            __bytes_kit().bad_input().unwrap();
        }
    };
    (@mode adr) => { $crate::testkit::index::pmem::PersistMode::Adr };
    (@mode eadr) => { $crate::testkit::index::pmem::PersistMode::Eadr };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_round_trips_and_preserves_order() {
        let ks = [1u64, 2, 3, 4, 5, 7, 8, 1000, u64::MAX - 2, u64::MAX - 1];
        for w in ks.windows(2) {
            assert!(key_of(w[0]) < key_of(w[1]));
        }
        for &k in &ks {
            assert_eq!(key_from(&key_of(k)), Some(k));
        }
        for v in [0u64, 1, 22, 23, u64::MAX] {
            assert_eq!(value_from(&value_of(v)), Some(v));
        }
        let mut t = value_of(45);
        t[9] ^= 1;
        assert_eq!(value_from(&t), None);
    }
}
