//! The key generators against theory: Zipfian top-k shares, uniform chi-square, determinism.

use numakv_bench::dist::{fnv_hash64, zeta, Dist, YCSB_ZETAN};
use numakv_bench::workload::{KeySpace, OpStream};
use numakv_bench::{presets, Mix, OpKind, Workload};
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn histogram(dist: &Dist, n: u64, draws: usize, seed: u64) -> Vec<u64> {
    let mut c = dist.chooser(n, 0, 1).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut h = vec![0u64; n as usize];
    for _ in 0..draws {
        h[c.next(&mut rng, n, false) as usize] += 1;
    }
    h
}

#[test]
fn zipf_top_k_shares_match_theory() {
    let (n, theta, draws) = (1000u64, 0.99, 400_000usize);
    let h = histogram(&Dist::Zipf { theta, scrambled: false }, n, draws, 11);
    let z = zeta(n, theta);
    let share = |i: usize| h[i] as f64 / draws as f64;
    // Items 0 and 1 have exact probabilities in YCSB's generator: 1/ζ and 2^-θ/ζ.
    let p0 = 1.0 / z;
    let p1 = 0.5f64.powf(theta) / z;
    assert!((share(0) - p0).abs() < 0.004, "top key {} vs 1/ζ = {p0}", share(0));
    assert!((share(1) - p1).abs() < 0.004, "second key {} vs {p1}", share(1));
    // The top-k shares follow Σ_{i≤k} i^-θ / ζ (the rest is Gray et al.'s approximation).
    for k in [10usize, 100] {
        let got: f64 = (0..k).map(share).sum();
        let want = zeta(k as u64, theta) / z;
        assert!((got - want).abs() < 0.03, "top-{k}: {got} vs {want}");
    }
    // Monotone on average: the top decile outweighs the bottom one many times over.
    let top: u64 = h[..100].iter().sum();
    let bottom: u64 = h[900..].iter().sum();
    assert!(top > 20 * bottom, "{top} vs {bottom}");
}

#[test]
fn scrambled_zipf_spreads_the_hot_key_like_ycsb() {
    let (n, draws) = (1000u64, 300_000usize);
    let h = histogram(&Dist::YCSB_ZIPF, n, draws, 5);
    let hottest = (0..n as usize).max_by_key(|&i| h[i]).unwrap();
    // The hottest rank (0) lands on fnv(0) mod n, with at least its 1/ζ(10¹⁰) share.
    assert_eq!(hottest as u64, fnv_hash64(0) % n);
    let share = h[hottest] as f64 / draws as f64;
    assert!(share > 1.0 / YCSB_ZETAN - 0.003, "hottest share {share}");
    // And the hot keys are not the low indices.
    let low: u64 = h[..10].iter().sum();
    assert!((low as f64 / draws as f64) < 0.1);
}

#[test]
fn uniform_passes_chi_square() {
    let (n, draws) = (100u64, 200_000usize);
    let h = histogram(&Dist::Uniform, n, draws, 3);
    let expected = draws as f64 / n as f64;
    let chi2: f64 = h.iter().map(|&o| (o as f64 - expected).powi(2) / expected).sum();
    // 99 degrees of freedom: mean 99, sd ≈ 14. 170 is five sd out.
    assert!(chi2 < 170.0, "chi-square {chi2}");
    assert!(chi2 > 40.0, "suspiciously uniform: {chi2}");
}

#[test]
fn latest_prefers_recent_inserts() {
    let n = 10_000u64;
    let d = Dist::Latest { theta: 0.99 };
    let h = histogram(&d, n, 50_000, 9);
    let newest: u64 = h[(n - 100) as usize..].iter().sum();
    assert!(newest as f64 / 50_000.0 > 0.5, "newest 1% got {newest}");
    assert!(h[(n - 1) as usize] > h[(n - 2) as usize]);
}

fn stream_ops(
    w: &Workload,
    seed: u64,
    worker: usize,
    count: usize,
) -> Vec<(OpKind, u64, u64, usize)> {
    let proto = w.dist.chooser(1000, 0, 2).unwrap();
    let space = KeySpace::new(1000);
    let mut s = OpStream::new(w, &proto, 1000, worker, 2, seed, count as u64);
    (0..count)
        .map(|_| {
            let op = s.next_op(&space, false);
            (op.kind, op.key, op.value, op.scan_len)
        })
        .collect()
}

#[test]
fn streams_are_deterministic_by_seed() {
    for name in ["ycsb-a", "ycsb-e", "nobtree-rmw", "f3tree-composite", "nap-scan-intensive"] {
        let w = presets::by_name(name).unwrap();
        let a = stream_ops(&w, 7, 0, 2000);
        assert_eq!(a, stream_ops(&w, 7, 0, 2000), "{name}: same seed, same ops");
        assert_ne!(a, stream_ops(&w, 8, 0, 2000), "{name}: another seed, other ops");
        assert_ne!(a, stream_ops(&w, 7, 1, 2000), "{name}: another worker, other ops");
    }
}

#[test]
fn mixes_are_honoured() {
    let w = Workload::new("m", Mix::new(&[(OpKind::Get, 95), (OpKind::Insert, 5)]))
        .with_dist(Dist::Uniform);
    let ops = stream_ops(&w, 1, 0, 40_000);
    let inserts = ops.iter().filter(|o| o.0 == OpKind::Insert).count() as f64 / 40_000.0;
    assert!((inserts - 0.05).abs() < 0.006, "insert share {inserts}");
    let ycsb_e = presets::by_name("ycsb-e").unwrap();
    let lens: Vec<usize> = stream_ops(&ycsb_e, 1, 0, 5000)
        .iter()
        .filter(|o| o.0 == OpKind::Scan)
        .map(|o| o.3)
        .collect();
    assert!(lens.iter().all(|&l| (1..=100).contains(&l)));
    assert!(lens.iter().any(|&l| l < 10) && lens.iter().any(|&l| l > 90));
}
