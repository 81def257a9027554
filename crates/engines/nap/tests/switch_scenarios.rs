//! Switch scenarios: the background thread really switches under the churning options while
//! threads work (results checked against per-thread models); manual switches keep every value
//! (lazy initialisation from the previous NAL and from the raw index, deletes, scans merging);
//! a shifting hotspot is followed; a uniform workload gets the empty NAL.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_nap::{Nap, NapOptions};
use numakv_pmem::{numa, Pool, PoolConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

type N = Nap<FastFair>;

fn pool(nodes: usize) -> Arc<Pool> {
    let mut cfg = PoolConfig::new(N::engine_id(), 64 << 20);
    cfg.nodes = nodes;
    Pool::volatile(cfg).unwrap()
}

fn full_scan(e: &dyn Index) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    e.scan(1, usize::MAX, &mut out).unwrap();
    out
}

#[test]
fn manual_switches_keep_every_value() {
    let e = N::create(pool(2), &common::manual_options()).unwrap();
    let mut model = BTreeMap::new();
    for k in 1..=200u64 {
        e.insert(k, k * 10).unwrap();
        model.insert(k, k * 10);
    }
    let mut rng = SmallRng::seed_from_u64(7);
    for round in 0..30u64 {
        let lo = rng.gen_range(1..150);
        let keys: Vec<u64> = (lo..lo + 40).collect();
        let r = e.switch_to(&keys).unwrap();
        assert!(!r.unchanged || round > 0);
        for i in 0..300u64 {
            numa::set_current_node((i % 2) as usize);
            let k = rng.gen_range(1..=260);
            let v = round << 32 | i;
            match rng.gen_range(0..5) {
                0 => {
                    let fresh = !model.contains_key(&k);
                    assert_eq!(e.insert(k, v).unwrap(), fresh);
                    if fresh {
                        model.insert(k, v);
                    }
                }
                1 => {
                    e.upsert(k, v).unwrap();
                    model.insert(k, v);
                }
                2 => {
                    let present = model.contains_key(&k);
                    assert_eq!(e.update(k, v).unwrap(), present);
                    if present {
                        model.insert(k, v);
                    }
                }
                3 => assert_eq!(e.remove(k).unwrap(), model.remove(&k).is_some()),
                _ => assert_eq!(e.get(k).unwrap(), model.get(&k).copied()),
            }
        }
        assert_eq!(full_scan(&e), model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
        e.check().unwrap();
    }
    assert!(e.stats().counter("nap_switches").unwrap() >= 25);
    // Switch to the empty NAL: everything lands in the raw index.
    e.switch_to(&[]).unwrap();
    assert_eq!(full_scan(e.raw()), model.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
}

#[test]
fn background_switches_under_concurrent_load() {
    let e = N::create(pool(2), &common::churning_options()).unwrap();
    let threads = 4u64;
    // Run at least 0.8 s and until 5 switches happened (at most 20 s): on a loaded machine
    // the switch thread gets fewer turns, and a fixed window made the count a matter of luck.
    let start = Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let e = &e;
            let stop = &stop;
            s.spawn(move || {
                numa::set_current_node(t as usize % 2);
                let mut model: BTreeMap<u64, u64> = BTreeMap::new();
                let mut rng = SmallRng::seed_from_u64(t);
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    // Skewed keys owned by this thread (k ≡ t mod threads); the hot range moves.
                    let phase = i / 5_000;
                    let r = rng.gen_range(0..100u64);
                    let base = if r < 80 {
                        phase * 50 + rng.gen_range(0..20)
                    } else {
                        rng.gen_range(0..2_000)
                    };
                    let k = base * threads + t + 1;
                    match rng.gen_range(0..4) {
                        0 => {
                            e.upsert(k, i).unwrap();
                            model.insert(k, i);
                        }
                        1 => assert_eq!(e.remove(k).unwrap(), model.remove(&k).is_some()),
                        2 => assert_eq!(e.insert(k, i).unwrap(), {
                            let fresh = !model.contains_key(&k);
                            if fresh {
                                model.insert(k, i);
                            }
                            fresh
                        }),
                        _ => assert_eq!(e.get(k).unwrap(), model.get(&k).copied(), "key {k}"),
                    }
                }
                for (&k, &v) in &model {
                    assert_eq!(e.get(k).unwrap(), Some(v));
                }
            });
        }
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let elapsed = start.elapsed();
            let switched = e.stats().counter("nap_switches").unwrap_or(0);
            if (elapsed >= Duration::from_millis(800) && switched >= 5)
                || elapsed >= Duration::from_secs(20)
            {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                break;
            }
        }
    });
    let switches = e.stats().counter("nap_switches").unwrap();
    assert!(switches >= 5, "only {switches} switches");
    e.close().unwrap();
}

#[test]
fn hotspot_shift_is_followed_and_uniform_gets_the_empty_nal() {
    let opts = NapOptions {
        hot: 32,
        sample: 1,
        check_period: Duration::from_millis(20),
        sketch_width: 8192,
        ..common::churning_options()
    };
    let opts = NapOptions { detect_uniform: true, min_count: 2, ..opts };
    let e = N::create(pool(2), &opts).unwrap();
    let run = |lo: u64, span: u64, ms: u64| {
        let mut rng = SmallRng::seed_from_u64(lo);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(ms) {
            let k =
                if span > 0 { lo + rng.gen_range(0..span) } else { rng.gen_range(1..1u64 << 40) };
            e.upsert(k, k).unwrap();
        }
    };
    run(1_000, 32, 300);
    let hot = e.hot_keys();
    assert!(hot.iter().filter(|&&k| (1_000..1_032).contains(&k)).count() >= 24, "{hot:?}");
    run(9_000, 32, 300);
    let hot = e.hot_keys();
    assert!(hot.iter().filter(|&&k| (9_000..9_032).contains(&k)).count() >= 24, "{hot:?}");
    run(0, 0, 400);
    assert!(e.hot_keys().is_empty(), "uniform workload kept a NAL of {}", e.hot_keys().len());
    e.close().unwrap();
}
