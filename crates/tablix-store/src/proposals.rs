//! The proposals a replicated store applied lately, known by their
//! stamp's seed, so that a proposal sent again (to a new leader, after the
//! old one had replicated it) changes the state once.
//!
//! The table (`tablix_proposals`) holds, per entry, the seeds of the
//! Commands it applied, 8 bytes each: rows are appended in entry order and
//! cut from the front, so a group commit writes one row at the end of a
//! B-tree instead of a key per Command at random places in it (which cost
//! a page per Command and halved a cluster of one's rate at 16 clients).
//! The writer keeps the same set in memory for lookups, loaded at the
//! first entry it applies, changed only after a commit, and loaded again
//! after a snapshot replaces the state.
//!
//! The window is counted in Commands, so memory stays bounded whatever the
//! entries hold; which seeds it holds follows from the applied entries
//! alone, so every replica decides a repeat the same way.

use std::collections::{HashMap, VecDeque};

use rusqlite::Connection;

/// Commands remembered: a proposal sent again comes within seconds of the
/// first (a leader change), well inside this many Commands.
pub const REMEMBERED: usize = 100_000;

/// The set, as the committed state holds it.
#[derive(Debug, Default)]
pub(crate) struct Proposals {
    by_seed: HashMap<u64, u64>,
    /// The rows, oldest first: entry and its seeds.
    rows: VecDeque<(u64, Vec<u64>)>,
    held: usize,
}

/// What a transaction recorded, for the memory to follow once it commits.
#[derive(Debug, Default)]
pub(crate) struct Recorded {
    added: Vec<(u64, Vec<u64>)>,
    /// Rows up to this entry were cut.
    cut_to: Option<u64>,
}

fn encode(seeds: &[u64]) -> Vec<u8> {
    seeds.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn decode(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

impl Proposals {
    /// The set the committed state on `conn` holds.
    pub(crate) fn load(conn: &Connection) -> rusqlite::Result<Proposals> {
        let mut p = Proposals::default();
        let mut st =
            conn.prepare("SELECT entry, seeds FROM main.tablix_proposals ORDER BY entry")?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
        })?;
        for row in rows {
            let (entry, bytes) = row?;
            p.push(entry, decode(&bytes));
        }
        Ok(p)
    }

    pub(crate) fn contains(&self, seed: u64) -> bool {
        self.by_seed.contains_key(&seed)
    }

    fn push(&mut self, entry: u64, seeds: Vec<u64>) {
        for s in &seeds {
            self.by_seed.insert(*s, entry);
        }
        self.held += seeds.len();
        match self.rows.back_mut() {
            Some((last, held)) if *last == entry => held.extend(seeds),
            _ => self.rows.push_back((entry, seeds)),
        }
    }

    /// Records in the open transaction that the Commands `applied`
    /// (entry, seed), in order, were applied, and cuts the oldest rows
    /// past the window. The memory follows with [`Proposals::commit`] once
    /// the transaction commits.
    pub(crate) fn record(
        &self,
        conn: &Connection,
        applied: &[(u64, u64)],
    ) -> rusqlite::Result<Recorded> {
        let mut added: Vec<(u64, Vec<u64>)> = Vec::new();
        for (entry, seed) in applied {
            match added.last_mut() {
                Some((e, seeds)) if e == entry => seeds.push(*seed),
                _ => added.push((*entry, vec![*seed])),
            }
        }
        let mut insert = conn.prepare_cached(
            "INSERT INTO main.tablix_proposals(entry, seeds) VALUES (?1, ?2)
             ON CONFLICT(entry) DO UPDATE SET seeds = excluded.seeds",
        )?;
        for (entry, seeds) in &added {
            // An entry an earlier transaction applied part of: its row
            // is the last, and is written whole again.
            let row = match self.rows.back() {
                Some((last, held)) if last == entry => {
                    let mut all = held.clone();
                    all.extend(seeds);
                    encode(&all)
                }
                _ => encode(seeds),
            };
            insert.execute(rusqlite::params![*entry as i64, row])?;
        }
        // Whole rows leave from the front while the rest still exceed the
        // window (the newest row always stays).
        let mut held = self.held + applied.len();
        let mut cut_to = None;
        let oldest = self.rows.iter().map(|(e, s)| (*e, s.len()));
        let newest = added.iter().map(|(e, s)| (*e, s.len()));
        let mut all = oldest.chain(newest).peekable();
        while let Some((entry, n)) = all.next() {
            if held <= REMEMBERED || all.peek().is_none() {
                break;
            }
            held -= n;
            cut_to = Some(entry);
        }
        if let Some(to) = cut_to {
            conn.prepare_cached("DELETE FROM main.tablix_proposals WHERE entry <= ?1")?
                .execute([to as i64])?;
        }
        Ok(Recorded { added, cut_to })
    }

    /// Follows a committed [`Proposals::record`].
    pub(crate) fn commit(&mut self, recorded: Recorded) {
        for (entry, seeds) in recorded.added {
            self.push(entry, seeds);
        }
        if let Some(to) = recorded.cut_to {
            while self.rows.front().is_some_and(|(e, _)| *e <= to) {
                if let Some((entry, seeds)) = self.rows.pop_front() {
                    self.held -= seeds.len();
                    for s in seeds {
                        if self.by_seed.get(&s) == Some(&entry) {
                            self.by_seed.remove(&s);
                        }
                    }
                }
            }
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE main.tablix_proposals(entry INTEGER PRIMARY KEY, seeds BLOB NOT NULL) STRICT;",
        )
        .unwrap();
        c
    }

    #[test]
    fn the_window_is_counted_in_commands_and_the_table_and_memory_agree() {
        let c = conn();
        let mut p = Proposals::default();
        // Entries of 1,000 Commands each, seeds unique; the part of an
        // entry recorded by a later transaction joins its row.
        let mut next = 0u64;
        for entry in 1..=150u64 {
            for half in 0..2 {
                let applied: Vec<(u64, u64)> = (0..500)
                    .map(|_| {
                        next += 1;
                        (entry, next)
                    })
                    .collect();
                let _ = half;
                let r = p.record(&c, &applied).unwrap();
                p.commit(r);
            }
        }
        assert!(p.held() <= REMEMBERED, "{}", p.held());
        assert!(p.held() > REMEMBERED - 1000, "{}", p.held());
        assert!(p.contains(next), "the newest is remembered");
        assert!(!p.contains(1), "the oldest is forgotten");
        let loaded = Proposals::load(&c).unwrap();
        assert_eq!(loaded.held(), p.held());
        assert_eq!(loaded.by_seed, p.by_seed);
    }

    #[test]
    fn an_uncommitted_record_changes_nothing_in_memory() {
        let c = conn();
        let mut p = Proposals::default();
        let r = p.record(&c, &[(1, 7)]).unwrap();
        assert!(!p.contains(7));
        p.commit(r);
        assert!(p.contains(7));
    }
}
