//! Workloads: an operation mix over a key distribution, and the per-worker operation stream.
//!
//! Keys are addressed by a dense index: the `keys` loaded keys are indices `0..keys`, and every
//! `insert` claims the next fresh index from a shared counter ([`KeySpace`]), as YCSB's
//! `insert` does. Reads, updates, scans and removes draw an index among those handed out so far
//! with the workload's [`Dist`]. [`KeyOrder`] maps an index to the `u64` key stored.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::dist::{Dist, KeyChooser, Shift};
use crate::error::{BenchError, Result};

/// One kind of index operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// `get` of an existing key.
    Get,
    /// `insert` of a fresh key.
    Insert,
    /// `upsert` of an existing key (drawn by the distribution).
    Upsert,
    /// `update` of an existing key.
    Update,
    /// `remove` of an existing key.
    Remove,
    /// `scan` from an existing key.
    Scan,
    /// Read-modify-write: `get` then `update` of the same key, timed as one operation.
    Rmw,
}

impl OpKind {
    /// Every kind, in a fixed order.
    pub const ALL: [OpKind; 7] = [
        OpKind::Get,
        OpKind::Insert,
        OpKind::Upsert,
        OpKind::Update,
        OpKind::Remove,
        OpKind::Scan,
        OpKind::Rmw,
    ];

    /// The lower-case name used in mixes and reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Get => "get",
            OpKind::Insert => "insert",
            OpKind::Upsert => "upsert",
            OpKind::Update => "update",
            OpKind::Remove => "remove",
            OpKind::Scan => "scan",
            OpKind::Rmw => "rmw",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OpKind {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<OpKind> {
        let t = s.trim().to_ascii_lowercase();
        OpKind::ALL.into_iter().find(|k| k.name() == t).ok_or_else(|| {
            BenchError::Config(format!(
                "unknown operation {s:?} (choices: get, insert, upsert, update, remove, scan, rmw)"
            ))
        })
    }
}

/// How a worker walks through the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MixOrder {
    /// Each operation is drawn at random with the weights' probabilities (YCSB).
    #[default]
    Random,
    /// Each worker repeats the weights as a fixed cycle, e.g. 4 inserts, 16 gets, 1 remove
    /// (papers/f3tree.txt §5.2.4, "as performed in F&F").
    Cycle,
}

/// Relative weights of the operation kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mix {
    /// `(kind, weight)`; weights are relative (they need not sum to 100).
    pub weights: Vec<(OpKind, u32)>,
    /// Random draws or a fixed cycle.
    pub order: MixOrder,
}

impl Mix {
    /// A random mix with these weights.
    pub fn new(weights: &[(OpKind, u32)]) -> Mix {
        Mix { weights: weights.to_vec(), order: MixOrder::Random }
    }

    /// A fixed per-worker cycle with these counts.
    pub fn cycle(weights: &[(OpKind, u32)]) -> Mix {
        Mix { weights: weights.to_vec(), order: MixOrder::Cycle }
    }

    /// Only `kind`.
    pub fn only(kind: OpKind) -> Mix {
        Mix::new(&[(kind, 1)])
    }

    fn total(&self) -> u64 {
        self.weights.iter().map(|&(_, w)| u64::from(w)).sum()
    }

    /// Share of `kind` in the mix, 0..=1.
    pub fn share(&self, kind: OpKind) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        let w: u64 =
            self.weights.iter().filter(|(k, _)| *k == kind).map(|&(_, w)| u64::from(w)).sum();
        w as f64 / total as f64
    }

    /// Checks that some weight is positive and cycles stay small.
    ///
    /// # Errors
    ///
    /// [`BenchError::Config`].
    pub fn validate(&self) -> Result<()> {
        let total = self.total();
        if total == 0 {
            return Err(BenchError::Config("operation mix has no positive weight".into()));
        }
        if self.order == MixOrder::Cycle && total > 1_000_000 {
            return Err(BenchError::Config("an operation cycle longer than 10⁶".into()));
        }
        Ok(())
    }
}

impl fmt::Display for Mix {
    /// `get:50,update:50`, with a `cycle/` prefix for [`MixOrder::Cycle`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.order == MixOrder::Cycle {
            f.write_str("cycle/")?;
        }
        for (i, (k, w)) in self.weights.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}:{w}")?;
        }
        Ok(())
    }
}

impl FromStr for Mix {
    type Err = BenchError;
    /// Parses `get:95,insert:5` (or `cycle/insert:4,get:16,remove:1`).
    fn from_str(s: &str) -> Result<Mix> {
        let (order, body) = match s.trim().strip_prefix("cycle/") {
            Some(b) => (MixOrder::Cycle, b),
            None => (MixOrder::Random, s.trim()),
        };
        let mut weights = Vec::new();
        for part in body.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, w) = part.split_once(':').ok_or_else(|| {
                BenchError::Config(format!("bad mix entry {part:?}: want OP:WEIGHT"))
            })?;
            let w = w
                .trim()
                .parse::<u32>()
                .map_err(|_| BenchError::Config(format!("bad weight in mix entry {part:?}")))?;
            weights.push((k.parse()?, w));
        }
        let mix = Mix { weights, order };
        mix.validate()?;
        Ok(mix)
    }
}

/// How many pairs a scan asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanLen {
    /// Always this many.
    Fixed(u32),
    /// Uniform in `min..=max` (YCSB's `scanlengthdistribution=uniform`).
    Uniform {
        /// Shortest scan.
        min: u32,
        /// Longest scan.
        max: u32,
    },
}

impl ScanLen {
    /// YCSB's default: uniform in 1..=100 (`maxscanlength=100`).
    pub const YCSB: ScanLen = ScanLen::Uniform { min: 1, max: 100 };

    fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> usize {
        match *self {
            ScanLen::Fixed(n) => n as usize,
            ScanLen::Uniform { min, max } => rng.gen_range(min..=max.max(min)) as usize,
        }
    }
}

impl fmt::Display for ScanLen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanLen::Fixed(n) => write!(f, "{n}"),
            ScanLen::Uniform { min, max } => write!(f, "{min}-{max}"),
        }
    }
}

/// How a key index becomes the `u64` key stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyOrder {
    /// A bijective 63-bit mix of the index, plus one: keys land all over the key space, so
    /// inserts are random (YCSB's default `insertorder=hashed`).
    #[default]
    Hashed,
    /// `index + 1`: inserts arrive in ascending key order (`insertorder=ordered`).
    Ordered,
}

impl KeyOrder {
    /// The key of index `i` (always within `1..=u64::MAX-1`).
    #[inline]
    pub fn key(self, i: u64) -> u64 {
        match self {
            KeyOrder::Hashed => permute63(i) + 1,
            KeyOrder::Ordered => i.min(u64::MAX - 2) + 1,
        }
    }
}

/// A bijection on `0..2⁶³` (xor-shifts and odd multiplications modulo 2⁶³, after MurmurHash3's
/// finaliser). Inputs are taken modulo 2⁶³.
#[inline]
pub fn permute63(x: u64) -> u64 {
    const MASK: u64 = (1 << 63) - 1;
    let mut x = x & MASK;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd) & MASK;
    x ^= x >> 29;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53) & MASK;
    x ^= x >> 32;
    x
}

/// A named workload: what to load and which operations to run on it.
///
/// Sizes come from the benchmark configuration; `default_keys` / `default_ops` apply when it
/// leaves them out.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Name in reports (a preset's name, or one made up).
    pub name: String,
    /// The operation mix.
    pub mix: Mix,
    /// The key distribution of every operation that targets an existing key.
    pub dist: Dist,
    /// Scan lengths.
    pub scan_len: ScanLen,
    /// Index → key.
    pub key_order: KeyOrder,
    /// Whether the `keys` keys are loaded before the run (false: the run starts empty, e.g.
    /// nstore's put100 and f3tree's W1).
    pub preload: bool,
    /// Keys loaded when the configuration does not say.
    pub default_keys: u64,
    /// Operations run when the configuration does not say.
    pub default_ops: u64,
    /// The operations use up the loaded keys (nstore's delete100 removes each key once), so a
    /// run by time would measure misses once they are gone: such a workload always runs by
    /// operation count, also under `--duration` and `--budget`.
    pub consumes_keys: bool,
    /// Inserts of fresh keys are issued as blind writes (`upsert`, which reports nothing), as
    /// papers whose insert does not look for the key first measure them (papers/f3tree.txt W1).
    pub blind_inserts: bool,
    /// Operations on existing keys draw from this many times the loaded keys (1: the loaded
    /// keys only). Above 1, draws can name keys that are absent — a lookup misses, an upsert
    /// inserts — as in papers/nap.txt §6.1 (16M keys loaded of a 200M key space: 12.5). For
    /// mixes without fresh inserts ([`OpKind::Insert`] claims indices above the loaded ones).
    pub key_space_factor: f64,
}

impl Workload {
    /// A workload with the defaults: YCSB zipfian, YCSB scan lengths, hashed keys, preloaded,
    /// 100 000 keys and 200 000 operations.
    pub fn new(name: impl Into<String>, mix: Mix) -> Workload {
        Workload {
            name: name.into(),
            mix,
            dist: Dist::YCSB_ZIPF,
            scan_len: ScanLen::YCSB,
            key_order: KeyOrder::Hashed,
            preload: true,
            default_keys: 100_000,
            default_ops: 200_000,
            consumes_keys: false,
            blind_inserts: false,
            key_space_factor: 1.0,
        }
    }

    /// Draws keys from `factor` times the loaded keys ([`Workload::key_space_factor`]).
    pub fn with_key_space_factor(mut self, factor: f64) -> Workload {
        self.key_space_factor = factor;
        self
    }

    /// The key indices operations on existing keys draw from, with `loaded` keys loaded.
    pub fn key_space(&self, loaded: u64) -> u64 {
        if self.key_space_factor > 1.0 {
            (loaded as f64 * self.key_space_factor).round() as u64
        } else {
            loaded
        }
    }

    /// Issues the inserts of fresh keys as blind writes ([`Workload::blind_inserts`]).
    pub fn with_blind_inserts(mut self) -> Workload {
        self.blind_inserts = true;
        self
    }

    /// Sets the distribution.
    pub fn with_dist(mut self, dist: Dist) -> Workload {
        self.dist = dist;
        self
    }

    /// Sets the scan length.
    pub fn with_scan_len(mut self, scan_len: ScanLen) -> Workload {
        self.scan_len = scan_len;
        self
    }

    /// Sets the key order.
    pub fn with_key_order(mut self, order: KeyOrder) -> Workload {
        self.key_order = order;
        self
    }

    /// Marks the workload as using up its keys ([`Workload::consumes_keys`]).
    pub fn consuming_keys(mut self) -> Workload {
        self.consumes_keys = true;
        self
    }

    /// Sets whether keys are loaded first.
    pub fn with_preload(mut self, preload: bool) -> Workload {
        self.preload = preload;
        self
    }

    /// Checks mix and distribution.
    ///
    /// # Errors
    ///
    /// [`BenchError::Config`].
    pub fn validate(&self) -> Result<()> {
        self.mix.validate()?;
        if !(self.key_space_factor >= 1.0 && self.key_space_factor.is_finite()) {
            return Err(BenchError::Config(format!(
                "key space factor {} must be at least 1",
                self.key_space_factor
            )));
        }
        if self.key_space_factor > 1.0 && self.mix.share(OpKind::Insert) > 0.0 {
            return Err(BenchError::Config(
                "a key space larger than the loaded keys needs a mix without fresh inserts \
                 (use upsert)"
                    .into(),
            ));
        }
        self.dist.validate()
    }

    /// A one-line description: mix, distribution, key order.
    pub fn describe(&self) -> String {
        let mut s = format!("{} over {}", self.mix, self.dist);
        if self.mix.share(OpKind::Scan) > 0.0 {
            s += &format!(", scans of {}", self.scan_len);
        }
        if self.key_order == KeyOrder::Ordered {
            s += ", ascending keys";
        }
        if !self.preload {
            s += ", starts empty";
        }
        if self.blind_inserts {
            s += ", inserts as blind upserts";
        }
        if self.key_space_factor > 1.0 {
            s += &format!(", keys from {}x the loaded keys", self.key_space_factor);
        }
        s
    }
}

/// The shared counter of key indices handed out (loaded plus inserted).
#[derive(Debug, Default)]
pub struct KeySpace {
    next: AtomicU64,
}

impl KeySpace {
    /// A key space with `loaded` keys already present.
    pub fn new(loaded: u64) -> KeySpace {
        KeySpace { next: AtomicU64::new(loaded) }
    }

    /// Indices handed out so far.
    #[inline]
    pub fn count(&self) -> u64 {
        // ORDERING: Relaxed; the count only steers which key is asked for. A reader may target a
        // key whose insert has not finished yet and see it absent, as with YCSB's counter.
        self.next.load(Ordering::Relaxed)
    }

    /// Claims a fresh index for an insert.
    #[inline]
    pub fn claim(&self) -> u64 {
        // ORDERING: Relaxed; uniqueness comes from the RMW itself, nothing else is published.
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// One operation to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// What to do.
    pub kind: OpKind,
    /// The key (for scans: the start key).
    pub key: u64,
    /// The value to write (writes) or add (read-modify-write).
    pub value: u64,
    /// Pairs to scan (scans only).
    pub scan_len: usize,
}

/// SplitMix64 finaliser, to derive independent seeds.
pub fn mix_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One worker's reproducible stream of operations.
///
/// The stream depends only on the seed, the worker index and the key-space count it observes:
/// with one worker (or no inserts) it is fully determined by the seed.
#[derive(Debug)]
pub struct OpStream {
    rng: SmallRng,
    chooser: KeyChooser,
    /// Random mix: cumulative weights; cycle mix: the expanded cycle.
    table: Vec<(OpKind, u64)>,
    cycle: Vec<OpKind>,
    pos: usize,
    total: u64,
    scan_len: ScanLen,
    key_order: KeyOrder,
    /// Operation number at which a fraction-based hotspot shift happens.
    shift_at: Option<u64>,
    issued: u64,
    blind_inserts: bool,
    /// [`Workload::key_space`], when larger than the loaded keys.
    key_space: Option<u64>,
}

impl OpStream {
    /// The stream of worker `worker` of `workers`, seeded from `seed`, whose measured phase will
    /// run `planned_ops` operations (for fraction-based hotspot shifts; 0 when unknown).
    ///
    /// `proto` is a chooser built once by [`Dist::chooser`] and cloned here.
    pub fn new(
        workload: &Workload,
        proto: &KeyChooser,
        n: u64,
        worker: usize,
        workers: usize,
        seed: u64,
        planned_ops: u64,
    ) -> OpStream {
        let mut acc = 0;
        let table = workload
            .mix
            .weights
            .iter()
            .filter(|&&(_, w)| w > 0)
            .map(|&(k, w)| {
                acc += u64::from(w);
                (k, acc)
            })
            .collect();
        let cycle = match workload.mix.order {
            MixOrder::Cycle => workload
                .mix
                .weights
                .iter()
                .flat_map(|&(k, w)| std::iter::repeat_n(k, w as usize))
                .collect(),
            MixOrder::Random => Vec::new(),
        };
        let shift_at = match workload.dist {
            Dist::Hotspot { shift: Some(Shift::AfterFraction(f)), .. } => {
                Some((planned_ops as f64 * f) as u64)
            }
            _ => None,
        };
        let key_space = (workload.key_space(n) > n).then(|| workload.key_space(n));
        OpStream {
            rng: SmallRng::seed_from_u64(mix_seed(seed, worker as u64 + 1)),
            chooser: proto.for_worker(key_space.unwrap_or(n), worker, workers),
            table,
            cycle,
            pos: 0,
            total: acc,
            scan_len: workload.scan_len,
            key_order: workload.key_order,
            shift_at,
            issued: 0,
            blind_inserts: workload.blind_inserts,
            key_space,
        }
    }

    /// Starts counting operations for fraction-based shifts from zero (call when the measured
    /// phase begins).
    pub fn reset_count(&mut self) {
        self.issued = 0;
    }

    fn kind(&mut self) -> OpKind {
        if !self.cycle.is_empty() {
            let k = self.cycle[self.pos];
            self.pos = (self.pos + 1) % self.cycle.len();
            return k;
        }
        if self.table.len() == 1 {
            return self.table[0].0;
        }
        let x = self.rng.gen_range(0..self.total);
        self.table.iter().find(|&&(_, c)| x < c).map_or(OpKind::Get, |&(k, _)| k)
    }

    /// The next operation; `shifted_by_time` says whether a time-based hotspot shift happened.
    pub fn next_op(&mut self, space: &KeySpace, shifted_by_time: bool) -> Op {
        let kind = self.kind();
        let shifted = shifted_by_time || self.shift_at.is_some_and(|at| self.issued >= at);
        self.issued += 1;
        let index = match kind {
            OpKind::Insert => space.claim(),
            _ => {
                let n = self.key_space.unwrap_or_else(|| space.count());
                self.chooser.next(&mut self.rng, n, shifted)
            }
        };
        let value = self.rng.gen::<u64>();
        let scan_len = if kind == OpKind::Scan { self.scan_len.draw(&mut self.rng) } else { 0 };
        let kind = if kind == OpKind::Insert && self.blind_inserts { OpKind::Upsert } else { kind };
        Op { kind, key: self.key_order.key(index), value, scan_len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn permutation_is_injective_and_keys_valid() {
        let keys: HashSet<u64> = (0..200_000).map(|i| KeyOrder::Hashed.key(i)).collect();
        assert_eq!(keys.len(), 200_000);
        assert!(keys.iter().all(|&k| (1..u64::MAX).contains(&k)));
        assert_eq!(KeyOrder::Ordered.key(0), 1);
        assert_eq!(KeyOrder::Ordered.key(u64::MAX), u64::MAX - 1);
        assert!(KeyOrder::Hashed.key(u64::MAX) < u64::MAX);
    }

    #[test]
    fn mix_parse_and_shares() {
        let m: Mix = "get:95, insert:5".parse().unwrap();
        assert_eq!(m.weights, vec![(OpKind::Get, 95), (OpKind::Insert, 5)]);
        assert!((m.share(OpKind::Insert) - 0.05).abs() < 1e-12);
        assert_eq!(m.to_string().parse::<Mix>().unwrap(), m);
        let c: Mix = "cycle/insert:4,get:16,remove:1".parse().unwrap();
        assert_eq!(c.order, MixOrder::Cycle);
        assert_eq!(c.to_string(), "cycle/insert:4,get:16,remove:1");
        assert!("get:0".parse::<Mix>().is_err());
        assert!("fly:3".parse::<Mix>().is_err());
    }

    #[test]
    fn cycle_mix_repeats_exactly() {
        let w = Workload::new("c", "cycle/insert:4,get:16,remove:1".parse().unwrap())
            .with_dist(Dist::Uniform);
        let proto = w.dist.chooser(100, 0, 1).unwrap();
        let space = KeySpace::new(100);
        let mut s = OpStream::new(&w, &proto, 100, 0, 1, 1, 0);
        let kinds: Vec<OpKind> = (0..42).map(|_| s.next_op(&space, false).kind).collect();
        assert_eq!(kinds[..21], kinds[21..]);
        assert_eq!(kinds.iter().filter(|&&k| k == OpKind::Insert).count(), 8);
        assert_eq!(kinds.iter().filter(|&&k| k == OpKind::Remove).count(), 2);
        assert_eq!(space.count(), 108, "each insert claimed a fresh index");
    }

    #[test]
    fn a_larger_key_space_draws_absent_keys_too() {
        let w = Workload::new("ks", Mix::new(&[(OpKind::Get, 1), (OpKind::Upsert, 1)]))
            .with_dist(Dist::Uniform)
            .with_key_space_factor(12.5);
        w.validate().unwrap();
        assert_eq!(w.key_space(1000), 12_500);
        let proto = w.dist.chooser(w.key_space(1000), 0, 1).unwrap();
        let space = KeySpace::new(1000);
        let mut s = OpStream::new(&w, &proto, 1000, 0, 1, 1, 0);
        let loaded: HashSet<u64> = (0..1000).map(|i| KeyOrder::Hashed.key(i)).collect();
        let absent =
            (0..10_000).filter(|_| !loaded.contains(&s.next_op(&space, false).key)).count();
        // 11 500 of 12 500 indices are absent: about 92% of uniform draws.
        assert!((8_800..9_600).contains(&absent), "{absent} of 10 000 draws absent");
        assert_eq!(space.count(), 1000, "no index was claimed");
        let bad = Workload::new("ks", Mix::only(OpKind::Insert)).with_key_space_factor(2.0);
        assert!(bad.validate().is_err());
        assert!(Workload::new("ks", Mix::only(OpKind::Get))
            .with_key_space_factor(0.5)
            .validate()
            .is_err());
    }

    #[test]
    fn blind_inserts_write_fresh_keys_with_upsert() {
        let w = Workload::new("w1", Mix::only(OpKind::Insert))
            .with_dist(Dist::Uniform)
            .with_preload(false)
            .with_blind_inserts();
        let proto = w.dist.chooser(0, 0, 1).unwrap();
        let space = KeySpace::new(0);
        let mut s = OpStream::new(&w, &proto, 0, 0, 1, 1, 0);
        let ops: Vec<Op> = (0..50).map(|_| s.next_op(&space, false)).collect();
        assert!(ops.iter().all(|o| o.kind == OpKind::Upsert));
        let keys: std::collections::HashSet<u64> = ops.iter().map(|o| o.key).collect();
        assert_eq!(keys.len(), 50, "every write got a fresh key");
        assert_eq!(space.count(), 50);
        assert!(w.describe().contains("blind"));
    }
}
