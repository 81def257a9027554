//! Workloads named after the papers' evaluations (DESIGN.md §5), and YCSB's core workloads A–F.
//!
//! Each preset quotes where its definition comes from. Sizes are scaled down (the papers load
//! 16–200 million keys); `--keys` / `--ops` scale them back up. Where a paper leaves a parameter
//! open, the preset takes YCSB's default and says so.

use crate::dist::{Dist, YCSB_ZIPFIAN_CONSTANT};
use crate::error::{BenchError, Result};
use crate::workload::{KeyOrder, Mix, OpKind, ScanLen, Workload};

use OpKind::{Get, Insert, Remove, Rmw, Scan, Update, Upsert};

/// A preset's name, source and one-line summary (for `numakv bench --list`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PresetInfo {
    /// The name `--workload` takes. `nbtree-upsert` also takes `:READ%[:THETA]` suffixes.
    pub name: &'static str,
    /// Paper and section the definition comes from.
    pub source: &'static str,
    /// What it runs.
    pub summary: &'static str,
}

const fn p(name: &'static str, source: &'static str, summary: &'static str) -> PresetInfo {
    PresetInfo { name, source, summary }
}

const NOB: &str = "papers/nobtree.txt §V (Workloads)";
const NAP: &str = "papers/nap.txt §6.1 (Workloads), §6.2 (scan range 10)";
/// papers/nap.txt §6.1: "the key space ... is 200 million ... we first load 16 million items".
const NAP_KEY_SPACE_FACTOR: f64 = 200.0 / 16.0;
const NST: &str = "papers/nstore.txt §V-A (Datasets, Workloads)";
const F3: &str = "papers/f3tree.txt §5.1 Table 1, §5.2.1-5.2.4";
const YCSB: &str = "YCSB core workloads (Cooper et al., SoCC'10; papers/nbtree.txt ref. [54])";

/// Every preset, in listing order.
pub const PRESETS: &[PresetInfo] = &[
    p("nobtree-read-only", NOB, "100% lookup, zipf 0.99"),
    p("nobtree-read-heavy", NOB, "95% lookup, 5% insert of new random keys, zipf 0.99"),
    p("nobtree-write-heavy", NOB, "50% lookup, 50% insert of new random keys, zipf 0.99"),
    p("nobtree-write-only", NOB, "100% insert of new random keys"),
    p("nobtree-rmw", NOB, "50% lookup, 50% read-modify-write, zipf 0.99"),
    p("nobtree-scan", NOB, "100% scan (1-100 pairs, YCSB default), zipf 0.99"),
    p(
        "nap-write-intensive",
        NAP,
        "50% lookup, 50% update/insert (upsert), zipf 0.99 over 12.5x the loaded keys",
    ),
    p(
        "nap-read-intensive",
        NAP,
        "95% lookup, 5% update/insert (upsert), zipf 0.99 over 12.5x the loaded keys",
    ),
    p("nap-write-only", NAP, "100% update/insert (upsert), zipf 0.99 over 12.5x the loaded keys"),
    p("nap-read-only", NAP, "100% lookup, zipf 0.99 over 12.5x the loaded keys"),
    p(
        "nap-scan-intensive",
        NAP,
        "95% range query of 10, 5% update/insert (upsert), zipf 0.99 over 12.5x the loaded keys",
    ),
    p(
        "nbtree-upsert",
        "papers/nbtree.txt §VI-D (YCSB Evaluation, Fig. 9, 11)",
        "read:upsert 50:50, zipf 0.99; nbtree-upsert:READ%[:THETA] varies both (Fig. 11)",
    ),
    p("nstore-put100", NST, "100% put (insert) into an empty store, uniform"),
    p("nstore-put95get5", NST, "95% put (insert), 5% get, uniform, after warm-up load"),
    p("nstore-put50get50", NST, "50% put (insert), 50% get, uniform"),
    p("nstore-get100", NST, "100% get, uniform"),
    p("nstore-get50upd50", NST, "50% get, 50% update, uniform"),
    p("nstore-upd100", NST, "100% update, uniform"),
    p("nstore-delete100", NST, "100% delete, each loaded key once (warm-up + ops ≤ keys)"),
    p("f3tree-w1", F3, "W1: write only, random 8-byte keys into an empty tree (§5.2.2)"),
    p("f3tree-w1-seq", F3, "W1 with sequential keys (§5.2.1)"),
    p("f3tree-w2", F3, "W2: read only, random keys (§5.3.2)"),
    p("f3tree-composite", F3, "per thread, cycles of 4 insert : 16 search : 1 delete, random keys"),
    p("ycsb-a", YCSB, "50% read, 50% update, zipfian"),
    p("ycsb-b", YCSB, "95% read, 5% update, zipfian"),
    p("ycsb-c", YCSB, "100% read, zipfian"),
    p("ycsb-d", YCSB, "95% read, 5% insert, latest"),
    p("ycsb-e", YCSB, "95% scan (1-100), 5% insert, zipfian"),
    p("ycsb-f", YCSB, "50% read, 50% read-modify-write, zipfian"),
];

/// The workloads of `numakv bench` without `--workload`: a read-mostly and a write-heavy mix,
/// so one run shows both sides of a PM index — YCSB B (95% read, 5% update, zipfian) and
/// papers/nobtree.txt's write-heavy (50% lookup, 50% insert of new random keys), which makes
/// the trees shift, split and allocate.
pub const DEFAULT_COMPARISON: &str = "ycsb-b,nobtree-write-heavy";

/// Every preset's name.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// The workload called `name` (case-insensitive).
///
/// # Errors
///
/// [`BenchError::UnknownWorkload`], or [`BenchError::Config`] for a bad `nbtree-upsert` suffix.
///
/// ```
/// let w = numakv_bench::presets::by_name("ycsb-a").unwrap();
/// assert_eq!(w.mix.to_string(), "get:50,update:50");
/// let n = numakv_bench::presets::by_name("nbtree-upsert:95:0.8").unwrap();
/// assert_eq!(n.dist.to_string(), "zipf:0.8");
/// ```
pub fn by_name(name: &str) -> Result<Workload> {
    let name = name.trim().to_ascii_lowercase();
    if let Some(rest) = name.strip_prefix("nbtree-upsert") {
        return nbtree_upsert(&name, rest);
    }
    let w = |mix: Mix| Workload::new(name.clone(), mix);
    // nap: "update/insert" writes over a 200M key space of which 16M are loaded (§6.1): an
    // upsert of a zipf-drawn key inserts it when absent (the paper's 1:3 insert:update ratio
    // is what its generator produced; ours is whatever the draws produce) — so hot keys are
    // written whether they exist yet or not, as in the paper, and inserts are not all cold.
    let nap = |read: OpKind, read_w: u32, write_w: u32| {
        let mut weights = vec![(Upsert, write_w)];
        if read_w > 0 {
            weights.insert(0, (read, read_w));
        }
        w(Mix::new(&weights)).with_key_space_factor(NAP_KEY_SPACE_FACTOR)
    };
    let workload = match name.as_str() {
        // papers/nobtree.txt §V: "read-only (100% lookup), read-heavy (95% lookup and 5% insert),
        // write-heavy (50% lookup and 50% insert), write-only (100% insert), read-modify-write
        // (50% lookup and 50% read-modify-write), and scan (100% scan) ... all the lookup and
        // scan operations follow a Zipfian distribution with a parameter of 0.99"; inserts are
        // "always randomly distributed" (§V-D). The scan length is not given: YCSB's 1-100.
        "nobtree-read-only" => w(Mix::only(Get)),
        "nobtree-read-heavy" => w(Mix::new(&[(Get, 95), (Insert, 5)])),
        "nobtree-write-heavy" => w(Mix::new(&[(Get, 50), (Insert, 50)])),
        "nobtree-write-only" => w(Mix::only(Insert)),
        "nobtree-rmw" => w(Mix::new(&[(Get, 50), (Rmw, 50)])),
        "nobtree-scan" => w(Mix::only(Scan)).with_scan_len(ScanLen::YCSB),
        // papers/nap.txt §6.1: "write-intensive: 50% lookup and 50% update/insert,
        // read-intensive: 95% lookup and 5% update/insert, write-only: 100% update/insert,
        // read-only: 100% lookup, scan-intensive: 95% range query and 5% update/insert ...
        // Zipfian distribution with parameter 0.99 ... The ratio of insert operations to update
        // operations is about 1:3." §6.2: "We set the query range to 10."
        "nap-write-intensive" => nap(Get, 50, 50),
        "nap-read-intensive" => nap(Get, 95, 5),
        "nap-write-only" => nap(Get, 0, 1),
        "nap-read-only" => w(Mix::only(Get)).with_key_space_factor(NAP_KEY_SPACE_FACTOR),
        "nap-scan-intensive" => nap(Scan, 95, 5).with_scan_len(ScanLen::Fixed(10)),
        // papers/nstore.txt §V-A: "put100 ... put95 get5 ... For all runs except the put workload,
        // we first warm the KV stores with 200M KVs and then perform 10M operations"; the
        // datasets are "randomly shuffle[d]" (uniform, random keys).
        "nstore-put100" => w(Mix::only(Insert)).with_dist(Dist::Uniform).with_preload(false),
        "nstore-put95get5" => w(Mix::new(&[(Insert, 95), (Get, 5)])).with_dist(Dist::Uniform),
        "nstore-put50get50" => w(Mix::new(&[(Insert, 50), (Get, 50)])).with_dist(Dist::Uniform),
        "nstore-get100" => w(Mix::only(Get)).with_dist(Dist::Uniform),
        "nstore-get50upd50" => w(Mix::new(&[(Get, 50), (Update, 50)])).with_dist(Dist::Uniform),
        "nstore-upd100" => w(Mix::only(Update)).with_dist(Dist::Uniform),
        // Deleting each key once: every worker walks its own slice of the loaded keys, so
        // warm-up plus measured deletes must not exceed the keys (the default leaves room for
        // the default 10% warm-up).
        "nstore-delete100" => {
            let mut d = w(Mix::only(Remove)).with_dist(Dist::Sequential).consuming_keys();
            d.default_ops = d.default_keys * 9 / 10;
            d
        }
        // papers/f3tree.txt Table 1: "W1: write only, W2: read only, 1 M 8B keys; Composite: 1 M
        // write, 12.5 K delete, 2 M search"; §5.2.4: "each thread alternates between four insert
        // queries, 16 search queries, and one delete query, as performed in F&F" with "a random
        // key distribution"; §5.2.1 / §5.2.2 run W1 with sequential and random keys.
        // W1's insert is a blind write in the paper (Algorithm 1's INSERT_FO only appends).
        "f3tree-w1" => {
            w(Mix::only(Insert)).with_dist(Dist::Uniform).with_preload(false).with_blind_inserts()
        }
        "f3tree-w1-seq" => w(Mix::only(Insert))
            .with_dist(Dist::Uniform)
            .with_key_order(KeyOrder::Ordered)
            .with_preload(false)
            .with_blind_inserts(),
        "f3tree-w2" => w(Mix::only(Get)).with_dist(Dist::Uniform),
        "f3tree-composite" => {
            w(Mix::cycle(&[(Insert, 4), (Get, 16), (Remove, 1)])).with_dist(Dist::Uniform)
        }
        // YCSB workloads/workloada..f: requestdistribution=zipfian (d: latest), scans uniform
        // 1..100, insertorder=hashed.
        "ycsb-a" => w(Mix::new(&[(Get, 50), (Update, 50)])),
        "ycsb-b" => w(Mix::new(&[(Get, 95), (Update, 5)])),
        "ycsb-c" => w(Mix::only(Get)),
        "ycsb-d" => w(Mix::new(&[(Get, 95), (Insert, 5)]))
            .with_dist(Dist::Latest { theta: YCSB_ZIPFIAN_CONSTANT }),
        "ycsb-e" => w(Mix::new(&[(Scan, 95), (Insert, 5)])).with_scan_len(ScanLen::YCSB),
        "ycsb-f" => w(Mix::new(&[(Get, 50), (Rmw, 50)])),
        _ => {
            return Err(BenchError::UnknownWorkload { name, available: names().join(", ") });
        }
    };
    Ok(workload)
}

/// papers/nbtree.txt §VI-D: "By default, the write operations in the workload are upsert ...
/// YCSB workload (read:write=50:50) in a zipfian key access distribution with the default 0.99
/// skewness"; Fig. 11 varies the write ratio and the skewness. Upserts target keys drawn by the
/// distribution among the existing ones, so they mostly update.
fn nbtree_upsert(name: &str, rest: &str) -> Result<Workload> {
    let bad = |why: &str| {
        BenchError::Config(format!(
            "bad preset {name:?}: {why} (want nbtree-upsert[:READ%[:THETA]])"
        ))
    };
    let mut read = 50u32;
    let mut theta = YCSB_ZIPFIAN_CONSTANT;
    if !rest.is_empty() {
        let params = rest.strip_prefix(':').ok_or_else(|| bad("parameters follow a ':'"))?;
        let mut it = params.split(':');
        if let Some(r) = it.next() {
            read = r.trim().parse().map_err(|_| bad("READ% is an integer"))?;
            if read > 100 {
                return Err(bad("READ% is at most 100"));
            }
        }
        if let Some(t) = it.next() {
            theta = t.trim().parse().map_err(|_| bad("THETA is a number"))?;
        }
        if it.next().is_some() {
            return Err(bad("too many parameters"));
        }
    }
    let mix = Mix::new(&[(Get, read), (Upsert, 100 - read)]);
    let w = Workload::new(name, mix).with_dist(Dist::Zipf { theta, scrambled: true });
    w.validate()?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_preset_builds_and_validates() {
        for info in PRESETS {
            let w = by_name(info.name).unwrap_or_else(|e| panic!("{}: {e}", info.name));
            w.validate().unwrap();
            assert_eq!(w.name, info.name);
            assert!(!info.source.is_empty() && !info.summary.is_empty());
        }
        assert!(matches!(by_name("tpcc"), Err(BenchError::UnknownWorkload { .. })));
    }

    #[test]
    fn preset_definitions_match_the_papers() {
        let nap = by_name("nap-write-intensive").unwrap();
        assert!((nap.mix.share(Get) - 0.5).abs() < 1e-12);
        assert!((nap.mix.share(Upsert) - 0.5).abs() < 1e-12);
        assert_eq!(nap.key_space(16_000_000), 200_000_000);
        nap.validate().unwrap();
        let scan = by_name("nap-scan-intensive").unwrap();
        assert!((scan.mix.share(Scan) - 0.95).abs() < 1e-12);
        assert_eq!(scan.scan_len, ScanLen::Fixed(10));
        assert!(!by_name("nstore-put100").unwrap().preload);
        assert!(by_name("nstore-put95get5").unwrap().preload);
        assert_eq!(by_name("ycsb-d").unwrap().dist, Dist::Latest { theta: 0.99 });
        let nb = by_name("nbtree-upsert").unwrap();
        assert!((nb.mix.share(Upsert) - 0.5).abs() < 1e-12);
        let nb = by_name("NBTREE-UPSERT:0:0.6").unwrap();
        assert_eq!(nb.mix.share(Upsert), 1.0);
        assert_eq!(nb.dist, Dist::Zipf { theta: 0.6, scrambled: true });
        for bad in ["nbtree-upsert:101", "nbtree-upsert:x", "nbtree-upsertx", "nbtree-upsert:5:2"] {
            assert!(by_name(bad).is_err(), "{bad}");
        }
    }
}
