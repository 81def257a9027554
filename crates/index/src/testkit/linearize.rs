//! Per-key linearizability checking of concurrent histories, for the stress tests of the kit.
//!
//! A stress test runs threads against one [`Index`](crate::Index) and records an [`Event`] per
//! operation: the thread, the operation, what it returned, and two ticks taken from one global
//! counter (`fetch_add`): `invoke` just before the call, `response` just after it returned.
//!
//! Linearizability is local: a history is linearizable iff its restriction to every key is, so
//! [`check_history`] splits a multi-key history by key and [`check_key`] checks one key, seen as
//! a register holding `Option<u64>` (absent, or present with a value). A range scan is not atomic
//! across keys, but for each key of its range it is one atomic observation of that key; the test
//! records it as an [`Op::Observe`] of that key with the scan's ticks, outcome
//! `Value(Some(v))` for a returned pair and `Value(None)` for a key of the range it skipped.
//!
//! # Real-time order
//!
//! Event `a` precedes event `b` iff `a.response < b.invoke`; otherwise they overlap and either
//! order is allowed (equal ticks count as overlapping). The events of one thread must not overlap
//! (`response < next invoke`): a thread is sequential. Histories that break that, or whose
//! outcome does not fit the operation (`Get` answered with a `Bool`, ...), are refused as
//! malformed.
//!
//! # Algorithm
//!
//! A Wing & Gong search for a legal total order, with Lowe's memoisation of visited states
//! ("Testing for linearizability", 2017). Since every thread is sequential, the set of events
//! already placed is a prefix of each thread's events, so a search state is (next event index per
//! thread, current value). From a state, the next event `e` of thread `t` may be placed iff no
//! unplaced event precedes it: its later siblings cannot (they are invoked after `e` responds),
//! and for another thread `u` the earliest unplaced event is its next one `f_u`, whose response is
//! smaller than its successors', so the condition is `e.invoke <= f_u.response` for every other
//! thread `u` that still has events. `e` must also be legal in the current value (its outcome is
//! what the operation returns there). The search is a depth-first search over such states,
//! skipping states already visited (a state's future depends on nothing else).
//!
//! Partial-order reduction: a placeable event that is a pure observation (a read, or a failed
//! insert/update/remove: wherever it is legal it changes nothing) is placed at once, without
//! branching. That is complete: in any successful order from the state, moving it to the front
//! keeps every value the same (it has no effect anywhere), it is legal at the front (checked),
//! and it breaks no real-time constraint, because every event it overtakes is unplaced and,
//! the observation being placeable, does not precede it. (An upsert of the current value is not
//! pure: later in the order it could change the value, so it stays a branch.) With reads
//! absorbed, the branching left is between overlapping writes, which keeps ordinary stress
//! histories (threads × thousands of events per key) to about one state per event.
//!
//! A state budget ([`DEFAULT_STATE_BUDGET`], or [`check_key_with_budget`]) bounds the search; past
//! it the check fails with "search budget exceeded" rather than running for hours.
//!
//! The search does not rely on written values being unique per key; with unique values a few
//! cheap checks (a read of a value nobody wrote, or that was not written yet) fail fast with a
//! direct explanation.
//!
//! # Operations cut short by a crash
//!
//! An operation still running when the process crashed has [`Outcome::Unknown`]: it may or may
//! not have taken effect, with any result. It must be the last event of its thread, and its
//! `response` tick is ignored (it never responded, so it precedes nothing). Crash *recovery*
//! semantics (what a durable store must keep) are checked elsewhere in the kit; this only lets a
//! history around a crash be checked for linearizability.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

/// Distinct search states [`check_key`] explores before giving up: about 100 MiB at 4 threads,
/// and some hundred times what a plausible stress history of 4 × 2000 events needs.
pub const DEFAULT_STATE_BUDGET: usize = 2_000_000;

/// An operation on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`Index::insert`](crate::Index::insert) of this value; outcome `Bool`.
    Insert(u64),
    /// [`Index::upsert`](crate::Index::upsert) of this value; outcome `Unit`.
    Upsert(u64),
    /// [`Index::update`](crate::Index::update) to this value; outcome `Bool`.
    Update(u64),
    /// [`Index::get`](crate::Index::get); outcome `Value`.
    Get,
    /// [`Index::remove`](crate::Index::remove); outcome `Bool`.
    Remove,
    /// One key's part of a [`Index::scan`](crate::Index::scan): what the scan saw of this key;
    /// outcome `Value`.
    Observe,
}

/// What an operation returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// From `insert`, `update`, `remove`.
    Bool(bool),
    /// From `upsert`.
    Unit,
    /// From `get` and `Observe`: the value seen, `None` for absent.
    Value(Option<u64>),
    /// The operation never returned (a crash cut it short): it may or may not have taken effect.
    /// Only as the last event of its thread; its `response` tick is ignored.
    Unknown,
}

/// One operation of a history on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// The thread that ran it (any numbering; each thread is sequential).
    pub thread: usize,
    /// What it did.
    pub op: Op,
    /// What it returned.
    pub outcome: Outcome,
    /// Global tick taken just before the call.
    pub invoke: u64,
    /// Global tick taken just after the call returned (ignored for [`Outcome::Unknown`]).
    pub response: u64,
}

impl Event {
    /// An event; see the fields.
    pub fn new(thread: usize, op: Op, outcome: Outcome, invoke: u64, response: u64) -> Event {
        Event { thread, op, outcome, invoke, response }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Insert(v) => write!(f, "insert({v})"),
            Op::Upsert(v) => write!(f, "upsert({v})"),
            Op::Update(v) => write!(f, "update({v})"),
            Op::Get => f.write_str("get"),
            Op::Remove => f.write_str("remove"),
            Op::Observe => f.write_str("observe"),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Bool(b) => write!(f, "{b}"),
            Outcome::Unit => f.write_str("()"),
            Outcome::Value(v) => write!(f, "{}", Shown(*v)),
            Outcome::Unknown => f.write_str("?"),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "thread {} {} -> {} [{}, ", self.thread, self.op, self.outcome, self.invoke)?;
        match self.outcome {
            Outcome::Unknown => f.write_str("?]"),
            _ => write!(f, "{}]", self.response),
        }
    }
}

/// A register value in messages: `absent` or `Some(v)`.
struct Shown(Option<u64>);

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "Some({v})"),
            None => f.write_str("absent"),
        }
    }
}

/// `Ok(())` if some linearization of `events` (all on one key), starting from `initial`, explains
/// every outcome and ends in `final_state` (`None` = absent); otherwise `Err` with a short
/// explanation (the operations that cannot be placed at the furthest point the search reached,
/// with their ticks). Fails with "search budget exceeded" past [`DEFAULT_STATE_BUDGET`] states.
pub fn check_key(
    initial: Option<u64>,
    events: &[Event],
    final_state: Option<u64>,
) -> Result<(), String> {
    check_key_with_budget(initial, events, final_state, DEFAULT_STATE_BUDGET)
}

/// [`check_key`] with an explicit budget of distinct search states.
pub fn check_key_with_budget(
    initial: Option<u64>,
    events: &[Event],
    final_state: Option<u64>,
    budget: usize,
) -> Result<(), String> {
    let threads = split_threads(events)?;
    fast_checks(initial, &threads, final_state)?;
    Search::new(&threads, initial, final_state, budget).run()
}

/// Groups a multi-key history by key and checks each key with [`check_key`]; returns the first
/// failure, prefixed with its key.
///
/// `initial` and `final_state` are the maps before and after the run (a key not in them is
/// absent). The keys checked are `keys` together with every key that has events or appears in
/// either map, so a key no event touched must be the same before and after.
pub fn check_history(
    initial: &BTreeMap<u64, u64>,
    events: impl IntoIterator<Item = (u64, Event)>,
    final_state: &BTreeMap<u64, u64>,
    keys: impl IntoIterator<Item = u64>,
) -> Result<(), String> {
    let mut by_key: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    for key in keys.into_iter().chain(initial.keys().copied()).chain(final_state.keys().copied()) {
        by_key.entry(key).or_default();
    }
    for (key, event) in events {
        by_key.entry(key).or_default().push(event);
    }
    for (key, events) in &by_key {
        check_key(initial.get(key).copied(), events, final_state.get(key).copied())
            .map_err(|why| format!("key {key}: {why}"))?;
    }
    Ok(())
}

/// The effect of placing an event on the current value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The outcome is impossible in this value.
    Illegal,
    /// Legal, and the event is a pure observation: wherever it is legal, it changes nothing (a
    /// read, a failed insert/update/remove). Placed eagerly, see the module doc.
    Observe,
    /// Legal, and the value becomes this (possibly the same: an upsert of the current value is
    /// still a write, which elsewhere in the order would change the value).
    To(Option<u64>),
    /// An [`Outcome::Unknown`] write: it took no effect, or the value becomes this.
    Either(Option<u64>),
}

/// What `op` does to `value` when it takes effect (the outcome aside).
fn effect(op: Op, value: Option<u64>) -> Option<u64> {
    match op {
        Op::Insert(v) => value.or(Some(v)),
        Op::Upsert(v) => Some(v),
        Op::Update(v) => value.map(|_| v),
        Op::Remove => None,
        Op::Get | Op::Observe => value,
    }
}

fn step(e: &Event, value: Option<u64>) -> Step {
    let legal = |ok: bool, step: Step| if ok { step } else { Step::Illegal };
    match (e.op, e.outcome) {
        (Op::Get | Op::Observe, Outcome::Value(seen)) => legal(seen == value, Step::Observe),
        (Op::Get | Op::Observe, Outcome::Unknown) => Step::Observe,
        (op, Outcome::Unknown) => Step::Either(effect(op, value)),
        (Op::Insert(_), Outcome::Bool(false)) => legal(value.is_some(), Step::Observe),
        (Op::Update(_) | Op::Remove, Outcome::Bool(false)) => legal(value.is_none(), Step::Observe),
        (Op::Insert(v), Outcome::Bool(true)) => legal(value.is_none(), Step::To(Some(v))),
        (Op::Update(v), Outcome::Bool(true)) => legal(value.is_some(), Step::To(Some(v))),
        (Op::Remove, Outcome::Bool(true)) => legal(value.is_some(), Step::To(None)),
        (Op::Upsert(v), Outcome::Unit) => Step::To(Some(v)),
        _ => Step::Illegal, // refused as malformed by `split_threads`
    }
}

/// Validates the history and splits it into per-thread sequences sorted by invoke tick. Unknown
/// outcomes get `response = u64::MAX`: they precede nothing.
fn split_threads(events: &[Event]) -> Result<Vec<Vec<Event>>, String> {
    let mut by_thread: BTreeMap<usize, Vec<Event>> = BTreeMap::new();
    for e in events {
        let fits = matches!(
            (e.op, e.outcome),
            (_, Outcome::Unknown)
                | (Op::Insert(_) | Op::Update(_) | Op::Remove, Outcome::Bool(_))
                | (Op::Upsert(_), Outcome::Unit)
                | (Op::Get | Op::Observe, Outcome::Value(_))
        );
        if !fits {
            return Err(format!("malformed history: {e}: the outcome does not fit the operation"));
        }
        let mut e = *e;
        if e.outcome == Outcome::Unknown {
            e.response = u64::MAX;
        } else if e.response < e.invoke {
            return Err(format!("malformed history: {e}: responds before it is invoked"));
        }
        by_thread.entry(e.thread).or_default().push(e);
    }
    let mut threads: Vec<Vec<Event>> = by_thread.into_values().collect();
    for thread in &mut threads {
        thread.sort_by_key(|e| e.invoke);
        for pair in thread.windows(2) {
            if pair[0].outcome == Outcome::Unknown {
                return Err(format!(
                    "malformed history: {}: an operation cut short by a crash must be its \
                     thread's last, but {} follows",
                    pair[0], pair[1]
                ));
            }
            if pair[0].response >= pair[1].invoke {
                return Err(format!(
                    "malformed history: {} and {} overlap, but a thread is sequential",
                    pair[0], pair[1]
                ));
            }
        }
    }
    Ok(threads)
}

/// Cheap necessary conditions with direct explanations: every value read (or left at the end)
/// that is not the initial one was written by some operation, invoked before the read responded.
fn fast_checks(
    initial: Option<u64>,
    threads: &[Vec<Event>],
    final_state: Option<u64>,
) -> Result<(), String> {
    // Value → earliest invoke of an operation that may have written it.
    let mut first_write: HashMap<u64, u64> = HashMap::new();
    for e in threads.iter().flatten() {
        let written = match (e.op, e.outcome) {
            (Op::Insert(v) | Op::Update(v), Outcome::Bool(true) | Outcome::Unknown) => v,
            (Op::Upsert(v), _) => v,
            _ => continue,
        };
        let tick = first_write.entry(written).or_insert(e.invoke);
        *tick = (*tick).min(e.invoke);
    }
    for e in threads.iter().flatten() {
        let Outcome::Value(Some(seen)) = e.outcome else { continue };
        if Some(seen) == initial {
            continue;
        }
        match first_write.get(&seen) {
            None => {
                return Err(format!(
                    "{e} read {seen}, a value no operation wrote (initial {})",
                    Shown(initial)
                ))
            }
            Some(&tick) if e.response < tick => {
                return Err(format!(
                    "{e} read {seen} before any write of it began (first invoked at tick {tick})"
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(v) = final_state {
        if final_state != initial && !first_write.contains_key(&v) {
            return Err(format!("final value {v} was never written (initial {})", Shown(initial)));
        }
    }
    Ok(())
}

/// A search state: how many events of each thread are placed, and the value they leave.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    next: Box<[u32]>,
    value: Option<u64>,
}

/// A DFS stack frame: a state and the next (thread, choice) successor to try, as `2 × thread +
/// choice` (choice 1 is "took no effect", only for [`Outcome::Unknown`]).
struct Frame {
    state: State,
    cursor: usize,
}

struct Search<'h> {
    threads: &'h [Vec<Event>],
    initial: Option<u64>,
    final_state: Option<u64>,
    budget: usize,
    total: usize,
    visited: HashSet<State, BuildHasherDefault<FxHasher>>,
    /// The deepest state reached (most events placed): where the explanation looks.
    deepest: (usize, State),
    /// Some order placed every event but ended in this value instead of `final_state`.
    wrong_end: Option<Option<u64>>,
}

impl<'h> Search<'h> {
    fn new(
        threads: &'h [Vec<Event>],
        initial: Option<u64>,
        final_state: Option<u64>,
        budget: usize,
    ) -> Search<'h> {
        let root = State { next: vec![0; threads.len()].into_boxed_slice(), value: initial };
        Search {
            threads,
            initial,
            final_state,
            budget,
            total: threads.iter().map(Vec::len).sum(),
            visited: HashSet::default(),
            deepest: (0, root),
            wrong_end: None,
        }
    }

    fn next_event(&self, next: &[u32], t: usize) -> Option<&'h Event> {
        self.threads[t].get(next[t] as usize)
    }

    /// The thread whose next event precedes `t`'s next event (so that one cannot be placed yet).
    fn blocker(&self, next: &[u32], t: usize, e: &Event) -> Option<usize> {
        (0..self.threads.len())
            .filter(|&u| u != t)
            .find(|&u| self.next_event(next, u).is_some_and(|f| f.response < e.invoke))
    }

    /// Places every placeable pure observation, until none is left.
    fn absorb(&self, state: &mut State) {
        loop {
            let mut moved = false;
            for t in 0..self.threads.len() {
                while let Some(e) = self.next_event(&state.next, t) {
                    if self.blocker(&state.next, t, e).is_some()
                        || step(e, state.value) != Step::Observe
                    {
                        break;
                    }
                    state.next[t] += 1;
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// The successor of `state` for a cursor value, already absorbed.
    fn successor(&self, state: &State, cursor: usize) -> Option<State> {
        let (t, took_no_effect) = (cursor / 2, cursor % 2 == 1);
        let e = self.next_event(&state.next, t)?;
        if self.blocker(&state.next, t, e).is_some() {
            return None;
        }
        let value = match (step(e, state.value), took_no_effect) {
            (Step::To(v) | Step::Either(v), false) => v,
            (Step::Observe, false) | (Step::Either(_), true) => state.value,
            _ => return None,
        };
        let mut next = state.next.clone();
        next[t] += 1;
        let mut s = State { next, value };
        self.absorb(&mut s);
        Some(s)
    }

    fn placed(&self, state: &State) -> usize {
        state.next.iter().map(|&n| n as usize).sum()
    }

    fn run(mut self) -> Result<(), String> {
        let mut root = self.deepest.1.clone();
        self.absorb(&mut root);
        let mut stack = Vec::new();
        if self.visit(root, &mut stack)? {
            return Ok(());
        }
        let choices = 2 * self.threads.len();
        while let Some(frame) = stack.last_mut() {
            if frame.cursor == choices {
                stack.pop();
                continue;
            }
            let cursor = frame.cursor;
            frame.cursor += 1;
            if let Some(s) = self.successor(&frame.state, cursor) {
                if self.visit(s, &mut stack)? {
                    return Ok(());
                }
            }
        }
        Err(self.explain())
    }

    /// Records a newly reached state; `Ok(true)` if it is a successful end.
    fn visit(&mut self, s: State, stack: &mut Vec<Frame>) -> Result<bool, String> {
        let placed = self.placed(&s);
        if placed == self.total {
            if s.value == self.final_state {
                return Ok(true);
            }
            self.wrong_end = Some(s.value);
            return Ok(false);
        }
        if self.visited.contains(&s) {
            return Ok(false);
        }
        if self.visited.len() >= self.budget {
            return Err(format!(
                "search budget exceeded: {} states explored without deciding ({} operations on \
                 {} threads); too much overlap to check, narrow the intervals or check fewer \
                 operations per key",
                self.budget,
                self.total,
                self.threads.len()
            ));
        }
        self.visited.insert(s.clone());
        if placed > self.deepest.0 {
            self.deepest = (placed, s.clone());
        }
        stack.push(Frame { state: s, cursor: 0 });
        Ok(false)
    }

    fn explain(&self) -> String {
        let head = format!(
            "not linearizable: {} operations on {} threads from {}",
            self.total,
            self.threads.len(),
            Shown(self.initial)
        );
        if let Some(end) = self.wrong_end {
            return format!(
                "{head}: every operation can be placed, but the orders end in {} (e.g.), not \
                 the final state {}",
                Shown(end),
                Shown(self.final_state)
            );
        }
        let (placed, state) = &self.deepest;
        let mut msg = format!(
            "{head}: at best {placed} can be placed, leaving {}, and then none of these can:",
            Shown(state.value)
        );
        for t in 0..self.threads.len() {
            let Some(e) = self.next_event(&state.next, t) else { continue };
            let why = match self.blocker(&state.next, t, e) {
                Some(u) => match self.next_event(&state.next, u) {
                    Some(f) => format!("must come after {f}"),
                    None => String::from("blocked"),
                },
                None => format!("impossible on {}", Shown(state.value)),
            };
            msg.push_str(&format!("\n  {e}: {why}"));
            if let Some(before) = (state.next[t] as usize).checked_sub(1) {
                msg.push_str(&format!(" (after {})", self.threads[t][before]));
            }
        }
        msg
    }
}

/// The multiply-rotate hash of rustc (`FxHasher`): search states are small integer arrays, where
/// SipHash's DoS resistance buys nothing and costs most of the search time.
#[derive(Default)]
struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;

    use Op::*;
    use Outcome::{Bool, Unit, Unknown, Value};

    fn ev(thread: usize, op: Op, outcome: Outcome, invoke: u64, response: u64) -> Event {
        Event::new(thread, op, outcome, invoke, response)
    }

    /// The sequential specification, written independently of `step`: what `op` returns on
    /// `value`, and the value after.
    fn model(op: Op, value: Option<u64>) -> (Outcome, Option<u64>) {
        match op {
            Insert(v) if value.is_none() => (Bool(true), Some(v)),
            Insert(_) => (Bool(false), value),
            Upsert(v) => (Unit, Some(v)),
            Update(v) if value.is_some() => (Bool(true), Some(v)),
            Update(_) => (Bool(false), None),
            Get | Observe => (Value(value), value),
            Remove => (Bool(value.is_some()), None),
        }
    }

    /// A one-thread history running `ops` in order from `initial`, with the model's outcomes;
    /// and the final value.
    fn sequential(initial: Option<u64>, ops: &[Op]) -> (Vec<Event>, Option<u64>) {
        let mut value = initial;
        let mut events = Vec::new();
        for (i, &op) in ops.iter().enumerate() {
            let (outcome, next) = model(op, value);
            value = next;
            let tick = 10 * i as u64;
            events.push(ev(0, op, outcome, tick, tick + 5));
        }
        (events, value)
    }

    /// Replaces the outcome of event `i`.
    fn with_outcome(mut events: Vec<Event>, i: usize, outcome: Outcome) -> Vec<Event> {
        events[i].outcome = outcome;
        events
    }

    const SEQ: [Op; 12] = [
        Insert(1),
        Get,
        Insert(2),
        Update(3),
        Observe,
        Upsert(4),
        Remove,
        Remove,
        Update(5),
        Get,
        Insert(6),
        Get,
    ];

    #[test]
    fn sequential_history_passes() {
        let (events, end) = sequential(None, &SEQ);
        assert_eq!(end, Some(6));
        assert_eq!(events[2].outcome, Bool(false));
        assert_eq!(check_key(None, &events, Some(6)), Ok(()));
        assert_eq!(check_key(None, &[], None), Ok(()));
        assert_eq!(check_key(Some(9), &[], Some(9)), Ok(()));
    }

    #[test]
    fn sequential_get_of_a_value_never_written_fails() {
        let (events, _) = sequential(None, &SEQ);
        let bad = with_outcome(events, 1, Value(Some(77)));
        let err = check_key(None, &bad, Some(6)).unwrap_err();
        assert!(err.contains("no operation wrote"), "{err}");
        assert!(err.contains("thread 0 get -> Some(77) [10, 15]"), "{err}");
    }

    #[test]
    fn sequential_wrong_outcomes_fail() {
        let (events, _) = sequential(None, &SEQ);
        // insert(2) returning true while 1 is present; update(5) true on absent; the first
        // remove false while present; a get seeing absent while 1 is present.
        for (i, outcome) in [(2, Bool(true)), (8, Bool(true)), (6, Bool(false)), (1, Value(None))] {
            let bad = with_outcome(events.clone(), i, outcome);
            let err = check_key(None, &bad, Some(6)).unwrap_err();
            assert!(err.contains(&format!("{}", bad[i])), "event {i}: {err}");
            assert!(err.contains("impossible"), "event {i}: {err}");
        }
    }

    #[test]
    fn wrong_final_state_fails() {
        let (events, _) = sequential(None, &SEQ);
        let err = check_key(None, &events, Some(5)).unwrap_err();
        assert!(err.contains("final value 5 was never written"), "{err}");
        let err = check_key(None, &events, None).unwrap_err();
        assert!(err.contains("not the final state absent"), "{err}");
        assert!(check_key(Some(1), &[], None).is_err());
    }

    #[test]
    fn overlapping_writes_may_land_in_either_order() {
        let writes = [ev(0, Upsert(1), Unit, 1, 10), ev(1, Upsert(2), Unit, 2, 9)];
        for (seen, other) in [(1, 2), (2, 1)] {
            let mut events = writes.to_vec();
            events.push(ev(2, Get, Value(Some(seen)), 11, 12));
            assert_eq!(check_key(None, &events, Some(seen)), Ok(()));
            // Nothing writes between the read and the end.
            assert!(check_key(None, &events, Some(other)).is_err());
            // A read overlapping both writes may see either, or absent.
            let mut events = writes.to_vec();
            events.push(ev(2, Get, Value(Some(other)), 3, 4));
            events.push(ev(2, Get, Value(None), 5, 6));
            assert!(check_key(None, &events, Some(seen)).is_err()); // absent after a write
            events.pop();
            assert_eq!(check_key(None, &events, Some(seen)), Ok(()));
        }
        // Once both writes completed, two later sequential reads cannot disagree.
        let mut events = writes.to_vec();
        events.push(ev(2, Get, Value(Some(1)), 11, 12));
        events.push(ev(3, Get, Value(Some(2)), 13, 14));
        let err = check_key(None, &events, Some(2)).unwrap_err();
        assert!(err.contains("thread 3 get -> Some(2) [13, 14]: impossible on Some(1)"), "{err}");
    }

    #[test]
    fn stale_read_after_a_completed_write_fails() {
        let events = [
            ev(0, Insert(1), Bool(true), 1, 2),
            ev(0, Update(2), Bool(true), 3, 4),
            ev(1, Get, Value(Some(1)), 5, 6),
        ];
        let err = check_key(None, &events, Some(2)).unwrap_err();
        assert!(err.contains("thread 1 get -> Some(1) [5, 6]: impossible on Some(2)"), "{err}");
        // The same read overlapping the update is fine.
        let mut events = events;
        events[2].invoke = 4;
        assert_eq!(check_key(None, &events, Some(2)), Ok(()));
        // A stale absent after a completed insert.
        let events = [ev(0, Insert(1), Bool(true), 1, 2), ev(1, Observe, Value(None), 3, 4)];
        assert!(check_key(None, &events, Some(1)).is_err());
    }

    #[test]
    fn read_of_a_write_not_yet_invoked_fails() {
        let events = [ev(0, Get, Value(Some(7)), 1, 2), ev(1, Upsert(7), Unit, 3, 4)];
        let err = check_key(None, &events, Some(7)).unwrap_err();
        assert!(err.contains("before any write of it began"), "{err}");
        // With non-unique values the fast check passes (an early write of 7 exists) and the
        // search must find it: the early 7 was removed before the read began.
        let events = [
            ev(1, Upsert(7), Unit, 1, 2),
            ev(1, Remove, Bool(true), 3, 4),
            ev(0, Get, Value(Some(7)), 5, 6),
            ev(1, Upsert(7), Unit, 7, 8),
        ];
        let err = check_key(None, &events, Some(7)).unwrap_err();
        assert!(err.contains("thread 0 get -> Some(7) [5, 6]: impossible on absent"), "{err}");
    }

    #[test]
    fn observe_events_are_atomic_reads() {
        // A scan overlapping an insert may see the key or not; one after a remove may not.
        let base = [ev(0, Insert(5), Bool(true), 10, 20), ev(0, Remove, Bool(true), 30, 40)];
        for (seen, inv, resp, ok) in [
            (None, 15, 25, true),
            (Some(5), 15, 25, true),
            (Some(5), 35, 45, true),
            (Some(5), 41, 50, false),
            (None, 21, 29, false),
            (None, 1, 9, true),
        ] {
            let mut events = base.to_vec();
            events.push(ev(1, Observe, Value(seen), inv, resp));
            let got = check_key(None, &events, None);
            assert_eq!(got.is_ok(), ok, "observe {seen:?} [{inv}, {resp}]: {got:?}");
        }
    }

    #[test]
    fn crashed_operations_may_or_may_not_take_effect() {
        let base = [ev(0, Upsert(1), Unit, 1, 2), ev(1, Upsert(5), Unknown, 3, 0)];
        assert_eq!(check_key(None, &base, Some(5)), Ok(()));
        assert_eq!(check_key(None, &base, Some(1)), Ok(()));
        assert!(check_key(None, &base, None).is_err());
        let mut events = base.to_vec();
        events.push(ev(0, Get, Value(Some(5)), 10, 11));
        assert_eq!(check_key(None, &events, Some(5)), Ok(()));
        assert!(check_key(None, &events, Some(1)).is_err());
        // It took effect at most once, and never before it was invoked.
        events.push(ev(0, Get, Value(Some(1)), 12, 13));
        assert!(check_key(None, &events, Some(1)).is_err());
        let early = [ev(0, Get, Value(Some(5)), 1, 2), ev(1, Upsert(5), Unknown, 3, 0)];
        assert!(check_key(None, &early, Some(5)).is_err());
        // And it must be its thread's last operation.
        let err = check_key(
            None,
            &[ev(1, Upsert(5), Unknown, 3, 0), ev(1, Get, Value(None), 5, 6)],
            None,
        )
        .unwrap_err();
        assert!(err.starts_with("malformed"), "{err}");
    }

    #[test]
    fn malformed_histories_are_refused() {
        let overlap = [ev(0, Upsert(1), Unit, 1, 5), ev(0, Get, Value(Some(1)), 4, 6)];
        let mismatch = [ev(0, Get, Bool(true), 1, 2)];
        let backwards = [ev(0, Get, Value(None), 3, 2)];
        for events in [&overlap[..], &mismatch, &backwards] {
            let err = check_key(None, events, Some(1)).unwrap_err();
            assert!(err.starts_with("malformed history"), "{err}");
        }
    }

    #[test]
    fn the_budget_bounds_the_search() {
        // Twelve fully overlapping upserts of distinct values: any order is fine.
        let mut events: Vec<Event> =
            (0..12).map(|t| ev(t, Upsert(t as u64), Unit, 0, 100)).collect();
        assert_eq!(check_key_with_budget(None, &events, Some(11), 1000), Ok(()));
        assert_eq!(check_key(None, &events, Some(3)), Ok(()));
        // A read of absent after them all: refuting it takes every subset of placed writes
        // with each last value, about 12 × 2^11 states.
        events.push(ev(12, Get, Value(None), 101, 102));
        let err = check_key_with_budget(None, &events, Some(3), 1000).unwrap_err();
        assert!(err.starts_with("search budget exceeded"), "{err}");
        let err = check_key(None, &events, Some(3)).unwrap_err();
        assert!(err.starts_with("not linearizable"), "{err}");
    }

    #[test]
    fn history_check_reports_the_failing_key() {
        let initial = BTreeMap::from([(1, 10), (2, 20)]);
        let events = [
            (1, ev(0, Upsert(11), Unit, 1, 2)),
            (3, ev(0, Insert(30), Bool(true), 3, 4)),
            (3, ev(1, Get, Value(Some(30)), 5, 6)),
            (2, ev(1, Remove, Bool(true), 1, 2)),
        ];
        let good = BTreeMap::from([(1, 11), (3, 30)]);
        assert_eq!(check_history(&initial, events, &good, [4]), Ok(()));
        let bad = BTreeMap::from([(1, 11), (2, 20), (3, 30)]);
        let err = check_history(&initial, events, &bad, []).unwrap_err();
        assert!(err.starts_with("key 2: "), "{err}");
        // A key no event touched must be unchanged.
        let phantom = BTreeMap::from([(1, 11), (3, 30), (4, 40)]);
        let err = check_history(&initial, events, &phantom, []).unwrap_err();
        assert!(err.starts_with("key 4: "), "{err}");
    }

    /// SplitMix64: a tiny deterministic generator for the large histories.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Intervals for a sequential execution cut into threads: operation `i` takes effect at tick
    /// `4i + 1` and its interval is widened by `widen[i]` (left, right) ticks around it, then
    /// trimmed so each thread's operations stay sequential. Every real-time order of the result
    /// agrees with the execution order, so the history is linearizable by construction.
    fn intervals(threads: &[usize], widen: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let point = |i: usize| 4 * i as u64 + 1;
        let mut iv: Vec<(u64, u64)> = (0..threads.len())
            .map(|i| (point(i).saturating_sub(widen[i].0), point(i) + widen[i].1))
            .collect();
        let mut last: HashMap<usize, usize> = HashMap::new();
        for (i, &t) in threads.iter().enumerate() {
            if let Some(j) = last.insert(t, i) {
                // Split the gap between j and i of the same thread in proportion to how far
                // each wants to reach into it; split ∈ [point(j), point(i)).
                let (pj, pi) = (point(j), point(i));
                let (right, left) = (widen[j].1, widen[i].0);
                let split = pj + (pi - pj) * right / (right + left + 1);
                iv[j].1 = iv[j].1.min(split);
                iv[i].0 = iv[i].0.max(split + 1);
            }
        }
        iv
    }

    /// Runs `ops` (thread, op) sequentially from `initial` and turns them into a concurrent
    /// history with `intervals`; returns it and the final value.
    fn concurrent(
        initial: Option<u64>,
        ops: &[(usize, Op)],
        widen: &[(u64, u64)],
    ) -> (Vec<Event>, Option<u64>) {
        let threads: Vec<usize> = ops.iter().map(|&(t, _)| t).collect();
        let iv = intervals(&threads, widen);
        let mut value = initial;
        let mut events = Vec::new();
        for (i, &(t, op)) in ops.iter().enumerate() {
            let (outcome, next) = model(op, value);
            value = next;
            events.push(ev(t, op, outcome, iv[i].0, iv[i].1));
        }
        (events, value)
    }

    /// A stress-like history: 4 threads × about 2000 operations with unique written values.
    /// Intervals reach `reach` ticks (a quarter of that in operations) either side of the point
    /// where the operation takes effect, and now and then 1200 (a preempted thread). With
    /// `write_heavy`, nine operations in ten write; otherwise four in ten read.
    fn big_history(seed: u64, reach: u64, write_heavy: bool) -> (Vec<Event>, Option<u64>) {
        let mut rng = Rng(seed);
        let mut ops = Vec::new();
        let mut widen = Vec::new();
        for fresh in 1..=8000 {
            let dice = match write_heavy {
                true if rng.below(10) == 0 => 0,
                true => 11 + rng.below(9),
                false => rng.below(20),
            };
            let op = match dice {
                0..=5 => Get,
                6..=7 => Observe,
                8..=10 => Insert(fresh),
                11..=13 => Upsert(fresh),
                14..=16 => Update(fresh),
                _ => Remove,
            };
            ops.push((rng.below(4) as usize, op));
            let reach = if rng.below(100) == 0 { 1200 } else { reach };
            widen.push((rng.below(reach), rng.below(reach)));
        }
        concurrent(None, &ops, &widen)
    }

    /// `events` with one read near the end made stale: it returns the value of a write that a
    /// later mutation overwrote, all before the read began (values are unique, so nothing else
    /// wrote it). The fast checks pass, and refuting it takes the search through the whole
    /// history.
    fn with_stale_read(events: &[Event]) -> Vec<Event> {
        let mutation = |e: &Event| {
            matches!(
                (e.op, e.outcome),
                (Insert(_) | Update(_) | Remove, Bool(true)) | (Upsert(_), Unit)
            )
        };
        let r = (events.len() - 100..events.len())
            .find(|&i| events[i].op == Get)
            .expect("a read near the end");
        let clobber = events
            .iter()
            .filter(|e| mutation(e) && e.response < events[r].invoke)
            .max_by_key(|e| e.response)
            .expect("a mutation before the read");
        let stale = events
            .iter()
            .filter(|w| w.response < clobber.invoke)
            .filter_map(|w| match (w.op, w.outcome) {
                (Insert(v) | Update(v), Bool(true)) | (Upsert(v), Unit) => Some(v),
                _ => None,
            })
            .next_back()
            .expect("a write before the mutation");
        let mut bad = events.to_vec();
        bad[r].outcome = Value(Some(stale));
        bad
    }

    #[test]
    fn large_stress_histories_check_quickly() {
        // The budgets bound the work deterministically (the default is 2M states); the times
        // are printed for reference.
        for (seed, reach, write_heavy) in [(0, 24, false), (1, 24, false), (2, 120, true)] {
            let (events, end) = big_history(seed, reach, write_heavy);
            let start = Instant::now();
            let got = check_key_with_budget(None, &events, end, 20_000);
            let took = start.elapsed();
            assert_eq!(got, Ok(()), "seed {seed}");
            let bad = with_stale_read(&events);
            let start = Instant::now();
            let got = check_key_with_budget(None, &bad, end, 200_000);
            eprintln!(
                "{} events, reach {reach}, write-heavy {write_heavy}: passed in {took:?}, stale \
                 read refuted in {:?}",
                events.len(),
                start.elapsed()
            );
            let err = got.unwrap_err();
            assert!(err.starts_with("not linearizable"), "{err}");
            // A wrong final state (a value overwritten long ago) is refuted too, again only
            // after the whole history.
            let early = events.iter().find_map(|e| match e.op {
                Upsert(v) => Some(v),
                _ => None,
            });
            assert_ne!(early, end);
            let start = Instant::now();
            let err = check_key_with_budget(None, &events, early, 200_000).unwrap_err();
            eprintln!("  wrong final state refuted in {:?}", start.elapsed());
            assert!(err.starts_with("not linearizable"), "{err}");
        }
    }

    fn arb_op(values: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..values).prop_map(Insert),
            (0..values).prop_map(Upsert),
            (0..values).prop_map(Update),
            Just(Get),
            Just(Observe),
            Just(Remove),
        ]
    }

    fn arb_value(values: u64) -> impl Strategy<Value = Option<u64>> {
        proptest::option::of(0..values)
    }

    /// Brute force over every order that respects real time, written without the search's
    /// per-thread prefixes, memoisation or eager reads.
    fn brute_force(initial: Option<u64>, events: &[Event], final_state: Option<u64>) -> bool {
        fn response(e: &Event) -> u64 {
            if e.outcome == Unknown {
                u64::MAX
            } else {
                e.response
            }
        }
        fn go(events: &[Event], placed: &mut [bool], value: Option<u64>, end: Option<u64>) -> bool {
            if placed.iter().all(|&p| p) {
                return value == end;
            }
            for i in 0..events.len() {
                let e = &events[i];
                let minimal = (0..events.len())
                    .all(|j| placed[j] || j == i || response(&events[j]) >= e.invoke);
                if placed[i] || !minimal {
                    continue;
                }
                let (outcome, after) = model(e.op, value);
                let nexts = match e.outcome {
                    Unknown => vec![value, after],
                    seen if seen == outcome => vec![after],
                    _ => vec![],
                };
                for next in nexts {
                    placed[i] = true;
                    if go(events, placed, next, end) {
                        return true;
                    }
                    placed[i] = false;
                }
            }
            false
        }
        go(events, &mut vec![false; events.len()], initial, final_state)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any sequential execution, cut into threads and given intervals consistent with it,
        /// passes; written values repeat (4 of them), so nothing relies on their uniqueness.
        #[test]
        fn executions_with_consistent_intervals_pass(
            initial in arb_value(4),
            steps in proptest::collection::vec(
                (0..5usize, arb_op(4), (0..40u64, 0..40u64)), 0..80),
        ) {
            let ops: Vec<(usize, Op)> = steps.iter().map(|&(t, op, _)| (t, op)).collect();
            let widen: Vec<(u64, u64)> = steps.iter().map(|&(_, _, w)| w).collect();
            let (events, end) = concurrent(initial, &ops, &widen);
            prop_assert_eq!(check_key(initial, &events, end), Ok(()));
        }

        /// On small arbitrary histories (outcomes often wrong, random intervals, crashes), the
        /// search agrees with brute force.
        #[test]
        fn search_agrees_with_brute_force(
            initial in arb_value(3),
            final_state in arb_value(3),
            steps in proptest::collection::vec(
                (0..3usize, arb_op(3), 0..4u64, 0..6u64, 0..8u8, arb_value(3)), 0..8),
        ) {
            // Outcomes from a sequential run in list order, one in four replaced at random;
            // intervals random per thread (gap, length); the last event of thread 2 crashed.
            let mut value = initial;
            let mut clock = [0u64; 3];
            let mut events = Vec::new();
            for &(t, op, gap, len, dice, random) in &steps {
                let (mut outcome, next) = model(op, value);
                value = next;
                if dice < 2 {
                    outcome = match op {
                        Get | Observe => Value(random),
                        Upsert(_) => Unit,
                        _ => Bool(random.is_some()),
                    };
                }
                let invoke = clock[t] + gap;
                clock[t] = invoke + len + 1;
                events.push(ev(t, op, outcome, invoke, invoke + len));
            }
            if let Some(last) = events.iter_mut().rev().find(|e| e.thread == 2) {
                last.outcome = Unknown;
            }
            let expected = brute_force(initial, &events, final_state);
            let got = check_key(initial, &events, final_state);
            prop_assert_eq!(got.is_ok(), expected, "{:?}", got);
        }
    }
}
