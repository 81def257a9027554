//! Power failures (ADR and eADR) at every fence of a switch, so that crashes land in each phase
//! (install, flush, recycle) and right after it: values written into the old NAL from both nodes
//! (updates, deletes, inserts), the raw index's values, and a NAL key that was never written must
//! all come back exactly; `check()` passes and no PM leaks. Some recoveries crash again. Run over
//! both raw engines the issue names: FAST&FAIR and NBTree.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use numakv_fastfair::FastFair;
use numakv_index::{Engine, Index};
use numakv_nap::{phase, Inner, Nap, NapOptions, PhaseHook};
use numakv_nbtree::NbTree;
use numakv_pmem::{numa, CrashOptions, OpenConfig, PersistMode, Pool, PoolConfig, SimMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Phase transitions of the current trial with whether the pool had crashed by then.
type Log = Arc<Mutex<Vec<(u8, bool)>>>;

fn options<I: Inner>(pool: &Arc<Mutex<Weak<Pool>>>, log: &Log) -> NapOptions<I::Options> {
    let (pool, log) = (Arc::clone(pool), Arc::clone(log));
    let hook = move |p: u8| {
        let crashed = pool.lock().unwrap().upgrade().is_some_and(|p| p.has_crashed());
        log.lock().unwrap().push((p, crashed));
    };
    NapOptions { phase_hook: PhaseHook(Some(Arc::new(hook))), ..common::manual_options() }
}

/// The phase the crash hit: the last one entered before a transition saw the crash.
fn crash_phase(log: &[(u8, bool)], crashed: bool) -> Option<u8> {
    if !crashed {
        return None;
    }
    let mut last = phase::IDLE;
    for &(p, c) in log {
        if c {
            return Some(last);
        }
        last = p;
    }
    Some(last) // after the final transition: the switch had finished (IDLE)
}

fn recover<I: Inner>(dir: &Path, opts: &NapOptions<I::Options>, rng: &mut SmallRng) -> Nap<I> {
    for attempt in 0.. {
        let mut oc = OpenConfig::new(Nap::<I>::engine_id());
        oc.sim = SimMode::Shadow;
        let pool = Pool::open(dir, oc).unwrap();
        if attempt < 2 && rng.gen_bool(0.3) {
            pool.crash_after_fences(rng.gen_range(1..=40), CrashOptions::random(rng.gen()))
                .unwrap();
        }
        match Nap::<I>::open(Arc::clone(&pool), opts) {
            Ok(_) | Err(_) if pool.has_crashed() => continue,
            Ok((e, _)) => {
                pool.cancel_crash();
                return e;
            }
            Err(err) => panic!("recovery failed: {err}"),
        }
    }
    unreachable!()
}

#[test]
fn crash_in_every_phase_of_a_switch_fastfair_adr() {
    crash_in_every_phase_of_a_switch::<FastFair>(PersistMode::Adr);
}

#[test]
fn crash_in_every_phase_of_a_switch_nbtree_adr() {
    crash_in_every_phase_of_a_switch::<NbTree>(PersistMode::Adr);
}

// eADR: every store is durable at the crash; the shadow pool still counts fences as crash
// points, so crashes land in the same phases.
#[test]
fn crash_in_every_phase_of_a_switch_fastfair_eadr() {
    crash_in_every_phase_of_a_switch::<FastFair>(PersistMode::Eadr);
}

#[test]
fn crash_in_every_phase_of_a_switch_nbtree_eadr() {
    crash_in_every_phase_of_a_switch::<NbTree>(PersistMode::Eadr);
}

fn crash_in_every_phase_of_a_switch<I: Inner>(mode: PersistMode) {
    let seed: u64 =
        std::env::var("NUMAKV_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42);
    let mut rng = SmallRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let slot: Arc<Mutex<Weak<Pool>>> = Arc::new(Mutex::new(Weak::new()));
    let log: Log = Arc::default();
    let opts = options::<I>(&slot, &log);
    let mut seen = [0u32; 4];
    let mut fences = 1u64;
    for trial in 0.. {
        assert!(trial < 2_000, "the switch never finished before the crash");
        let dir = tmp.path().join(format!("t{trial}"));
        let mut cfg = PoolConfig::new(Nap::<I>::engine_id(), 32 << 20);
        cfg.nodes = 2;
        cfg.mode = mode;
        cfg.sim = SimMode::Shadow;
        let pool = Pool::create(&dir, cfg).unwrap();
        *slot.lock().unwrap() = Arc::downgrade(&pool);
        let e = Nap::<I>::create(Arc::clone(&pool), &opts).unwrap();
        let mut model = BTreeMap::new();
        for k in 1..=120u64 {
            e.insert(k, k).unwrap();
            model.insert(k, k);
        }
        // Old NAL: keys 1..=60, written from both nodes (two PC-views with interleaved
        // versions); keys 200.. inserted into it, some deleted.
        e.switch_to(&(1..=60).chain(200..=210).collect::<Vec<_>>()).unwrap();
        for i in 0..200u64 {
            numa::set_current_node((i % 2) as usize);
            let k = rng.gen_range(1..=60);
            match i % 5 {
                0 => {
                    e.remove(k).unwrap();
                    model.remove(&k);
                }
                1 => {
                    let k2 = 200 + i % 11;
                    if e.insert(k2, i).unwrap() {
                        model.insert(k2, i);
                    }
                }
                _ => {
                    e.upsert(k, 1_000 + i).unwrap();
                    model.insert(k, 1_000 + i);
                }
            }
        }
        log.lock().unwrap().clear();
        pool.crash_after_fences(fences, CrashOptions::random(rng.gen())).unwrap();
        // New NAL overlaps the old (range C), drops part of it (range B), adds raw keys and a
        // never-written key 500 (range A).
        let _ = e.switch_to(&(40..=100).chain([205, 500]).collect::<Vec<_>>());
        let crashed = pool.has_crashed();
        let hit = crash_phase(&log.lock().unwrap(), crashed);
        if !crashed {
            pool.crash(CrashOptions::STRICT).unwrap();
        }
        drop(e);
        drop(pool);
        let e = recover::<I>(&dir, &opts, &mut rng);
        for k in 1..=600u64 {
            assert_eq!(
                e.get(k).unwrap(),
                model.get(&k).copied(),
                "trial {trial} (fences {fences}, phase {hit:?}): key {k}"
            );
        }
        let r = e.check().unwrap();
        assert_eq!(r.reachable_blocks, r.allocated_blocks, "leak after trial {trial}");
        e.close().unwrap();
        match hit {
            Some(p) => seen[p as usize] += 1,
            None => break, // the switch completed before the crash point: every fence was tried
        }
        fences += if fences < 40 { 1 } else { rng.gen_range(1..=3) };
    }
    eprintln!(
        "{} {mode:?}: crashes per phase [idle-after, install, flush, recycle]: {seen:?}",
        I::NAP_NAME
    );
    assert!(
        seen[phase::INSTALL as usize] > 0
            && seen[phase::FLUSH as usize] > 0
            && seen[phase::RECYCLE as usize] > 0,
        "{seen:?}"
    );
}
