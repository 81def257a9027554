//! The crash oracle's model (DESIGN.md §4): per key, the acknowledged state, at most one pending
//! operation, and the newest value a read has returned. It lives in words that survive the crash:
//! a `MAP_SHARED` side file for the eADR kill test, plain memory for the in-process ADR shadow
//! test.
//!
//! # Per-key words
//! `4 * (key - 1) + HEADER_WORDS ..`:
//! - `w0`, the state word:
//!   - bit 0 `PRESENT`: the acknowledged state has the key;
//!   - bit 1 `SLOT`: which of `w1`/`w2` holds the acknowledged value;
//!   - bit 2 `PENDING`: an operation was issued and has not been acknowledged; its argument is
//!     in the *other* value slot;
//!   - bits 3..6: the pending operation's [`Kind`].
//! - `w1`, `w2`: value slots.
//! - `w3`: the highest write sequence number a read has returned for this key.
//! - `w4`: the sequence number of the last acknowledged operation on the key (any kind).
//! - `w5`: the absence floor: the highest `w4` seen by a read that then returned `None`. A
//!   recovered value of a write with a sequence number at or below it is an absence a completed
//!   read returned being undone (durable linearizability of absences).
//!
//! A writer owns its keys: it sets `PENDING` (with the argument already in the free slot), runs
//! the operation, and acknowledges with one store of `w0` that flips `SLOT` if the value changed
//! and clears `PENDING`. A kill between any two of these stores leaves a state the checker reads
//! correctly: before the `PENDING` store the operation was never issued; after the final store
//! it was acknowledged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use numakv_pmem::crash::SideFile;

use super::{ensure, Verdict};

/// Words before the per-key area: `[0]` round, `[1]` operations acknowledged (progress),
/// `[2]` key count, `[3]` reserved.
pub(crate) const HEADER_WORDS: usize = 4;
const WORDS_PER_KEY: usize = 6;

const PRESENT: u64 = 1;
const SLOT: u64 = 2;
const PENDING: u64 = 4;
const KIND_SHIFT: u32 = 3;

/// Sequence-number encoding of written values: `value = (seq << 20 | key & 0xFFFFF) ^ SALT`.
/// The salt sets high bits so engines see values with the top bit set; the key in the low bits
/// makes every value unique per key as long as `seq` is.
const SALT: u64 = 0xA5C3_0000_0000_0000;

/// The value a writer stores for `key` as its `seq`-th write.
pub(crate) fn encode(key: u64, seq: u64) -> u64 {
    ((seq << 20) | (key & 0xF_FFFF)) ^ SALT
}

/// The sequence number of a value written by [`encode`].
pub(crate) fn seq_of(value: u64) -> u64 {
    (value ^ SALT) >> 20
}

/// A mutating operation the model tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Insert = 1,
    Upsert = 2,
    Update = 3,
    Remove = 4,
}

impl Kind {
    fn from_bits(b: u64) -> Option<Kind> {
        Some(match b {
            1 => Kind::Insert,
            2 => Kind::Upsert,
            3 => Kind::Update,
            4 => Kind::Remove,
            _ => return None,
        })
    }

    /// The state after this operation, applied to `before`, with argument `arg`.
    pub(crate) fn apply(self, before: Option<u64>, arg: u64) -> Option<u64> {
        match self {
            Kind::Insert => before.or(Some(arg)),
            Kind::Upsert => Some(arg),
            Kind::Update => before.map(|_| arg),
            Kind::Remove => None,
        }
    }

    /// The boolean result the operation must return from `before` (`None` for upsert).
    pub(crate) fn expected_result(self, before: Option<u64>) -> Option<bool> {
        match self {
            Kind::Insert => Some(before.is_none()),
            Kind::Upsert => None,
            Kind::Update | Kind::Remove => Some(before.is_some()),
        }
    }
}

enum Backing {
    Memory(Vec<AtomicU64>),
    File(SideFile),
}

/// The model of `keys` keys (`1..=keys`).
pub(crate) struct Model {
    backing: Backing,
    keys: u64,
}

impl Model {
    pub(crate) fn words_for(keys: u64) -> usize {
        HEADER_WORDS + WORDS_PER_KEY * keys as usize
    }

    /// A model in memory (ADR shadow crashes happen inside this process).
    pub(crate) fn in_memory(keys: u64) -> Model {
        let words = (0..Self::words_for(keys)).map(|_| AtomicU64::new(0)).collect();
        let m = Model { backing: Backing::Memory(words), keys };
        m.header(2).store(keys, Ordering::Relaxed);
        m
    }

    /// A model in a side file; `keys` is read from the file when it was set up by the parent.
    pub(crate) fn in_file(file: SideFile) -> Verdict<Model> {
        ensure!(file.len() >= HEADER_WORDS, "side file too short");
        let mut m = Model { backing: Backing::File(file), keys: 0 };
        m.keys = m.header(2).load(Ordering::Acquire);
        ensure!(
            Self::words_for(m.keys) <= m.word_count(),
            "side file holds fewer words than its key count needs"
        );
        Ok(m)
    }

    /// Writes the key count into a fresh side file.
    pub(crate) fn init_file(file: &SideFile, keys: u64) {
        if let Some(w) = file.word(2) {
            w.store(keys, Ordering::Release);
        }
    }

    fn word_count(&self) -> usize {
        match &self.backing {
            Backing::Memory(v) => v.len(),
            Backing::File(f) => f.len(),
        }
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        match &self.backing {
            Backing::Memory(v) => &v[i],
            // The constructor checked the length against the key count.
            Backing::File(f) => f.word(i).expect("side-file word inside the checked length"),
        }
    }

    pub(crate) fn header(&self, i: usize) -> &AtomicU64 {
        self.word(i)
    }

    pub(crate) fn keys(&self) -> u64 {
        self.keys
    }

    fn base(&self, key: u64) -> usize {
        debug_assert!((1..=self.keys).contains(&key));
        HEADER_WORDS + WORDS_PER_KEY * (key - 1) as usize
    }

    /// The acknowledged state of `key`.
    pub(crate) fn acked(&self, key: u64) -> Option<u64> {
        let b = self.base(key);
        // ORDERING: Acquire pairs with the Release of `ack`, so the value slot is read after the
        // state word that selects it was written.
        let s = self.word(b).load(Ordering::Acquire);
        self.acked_from(b, s)
    }

    fn acked_from(&self, b: usize, s: u64) -> Option<u64> {
        (s & PRESENT != 0)
            .then(|| self.word(b + 1 + ((s & SLOT) >> 1) as usize).load(Ordering::Relaxed))
    }

    /// Marks `kind(arg)` on `key` as issued. The owner thread of `key` only.
    pub(crate) fn begin(&self, key: u64, kind: Kind, arg: u64) {
        let b = self.base(key);
        let s = self.word(b).load(Ordering::Relaxed);
        let free = 1 - ((s & SLOT) >> 1) as usize;
        self.word(b + 1 + free).store(arg, Ordering::Relaxed);
        // ORDERING: Release; the argument is in its slot before PENDING says to look there (the
        // parent reads the side file after the child died, or another thread reads it live).
        self.word(b).store(
            (s & (PRESENT | SLOT)) | PENDING | ((kind as u64) << KIND_SHIFT),
            Ordering::Release,
        );
    }

    /// Acknowledges the pending operation on `key` (issued with argument `arg`), whose new state
    /// is `after`.
    pub(crate) fn ack(&self, key: u64, after: Option<u64>, arg: u64) {
        // ORDERING: Release, before the state word's own Release: a reader that loads `w4`
        // (Acquire) before its get knows every operation up to it had returned.
        self.word(self.base(key) + 4).store(seq_of(arg), Ordering::Release);
        self.settle(key, after);
        self.header(1).fetch_add(1, Ordering::Relaxed);
    }

    /// Makes `state` the acknowledged state of `key` and clears any pending operation, with one
    /// final store of the state word (see the module docs for why that is kill-safe).
    fn settle(&self, key: u64, state: Option<u64>) {
        let b = self.base(key);
        let s = self.word(b).load(Ordering::Relaxed);
        let new = if state == self.acked_from(b, s) {
            s & (PRESENT | SLOT)
        } else if let Some(v) = state {
            let free = 1 - ((s & SLOT) >> 1);
            self.word(b + 1 + free as usize).store(v, Ordering::Relaxed);
            PRESENT | (free << 1)
        } else {
            s & SLOT
        };
        // ORDERING: Release pairs with the Acquire in `acked`/`verify`: the value slot is
        // written before the state word selects it.
        self.word(b).store(new, Ordering::Release);
    }

    /// Records that a read returned `value` for `key` (a value written with [`encode`]).
    pub(crate) fn observed(&self, key: u64, value: u64) {
        let b = self.base(key);
        self.word(b + 3).fetch_max(seq_of(value), Ordering::AcqRel);
    }

    /// The sequence number of the last operation acknowledged on `key`, to be taken by a reader
    /// *before* its get (see [`Model::observed_absent`]).
    pub(crate) fn last_acked_seq(&self, key: u64) -> u64 {
        // ORDERING: Acquire; pairs with the Release in `ack`.
        self.word(self.base(key) + 4).load(Ordering::Acquire)
    }

    /// Records that a get invoked after the operation with sequence number `floor` had been
    /// acknowledged returned `None` for `key`.
    pub(crate) fn observed_absent(&self, key: u64, floor: u64) {
        self.word(self.base(key) + 5).fetch_max(floor, Ordering::AcqRel);
    }

    /// Checks the recovered state `actual` of `key` against the model and resolves the model to
    /// it (clearing any pending operation). The rules of DESIGN.md §4: acknowledged exact,
    /// pending all-or-nothing, no resurrected delete, no lost value a read returned.
    /// Returns whether an operation was pending (`Some(true)` if its effect survived).
    pub(crate) fn verify(
        &self,
        key: u64,
        actual: Option<u64>,
        durable_reads: bool,
    ) -> Verdict<Option<bool>> {
        let b = self.base(key);
        let s = self.word(b).load(Ordering::Acquire);
        let acked = self.acked_from(b, s);
        let mut allowed = vec![acked];
        let mut pending_desc = String::new();
        if s & PENDING != 0 {
            let free = 1 - ((s & SLOT) >> 1) as usize;
            let arg = self.word(b + 1 + free).load(Ordering::Relaxed);
            let Some(kind) = Kind::from_bits((s >> KIND_SHIFT) & 7) else {
                return Err(super::Violation(format!(
                    "model word of key {key} is corrupt: {s:#x}"
                )));
            };
            allowed.push(kind.apply(acked, arg));
            pending_desc = format!(", pending {kind:?}({arg:#x})");
        }
        ensure!(
            allowed.contains(&actual),
            "key {key}: recovered {actual:x?}, but the acknowledged state is {acked:x?}{pending_desc} \
             (acknowledged operations must be exact, pending ones all-or-nothing; a recovered value \
             where the model has none is a resurrected delete or a phantom)"
        );
        if durable_reads {
            let seen = self.word(b + 3).load(Ordering::Acquire);
            if let Some(v) = actual {
                ensure!(
                    seq_of(v) >= seen,
                    "key {key}: recovered value with write sequence {} but a read had returned the \
                     value of write {seen} before the crash (a value once read was lost)",
                    seq_of(v)
                );
                let floor = self.word(b + 5).load(Ordering::Acquire);
                ensure!(
                    floor == 0 || seq_of(v) > floor,
                    "key {key}: recovered the value of write {}, but a completed read had returned \
                     the key absent after operation {floor} was acknowledged (an absence once read \
                     was undone)",
                    seq_of(v)
                );
            }
        }
        let pending = (s & PENDING != 0).then(|| actual != acked || allowed[1] == acked);
        // Resolve: the recovered state becomes the acknowledged state.
        self.settle(key, actual);
        Ok(pending)
    }

    /// The acknowledged state of all keys (no key may be pending).
    pub(crate) fn snapshot(&self) -> BTreeMap<u64, u64> {
        (1..=self.keys).filter_map(|k| self.acked(k).map(|v| (k, v))).collect()
    }
}
