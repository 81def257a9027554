//! Bad-input oracle: reserved keys, stores of another engine or format version, a store that was
//! never initialised, and pool exhaustion — each a typed error, never a panic, never a corrupted
//! or unusable store.

use std::collections::BTreeMap;

use numakv_pmem::{EngineId, OpenConfig, PersistMode, Pool, PoolConfig, PoolError, SimMode};

use super::differential::{check_entries, step, Op};
use super::{ensure, fail, scratch, Kit, Verdict};
use crate::api::Engine;
use crate::error::Error;

impl<E: Engine> Kit<E> {
    /// Runs every bad-input check.
    pub fn bad_input(&self) -> Verdict {
        self.reserved_keys()?;
        self.foreign_stores()?;
        self.out_of_space()
    }

    fn reserved_keys(&self) -> Verdict {
        let dir = scratch()?;
        let e = self.create_in(&dir.path().join("store"), PersistMode::Adr, SimMode::Direct)?;
        let mut model = BTreeMap::new();
        for k in 1..=100 {
            step(&e, &mut model, &Op::Insert(k, k))?;
        }
        // `step` demands InvalidKey for reserved keys and leaves the model untouched.
        for k in [0, u64::MAX] {
            for op in
                [Op::Insert(k, 1), Op::Upsert(k, 1), Op::Update(k, 1), Op::Get(k), Op::Remove(k)]
            {
                step(&e, &mut model, &op)?;
            }
        }
        check_entries(&e, &model)?;
        e.close().or_else(|err| fail("close()", err))
    }

    fn foreign_stores(&self) -> Verdict {
        let dir = scratch()?;
        let others = [
            EngineId::new(format!("not-{}", E::NAME), E::FORMAT_VERSION),
            EngineId::new(E::NAME, E::FORMAT_VERSION + 1),
        ];
        for (i, other) in others.into_iter().enumerate() {
            let path = dir.path().join(format!("other{i}"));
            let mut cfg = self.pool_config(PersistMode::Adr, SimMode::Direct);
            cfg.engine = other.clone();
            let pool = Pool::create(&path, cfg).or_else(|e| fail("creating a foreign pool", e))?;
            pool.close().or_else(|e| fail("closing a foreign pool", e))?;
            drop(pool);
            match Pool::open(&path, OpenConfig::new(E::engine_id())) {
                Err(PoolError::EngineMismatch { .. }) => {}
                Err(e) => {
                    return fail(format!("opening a store of {other:?} (want EngineMismatch)"), e)
                }
                Ok(_) => {
                    return Err(super::Violation(format!(
                        "a store of {other:?} was opened as {}",
                        E::NAME
                    )))
                }
            }
        }
        // A pool that names this engine but was never initialised by it (empty root slots):
        // open must fail with a typed error.
        let path = dir.path().join("blank");
        let pool = Pool::create(&path, self.pool_config(PersistMode::Adr, SimMode::Direct))
            .or_else(|e| fail("creating a blank pool", e))?;
        match E::open(pool, &self.opts) {
            Err(Error::Corrupted { .. } | Error::Pool(_)) => Ok(()),
            Err(e) => fail("opening a never-initialised store (want Corrupted)", e),
            Ok(_) => Err(super::Violation("a never-initialised store opened as an index".into())),
        }
    }

    fn out_of_space(&self) -> Verdict {
        let dir = scratch()?;
        let path = dir.path().join("store");
        let mut cfg = PoolConfig::new(E::engine_id(), self.small_capacity_per_node);
        cfg.nodes = self.nodes;
        let pool = Pool::create(&path, cfg).or_else(|e| fail("creating a small pool", e))?;
        let e = E::create(pool, &self.opts).or_else(|err| fail("create on a small pool", err))?;
        let mut model = BTreeMap::new();
        let mut k: u64 = 0;
        let err = loop {
            k += 1;
            ensure!(k < 50_000_000, "{} inserts never exhausted a small pool", k);
            // Scrambled keys: splits everywhere, not just at the right edge.
            let key = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (u64::MAX - 2) + 1;
            match e.insert(key, k) {
                Ok(true) => {
                    model.insert(key, k);
                }
                Ok(false) => {}
                Err(err) => break err,
            }
        };
        ensure!(err.is_out_of_space(), "a full pool must fail with OutOfSpace, got: {err}");
        // The store stays readable and consistent, and a failed insert left nothing behind.
        check_entries(&e, &model)?;
        for (i, (&key, &v)) in model.iter().enumerate().step_by(97) {
            match e.get(key) {
                Ok(got) => ensure!(got == Some(v), "after OutOfSpace: get #{i} returned {got:?}"),
                Err(err) => return fail("get after OutOfSpace", err),
            }
        }
        e.close().or_else(|err| fail("close() after OutOfSpace", err))?;
        let e = self.open_in(&path, SimMode::Direct)?;
        check_entries(&e, &model)?;
        // Still usable: removing frees room for more inserts.
        let victims: Vec<u64> = model.keys().copied().step_by(2).collect();
        for key in victims {
            match e.remove(key) {
                Ok(true) => {
                    model.remove(&key);
                }
                Ok(false) => {
                    return Err(super::Violation(format!(
                        "remove({key}) after OutOfSpace returned false"
                    )))
                }
                Err(err) if err.is_out_of_space() => {}
                Err(err) => return fail("remove after OutOfSpace", err),
            }
        }
        check_entries(&e, &model)?;
        e.close().or_else(|err| fail("final close()", err))
    }
}
