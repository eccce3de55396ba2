//! A compare-and-set register's history, recorded as clients run it
//! against a cluster, and its linearizability check.
//!
//! The check first searches for a linearization with a memoized search
//! (`linearization.rs`) and replays the order found against the register
//! and the real-time order: a history passes only with an order that
//! holds. A history for which the search finds none goes to an existing
//! checker, `consistency_model`'s (extracted from stateright), whose
//! verdict is the one reported. That checker alone, without memory of the
//! states it tried, ran past its limit on linearizable histories in which
//! one client's operation hung through a paused leader while the others
//! went on; the search settles those in milliseconds.
//!
//! An operation whose outcome the client cannot know (its request failed
//! in a way that may have left it applied) stays invoked and never
//! returns: the checker may place it anywhere after its invocation, or
//! nowhere. A read that failed changed nothing, so it is dropped from the
//! history instead (an operation in flight forever only slows the
//! checker).

use std::sync::Mutex;
use std::time::Duration;

use consistency_model::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::linearization::{self, Operation, Outcome};

/// Bytes the memoized search's states may take, about, before it leaves
/// the history to `consistency_model`: each state is a bit per operation
/// and a register value, kept in a hash set.
const SEARCH_BYTES: usize = 1 << 30;

/// States the search may keep for a history of `ops` operations.
fn search_states(ops: usize) -> usize {
    const PER_STATE: usize = 64;
    SEARCH_BYTES / (ops.div_ceil(64) * 8 + PER_STATE)
}

/// A register with compare-and-set: the reference a history must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CasRegister(pub i64);

#[derive(Clone, Debug)]
pub enum Op {
    Read,
    Write(i64),
    Cas(i64, i64),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Ret {
    ReadOk(i64),
    WriteOk,
    CasOk,
    CasFailed,
}

impl SequentialSpec for CasRegister {
    type Op = Op;
    type Ret = Ret;
    fn invoke(&mut self, op: &Op) -> Ret {
        match op {
            Op::Read => Ret::ReadOk(self.0),
            Op::Write(v) => {
                self.0 = *v;
                Ret::WriteOk
            }
            Op::Cas(old, new) if *old == self.0 => {
                self.0 = *new;
                Ret::CasOk
            }
            Op::Cas(..) => Ret::CasFailed,
        }
    }
}

enum Event {
    Invoke(u64, Op),
    Return(u64, Ret),
    Dropped,
}

/// Where an invocation sits in the history, to drop it if it was a read
/// that failed.
#[derive(Clone, Copy, Debug)]
pub struct Invoked(usize);

/// Invocations and returns in real-time order: each is appended under
/// one lock when it happens. A thread is a client's sequence of
/// operations; a client whose operation stays in flight goes on as a new
/// thread.
#[derive(Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
}

/// What a checked history held.
#[derive(Debug)]
pub struct Checked {
    pub invoked: usize,
    pub returned: usize,
    pub took: Duration,
    /// Which check settled it.
    pub by: &'static str,
}

impl History {
    fn events(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        // A poisoned lock means a client panicked, and its test fails
        // through that panic; the history itself stays whole.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn invoke(&self, thread: u64, op: Op) -> Invoked {
        let mut e = self.events();
        e.push(Event::Invoke(thread, op));
        Invoked(e.len() - 1)
    }

    pub fn returned(&self, thread: u64, ret: Ret) {
        self.events().push(Event::Return(thread, ret));
    }

    /// Takes back a read that failed.
    pub fn read_failed(&self, at: Invoked) {
        self.events()[at.0] = Event::Dropped;
    }

    /// Checks the history, taking at most about `limit` (on a history
    /// that is not linearizable the checker's search can take long, so it
    /// runs on a thread of its own). `Err` says why the history is not
    /// linearizable, could not be checked, or holds no more than
    /// `at_least` operations with a known outcome (too few to mean
    /// anything); `seed` and the whole history go into the message.
    pub fn check(&self, limit: Duration, seed: u64, at_least: usize) -> Result<Checked, String> {
        let events = std::mem::take(&mut *self.events());
        let invoked = events
            .iter()
            .filter(|e| matches!(e, Event::Invoke(..)))
            .count();
        let returned = events
            .iter()
            .filter(|e| matches!(e, Event::Return(..)))
            .count();
        // Written out for a history that fails, to be read by whoever
        // finds out why.
        let listing = listing(&events);
        let started = std::time::Instant::now();
        let fail = |why: String| Err(format!("{why} (seed {seed:#x}); the history:\n{listing}"));
        let ops = match operations(&events) {
            Ok(ops) => ops,
            Err(e) => return fail(format!("the recorded history is malformed: {e}")),
        };
        let searched =
            linearization::search(&CasRegister::default(), &ops, search_states(ops.len()));
        let by = match searched {
            Outcome::Found(order) => {
                if let Err(e) = linearization::verify(&CasRegister::default(), &ops, &order) {
                    return fail(format!(
                        "the memoized search's order does not hold ({e}): the search is wrong"
                    ));
                }
                "a memoized search, its order replayed"
            }
            Outcome::None | Outcome::GaveUp { .. } => {
                let exhausted = matches!(searched, Outcome::None);
                let searched = match searched {
                    Outcome::GaveUp { states } => format!("gave up after {states} states"),
                    _ => "tried every order".to_string(),
                };
                match consistency_model_within(events, limit.saturating_sub(started.elapsed())) {
                    None => {
                        return fail(format!(
                            "no linearizable order of the register's history was found: the memoized search {searched}, and consistency_model's found none within {limit:?}"
                        ));
                    }
                    Some(Err(e)) => {
                        return fail(format!("the recorded history is malformed: {e}"));
                    }
                    Some(Ok(false)) => {
                        return fail(format!(
                            "the register's history is not linearizable (the memoized search {searched})"
                        ));
                    }
                    Some(Ok(true)) if exhausted => {
                        return fail(
                            "consistency_model linearizes the history but the memoized search tried every order and found none: the search is wrong".to_string(),
                        );
                    }
                    Some(Ok(true)) => "consistency_model's checker",
                }
            }
        };
        if returned <= at_least {
            return Err(format!(
                "too few operations completed: {returned} (seed {seed:#x})"
            ));
        }
        Ok(Checked {
            invoked,
            returned,
            took: started.elapsed(),
            by,
        })
    }
}

impl History {
    /// The operations recorded so far, as the search takes them.
    #[cfg(test)]
    pub(crate) fn operations(&self) -> Result<Vec<Operation<Op, Ret>>, String> {
        operations(&self.events())
    }

    /// `consistency_model`'s verdict alone on the history (taken, as
    /// [`History::check`] takes it): `None` when it gave none within
    /// `limit` (its search goes on, on a thread of its own, until it
    /// ends). For comparing the two checks (`examples/checkers.rs`).
    pub fn consistency_model_alone(&self, limit: Duration) -> Option<Result<bool, String>> {
        consistency_model_within(std::mem::take(&mut *self.events()), limit)
    }
}

/// `consistency_model`'s verdict on `events`, or `None` when it gave
/// none within `limit`: on a history that is not linearizable its search
/// can take long, so it runs on a thread of its own (left to end by
/// itself).
fn consistency_model_within(events: Vec<Event>, limit: Duration) -> Option<Result<bool, String>> {
    let (verdict, checked) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = verdict.send(consistency_model_verdict(events));
    });
    checked.recv_timeout(limit).ok()
}

/// Runs `consistency_model`'s linearizability tester over `events`.
fn consistency_model_verdict(events: Vec<Event>) -> Result<bool, String> {
    let mut tester = LinearizabilityTester::new(CasRegister::default());
    for e in events {
        let step = match e {
            Event::Invoke(t, op) => tester.on_invoke(t, op).map(|_| ()),
            Event::Return(t, ret) => tester.on_return(t, ret).map(|_| ()),
            Event::Dropped => Ok(()),
        };
        step.map_err(|e| e.to_string())?;
    }
    Ok(tester.is_consistent())
}

/// A Jepsen client's next operation, a third of each kind: a read, a
/// write of the client's next value (`value`, a range of its own, so
/// every write is told apart), or a compare-and-set from 0 or from its
/// last value to a value no write gives.
pub fn next_op(rng: &mut Rng, value: &mut i64) -> Op {
    match rng.below(3) {
        0 => Op::Read,
        1 => {
            *value += 1;
            Op::Write(*value)
        }
        _ => Op::Cas(rng.below(2) as i64 * *value, *value + 1_000_000_000),
    }
}

/// A history recorded the way the Jepsen tests record one, from a
/// simulation linearizable by construction: four clients for ten
/// seconds, each operation taking effect at a random point strictly
/// inside its span; through pauses of 0.5-2 s (a paused leader) the
/// operations of the clients of one node hang while the others go on;
/// about one write in 120 has an unknown outcome (applied or not), after
/// which its client goes on as a new thread.
pub fn simulated(seed: u64) -> History {
    let mut rng = Rng(seed);
    let mut pauses = Vec::new();
    let mut t = 500;
    while t < 10_000 {
        let long = 500 + rng.below(1_500);
        pauses.push((t, t + long));
        t += long + 700 + rng.below(1_000);
    }
    struct Span {
        thread: u64,
        invoked: u64,
        returns: Option<u64>,
        effect: u64,
        op: Op,
        applied: bool,
    }
    let mut spans = Vec::new();
    for c in 0..4u64 {
        let (mut t, mut value, mut thread) = (rng.below(50), (c as i64 + 1) * 1_000_000, c << 32);
        while t < 10_000 {
            let op = next_op(&mut rng, &mut value);
            let mut took = 2 + rng.below(8);
            for &(from, to) in &pauses {
                if (from..to).contains(&t) && (c + from) % 3 == 0 {
                    took = to - t + rng.below(20);
                }
            }
            let unknown = !matches!(op, Op::Read) && rng.below(120) == 0;
            spans.push(Span {
                thread,
                invoked: t,
                returns: (!unknown).then_some(t + took),
                effect: t + rng.below(took),
                op,
                applied: !unknown || rng.below(2) == 0,
            });
            if unknown {
                thread += 1;
            }
            t += took + 20 + rng.below(60);
        }
    }
    let mut by_effect: Vec<usize> = (0..spans.len()).collect();
    by_effect.sort_by_key(|&i| spans[i].effect);
    let mut register = CasRegister::default();
    let mut answers = vec![None; spans.len()];
    for i in by_effect {
        if spans[i].applied {
            answers[i] = Some(register.invoke(&spans[i].op));
        }
    }
    // In time order, a return before an invocation at the same instant.
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        events.push((s.invoked, true, i));
        if let Some(at) = s.returns {
            events.push((at, false, i));
        }
    }
    events.sort();
    let history = History::default();
    for (_, invoke, i) in events {
        if invoke {
            history.invoke(spans[i].thread, spans[i].op.clone());
        } else {
            let ret = answers[i].clone();
            history.returned(
                spans[i].thread,
                ret.expect("an operation that returns was applied"),
            );
        }
    }
    history
}

/// The history's operations, each with the positions of its invocation
/// and its return (none: in flight for ever). A thread invokes one
/// operation at a time and returns only what it invoked.
fn operations(events: &[Event]) -> Result<Vec<Operation<Op, Ret>>, String> {
    let mut ops: Vec<Operation<Op, Ret>> = Vec::new();
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (at, e) in events.iter().enumerate() {
        match e {
            Event::Invoke(t, op) => {
                if open.insert(*t, ops.len()).is_some() {
                    return Err(format!(
                        "thread {t:#x} invoked {op:?} at {at} with an operation in flight"
                    ));
                }
                ops.push(Operation {
                    invoked: at,
                    returned: None,
                    op: op.clone(),
                });
            }
            Event::Return(t, ret) => {
                let i = open.remove(t).ok_or_else(|| {
                    format!("thread {t:#x} returned {ret:?} at {at} with nothing in flight")
                })?;
                ops[i].returned = Some((at, ret.clone()));
            }
            Event::Dropped => {}
        }
    }
    Ok(ops)
}

/// One line per event, in the order recorded: the thread (client in the
/// high half, its restarts after operations of unknown outcome in the
/// low), then the operation invoked or what it returned.
fn listing(events: &[Event]) -> String {
    let mut out = String::new();
    for (i, e) in events.iter().enumerate() {
        let line = match e {
            Event::Invoke(t, op) => format!("{i:5} {}.{} invoke {op:?}", t >> 32, t & 0xFFFF_FFFF),
            Event::Return(t, ret) => {
                format!("{i:5} {}.{} return {ret:?}", t >> 32, t & 0xFFFF_FFFF)
            }
            Event::Dropped => format!("{i:5} (a read that failed)"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The seed a randomized test runs with: `TABLIX_JEPSEN_SEED` (decimal,
/// or hexadecimal after `0x`) if set, else `default`. Panics, naming the
/// variable, on a value that is not a nonzero 64-bit number (xorshift
/// never leaves zero).
pub fn seed_from_env(default: u64) -> u64 {
    match std::env::var("TABLIX_JEPSEN_SEED") {
        Ok(text) => parse_seed(&text).unwrap_or_else(|| {
            panic!("TABLIX_JEPSEN_SEED={text:?} is not a nonzero 64-bit number (decimal or 0x...)")
        }),
        Err(_) => default,
    }
}

fn parse_seed(text: &str) -> Option<u64> {
    let text = text.trim();
    let seed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => text.parse().ok()?,
    };
    (seed != 0).then_some(seed)
}

/// A small deterministic generator (xorshift): a test's choices follow
/// from its printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn draw(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_read_in_decimal_or_hex_and_zero_or_junk_is_refused() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x5eed "), Some(0x5eed));
        assert_eq!(parse_seed("0X10"), Some(16));
        assert_eq!(parse_seed("0"), None);
        assert_eq!(parse_seed("0x"), None);
        assert_eq!(parse_seed("seed"), None);
        assert_eq!(parse_seed("0x1_0000_0000_0000_0000"), None);
    }

    #[test]
    fn a_stale_read_after_a_write_returned_is_not_linearizable() {
        let h = History::default();
        h.invoke(1, Op::Write(5));
        h.returned(1, Ret::WriteOk);
        h.invoke(2, Op::Read);
        h.returned(2, Ret::ReadOk(0));
        let e = h.check(Duration::from_secs(10), 1, 0).unwrap_err();
        assert!(e.contains("not linearizable"), "{e}");
        // The history comes with it, to find out why.
        assert!(e.contains("    0 0.1 invoke Write(5)\n"), "{e}");
        assert!(e.contains("    3 0.2 return ReadOk(0)\n"), "{e}");
    }

    #[test]
    fn a_write_in_flight_may_be_seen_or_not_and_a_failed_read_is_dropped() {
        let h = History::default();
        h.invoke(1, Op::Write(5));
        h.invoke(2, Op::Read);
        h.returned(2, Ret::ReadOk(0));
        let failed = h.invoke(3, Op::Read);
        h.read_failed(failed);
        h.invoke(4, Op::Read);
        h.returned(4, Ret::ReadOk(5));
        h.invoke(5, Op::Cas(5, 6));
        h.returned(5, Ret::CasOk);
        let c = h.check(Duration::from_secs(10), 1, 0).unwrap();
        assert_eq!((c.invoked, c.returned), (4, 3));
        assert_eq!(c.by, "a memoized search, its order replayed");
    }

    #[test]
    fn a_thread_invoking_twice_at_once_or_returning_nothing_is_a_malformed_history() {
        let h = History::default();
        h.invoke(1, Op::Read);
        h.invoke(1, Op::Write(3));
        let e = h.check(Duration::from_secs(10), 1, 0).unwrap_err();
        assert!(
            e.contains("malformed: thread 0x1 invoked Write(3) at 1 with an operation in flight"),
            "{e}"
        );
        let h = History::default();
        h.returned(2, Ret::WriteOk);
        let e = h.check(Duration::from_secs(10), 1, 0).unwrap_err();
        assert!(
            e.contains("malformed: thread 0x2 returned WriteOk at 0"),
            "{e}"
        );
    }

    #[test]
    fn a_history_with_too_few_known_outcomes_is_refused() {
        let h = History::default();
        h.invoke(1, Op::Write(5));
        h.returned(1, Ret::WriteOk);
        let e = h.check(Duration::from_secs(10), 1, 1).unwrap_err();
        assert!(e.contains("too few operations completed: 1"), "{e}");
    }
}
