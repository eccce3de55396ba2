//! A search for one linearization of a history, memoized on the set of
//! operations placed and the object's state (Wing and Gong's search with
//! Lowe's cache, as Porcupine runs it), and the check of the order it
//! finds.
//!
//! `consistency_model`'s tester tries interleavings without remembering
//! the states it has seen, so a history in which one client's operation
//! hangs for seconds while the others go on (a paused leader) makes it
//! try every order of the operations around it: histories linearizable
//! by construction ran past a minute there. Here each (operations
//! placed, state) pair is explored once.
//!
//! A pass never rests on this search being right: the order it finds is
//! replayed against the specification and the real-time order by
//! [`verify`], which is short enough to read whole.

use std::collections::HashSet;
use std::hash::Hash;

use consistency_model::SequentialSpec;

/// One operation of a history: where it was invoked and where it
/// returned (`None`: in flight for ever, its outcome unknown, so it may
/// take effect anywhere after its invocation, or nowhere), in the
/// history's event positions.
#[derive(Clone, Debug)]
pub struct Operation<Op, Ret> {
    pub invoked: usize,
    pub returned: Option<(usize, Ret)>,
    pub op: Op,
}

/// What the search concluded.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// A linearization: indices into the operations, in the order they
    /// take effect; every returned operation is there, and those of
    /// unknown outcome that took effect.
    Found(Vec<usize>),
    /// Every order was tried: none is linearizable.
    None,
    /// The search kept more than `states` states and stopped.
    GaveUp { states: usize },
}

/// Searches for a linearization of `ops` from `init`, keeping at most
/// `max_states` explored states.
pub fn search<S>(init: &S, ops: &[Operation<S::Op, S::Ret>], max_states: usize) -> Outcome
where
    S: SequentialSpec + Clone + Hash + Eq,
    S::Ret: PartialEq,
{
    // Candidates are tried in the order they were invoked.
    let mut by_call: Vec<usize> = (0..ops.len()).collect();
    by_call.sort_by_key(|&i| ops[i].invoked);
    let words = ops.len().div_ceil(64);
    let mut placed = vec![0u64; words];
    let is_placed = |placed: &[u64], i: usize| placed[i / 64] & (1 << (i % 64)) != 0;
    let completed = ops.iter().filter(|o| o.returned.is_some()).count();

    // The path: each step's operation, the state before it, and where in
    // `by_call` the next candidate after it is.
    let mut path: Vec<(usize, S, usize)> = Vec::new();
    let mut state = init.clone();
    let mut placed_completed = 0;
    let mut seen: HashSet<(Vec<u64>, S)> = HashSet::new();
    let mut from = 0;
    loop {
        if placed_completed == completed {
            return Outcome::Found(path.iter().map(|(i, _, _)| *i).collect());
        }
        // No operation may take effect after one that returned before
        // it was invoked: candidates were invoked before the earliest
        // return of an operation not yet placed.
        let bound = ops
            .iter()
            .enumerate()
            .filter(|(i, _)| !is_placed(&placed, *i))
            .filter_map(|(_, o)| o.returned.as_ref().map(|(at, _)| *at))
            .min()
            .unwrap_or(usize::MAX);
        let mut next = None;
        for (k, &i) in by_call.iter().enumerate().skip(from) {
            if ops[i].invoked >= bound {
                break;
            }
            if is_placed(&placed, i) {
                continue;
            }
            let mut after = state.clone();
            let ret = after.invoke(&ops[i].op);
            if let Some((_, expected)) = &ops[i].returned
                && *expected != ret
            {
                continue;
            }
            placed[i / 64] |= 1 << (i % 64);
            let fresh = seen.insert((placed.clone(), after.clone()));
            if fresh {
                next = Some((k, i, after));
                break;
            }
            placed[i / 64] &= !(1 << (i % 64));
        }
        if seen.len() > max_states {
            return Outcome::GaveUp { states: seen.len() };
        }
        match next {
            Some((k, i, after)) => {
                path.push((i, std::mem::replace(&mut state, after), k + 1));
                if ops[i].returned.is_some() {
                    placed_completed += 1;
                }
                from = 0;
            }
            None => {
                // Nothing leads on from here: undo the last step and try
                // the candidate after it.
                let Some((i, before, resume)) = path.pop() else {
                    return Outcome::None;
                };
                placed[i / 64] &= !(1 << (i % 64));
                if ops[i].returned.is_some() {
                    placed_completed -= 1;
                }
                state = before;
                from = resume;
            }
        }
    }
}

/// Checks that `order` linearizes `ops` from `init`: each operation at
/// most once, every returned one present, each answering what it
/// returned when replayed in this order, and none placed before one
/// that returned before it was invoked.
pub fn verify<S>(init: &S, ops: &[Operation<S::Op, S::Ret>], order: &[usize]) -> Result<(), String>
where
    S: SequentialSpec + Clone,
    S::Op: std::fmt::Debug,
    S::Ret: PartialEq + std::fmt::Debug,
{
    let mut present = vec![false; ops.len()];
    for &i in order {
        let slot = present
            .get_mut(i)
            .ok_or_else(|| format!("operation {i} does not exist"))?;
        if *slot {
            return Err(format!("operation {i} is placed twice"));
        }
        *slot = true;
    }
    if let Some(i) = (0..ops.len()).find(|&i| ops[i].returned.is_some() && !present[i]) {
        return Err(format!("operation {i} returned but is not placed"));
    }
    let mut state = init.clone();
    for (p, &i) in order.iter().enumerate() {
        let ret = state.invoke(&ops[i].op);
        if let Some((_, expected)) = &ops[i].returned
            && *expected != ret
        {
            return Err(format!(
                "operation {i} ({:?}) at place {p} answers {ret:?}, not {expected:?}",
                ops[i].op
            ));
        }
        for &j in &order[..p] {
            if ops[i]
                .returned
                .as_ref()
                .is_some_and(|(at, _)| *at < ops[j].invoked)
            {
                return Err(format!(
                    "operation {j} is placed before operation {i}, which returned before {j} was invoked"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::register::{CasRegister, Op, Ret};

    fn op(invoked: usize, returned: Option<(usize, Ret)>, op: Op) -> Operation<Op, Ret> {
        Operation {
            invoked,
            returned,
            op,
        }
    }

    fn found(ops: &[Operation<Op, Ret>]) -> Vec<usize> {
        match search(&CasRegister::default(), ops, 1 << 20) {
            Outcome::Found(order) => {
                verify(&CasRegister::default(), ops, &order).unwrap();
                order
            }
            other => panic!("no linearization: {other:?}"),
        }
    }

    #[test]
    fn concurrent_operations_are_ordered_as_their_answers_need() {
        // Write(1) and Write(2) overlap; a read after both sees 1, so 2
        // took effect first.
        let ops = [
            op(0, Some((3, Ret::WriteOk)), Op::Write(1)),
            op(1, Some((2, Ret::WriteOk)), Op::Write(2)),
            op(4, Some((5, Ret::ReadOk(1))), Op::Read),
        ];
        assert_eq!(found(&ops), vec![1, 0, 2]);
    }

    #[test]
    fn an_operation_of_unknown_outcome_is_placed_only_where_it_is_seen() {
        let ops = [
            op(0, None, Op::Write(7)),
            op(1, Some((2, Ret::ReadOk(0))), Op::Read),
            op(3, Some((4, Ret::CasOk)), Op::Cas(7, 8)),
        ];
        assert_eq!(found(&ops), vec![1, 0, 2]);
        // Never seen: it need not take effect at all.
        let ops = [
            op(0, None, Op::Write(7)),
            op(1, Some((2, Ret::ReadOk(0))), Op::Read),
        ];
        assert_eq!(found(&ops), vec![1]);
    }

    #[test]
    fn a_stale_read_and_a_read_of_a_value_never_written_have_no_linearization() {
        let stale = [
            op(0, Some((1, Ret::WriteOk)), Op::Write(5)),
            op(2, Some((3, Ret::ReadOk(0))), Op::Read),
        ];
        assert_eq!(search(&CasRegister::default(), &stale, 1000), Outcome::None);
        // A write in flight cannot explain a read that came before it
        // was invoked.
        let early = [
            op(0, Some((1, Ret::ReadOk(9))), Op::Read),
            op(2, None, Op::Write(9)),
        ];
        assert_eq!(search(&CasRegister::default(), &early, 1000), Outcome::None);
        // Two compare-and-sets from the same value cannot both win.
        let twice = [
            op(0, Some((2, Ret::CasOk)), Op::Cas(0, 1)),
            op(1, Some((3, Ret::CasOk)), Op::Cas(0, 2)),
        ];
        assert_eq!(search(&CasRegister::default(), &twice, 1000), Outcome::None);
    }

    #[test]
    fn the_verifier_refuses_orders_that_break_the_history() {
        let ops = [
            op(0, Some((1, Ret::WriteOk)), Op::Write(5)),
            op(2, Some((3, Ret::ReadOk(5))), Op::Read),
            op(4, None, Op::Write(6)),
        ];
        let init = CasRegister::default();
        assert!(verify(&init, &ops, &[0, 1]).is_ok());
        assert!(verify(&init, &ops, &[0, 1, 2]).is_ok());
        let e = |order: &[usize]| verify(&init, &ops, order).unwrap_err();
        assert!(e(&[0]).contains("operation 1 returned but is not placed"));
        assert!(e(&[0, 0, 1]).contains("placed twice"));
        assert!(e(&[1, 0]).contains("answers ReadOk(0), not ReadOk(5)"));
        assert!(e(&[0, 2, 1]).contains("answers ReadOk(6)"));
        assert!(e(&[0, 1, 7]).contains("does not exist"));
        // Right answers, wrong real-time order: the read returned before
        // the unknown write was invoked.
        let ops = [
            op(0, Some((1, Ret::ReadOk(0))), Op::Read),
            op(2, None, Op::Write(0)),
        ];
        let e = verify(&init, &ops, &[1, 0]).unwrap_err();
        assert!(e.contains("returned before 1 was invoked"), "{e}");
    }

    fn generated(seed: u64) -> Vec<Operation<Op, Ret>> {
        crate::register::simulated(seed).operations().unwrap()
    }

    #[test]
    fn histories_linearizable_by_construction_are_linearized_and_a_changed_answer_is_caught() {
        let read_value = |o: &Operation<Op, Ret>| match o.returned {
            Some((_, Ret::ReadOk(v))) => Some(v),
            _ => None,
        };
        for seed in 1..=20u64 {
            let ops = generated(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            found(&ops);
            // One read that saw a write's value sees a value no write
            // ever gave.
            let mut never = ops.clone();
            let read = never
                .iter()
                .position(|o| read_value(o).is_some_and(|v| v != 0))
                .unwrap();
            never[read].returned =
                Some((never[read].returned.as_ref().unwrap().0, Ret::ReadOk(-1)));
            assert_eq!(
                search(&CasRegister::default(), &never, 1 << 22),
                Outcome::None,
                "seed {seed}: a value never written"
            );
            // The last read that saw another value sees what the first
            // read of a written value saw, seconds before: a stale read.
            let mut stale = ops;
            let old = stale
                .iter()
                .find_map(|o| read_value(o).filter(|v| *v != 0))
                .unwrap();
            let late = stale
                .iter()
                .rposition(|o| read_value(o).is_some_and(|v| v != old))
                .unwrap();
            stale[late].returned =
                Some((stale[late].returned.as_ref().unwrap().0, Ret::ReadOk(old)));
            assert_eq!(
                search(&CasRegister::default(), &stale, 1 << 22),
                Outcome::None,
                "seed {seed}: a stale read"
            );
        }
    }

    #[test]
    fn a_search_past_its_bound_gives_up() {
        let ops = generated(7);
        assert!(matches!(
            search(&CasRegister::default(), &ops, 10),
            Outcome::GaveUp { .. }
        ));
    }
}
