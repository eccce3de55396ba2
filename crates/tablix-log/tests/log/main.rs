//! The command log against a model: what is appended and synced is read
//! back after reopening, whatever was purged, truncated or torn.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use proptest::prelude::*;
use tablix_log::{Log, LogConfig, LogId};

fn small() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        keep_free: 2,
        ..LogConfig::default()
    }
}

fn payload(index: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (index as usize * 31 + i) as u8).collect()
}

fn open(dir: &Path) -> Log {
    Log::open(dir, small()).expect("open").0
}

/// A log in `dir` holding entries 1..=5 (40-byte payloads), synced.
fn five_synced(dir: &Path) -> Log {
    let mut log = open(dir);
    for i in 1..=5u64 {
        log.append(LogId { term: 1, index: i }, &payload(i, 40))
            .unwrap();
    }
    log.sync().unwrap();
    log
}

fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

#[test]
fn synced_entries_read_back_after_reopening_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    for i in 1..=200u64 {
        log.append(
            LogId {
                term: 1 + i / 100,
                index: i,
            },
            &payload(i, (i % 90) as usize),
        )
        .unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let (log, recovered) = Log::open(dir.path(), small()).unwrap();
    assert_eq!(recovered, Default::default());
    assert_eq!(
        log.last(),
        Some(LogId {
            term: 3,
            index: 200
        })
    );
    assert!(segment_files(dir.path()).len() > 3, "small segments roll");
    for e in log.entries(1..201).unwrap() {
        assert_eq!(e.id.term, 1 + e.id.index / 100);
        assert_eq!(e.payload, payload(e.id.index, (e.id.index % 90) as usize));
    }
}

#[test]
fn appends_take_the_next_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    let e = log.append(LogId { term: 1, index: 2 }, b"x").unwrap_err();
    assert!(e.to_string().contains("next index is 1"), "{e}");
    log.append(LogId { term: 1, index: 1 }, b"x").unwrap();
    assert!(log.append(LogId { term: 1, index: 1 }, b"x").is_err());
    let missing = log.entry(5).unwrap_err();
    assert!(missing.to_string().contains("no entry 5"), "{missing}");
}

#[test]
fn a_torn_tail_is_reported_cut_and_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let log = five_synced(dir.path());
    drop(log);
    // A record of a sixth entry written part-way: its header and half its
    // payload.
    let seg = segment_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let end = 40 + 5 * (24 + 40);
    bytes[end..end + 24].copy_from_slice(&[7u8; 24]);
    std::fs::write(&seg, &bytes).unwrap();
    let (mut log, recovered) = Log::open(dir.path(), small()).unwrap();
    assert_eq!(recovered.torn_tail, Some((seg.clone(), end as u64)));
    assert_eq!(log.last(), Some(LogId { term: 1, index: 5 }));
    log.append(LogId { term: 1, index: 6 }, b"six").unwrap();
    log.sync().unwrap();
    drop(log);
    let (log, recovered) = Log::open(dir.path(), small()).unwrap();
    assert_eq!(recovered.torn_tail, None, "the next append overwrote it");
    assert_eq!(log.entry(6).unwrap().payload, b"six");
}

#[test]
fn a_damaged_entry_with_entries_after_it_is_refused_until_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let log = five_synced(dir.path());
    // Damage under an open log: the read back says which entry.
    let seg = segment_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let third = 40 + 2 * (24 + 40);
    bytes[third + 24 + 3] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let e = log.entry(3).unwrap_err();
    assert!(
        e.to_string().contains("entry 3") && e.to_string().contains("checksum"),
        "{e}"
    );
    drop(log);
    // Entries 4 and 5 check after it: not a torn tail. The open is
    // refused and changes nothing; a read-only look says the same.
    let want = tablix_log::Damage {
        path: seg.clone(),
        offset: third as u64,
        index: 3,
        through: 5,
    };
    match Log::open(dir.path(), small()) {
        Err(tablix_log::LogError::Damaged(d)) => assert_eq!(d, want),
        other => panic!("opened a damaged log: {:?}", other.map(|(_, r)| r)),
    }
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "a refused open wrote");
    let seen = Log::inspect(dir.path()).unwrap();
    assert_eq!(seen.damage, Some(want.clone()));
    assert_eq!(seen.last, Some(LogId { term: 1, index: 2 }));
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "inspect wrote");
    // Discarding cuts before the damage, for good: a later append torn in
    // the same place is a torn tail, not the old entries found again.
    let discard = LogConfig {
        discard_damaged: true,
        ..small()
    };
    let (mut log, recovered) = Log::open(dir.path(), discard).unwrap();
    assert_eq!(recovered.discarded, Some(want));
    assert_eq!(log.last(), Some(LogId { term: 1, index: 2 }));
    log.append(LogId { term: 1, index: 3 }, &payload(3, 40))
        .unwrap();
    log.sync().unwrap();
    drop(log);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[third + 24 + 3] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let (log, recovered) = Log::open(dir.path(), small()).unwrap();
    assert_eq!(recovered.torn_tail, Some((seg, third as u64)));
    assert_eq!(log.last(), Some(LogId { term: 1, index: 2 }));
}

#[test]
fn damage_in_an_older_segment_is_refused_and_truncated_entries_never_return() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    for i in 1..=200u64 {
        log.append(LogId { term: 1, index: i }, &payload(i, 60))
            .unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let files = segment_files(dir.path());
    assert!(files.len() >= 3);
    // The first segment's fourth record.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let fourth = 40 + 3 * (24 + 60);
    bytes[fourth + 30] ^= 1;
    std::fs::write(&files[0], &bytes).unwrap();
    match Log::open(dir.path(), small()) {
        Err(tablix_log::LogError::Damaged(d)) => {
            assert_eq!((d.index, d.through, d.offset), (4, 200, fourth as u64));
        }
        other => panic!("opened a damaged log: {:?}", other.map(|(_, r)| r)),
    }
    bytes[fourth + 30] ^= 1;
    std::fs::write(&files[0], &bytes).unwrap();
    // Entries taken back, then an append torn where they were: their
    // bytes were zeroed, so the tear is only a torn tail.
    let mut log = open(dir.path());
    log.truncate(190).unwrap();
    log.append(
        LogId {
            term: 1,
            index: 190,
        },
        &payload(190, 60),
    )
    .unwrap();
    log.sync().unwrap();
    drop(log);
    // The record of entry 190: length 60, term 1, index 190.
    let mut head = 60u32.to_le_bytes().to_vec();
    head.extend_from_slice(&1u64.to_le_bytes());
    head.extend_from_slice(&190u64.to_le_bytes());
    let (last, at) = segment_files(dir.path())
        .into_iter()
        .find_map(|p| {
            let b = std::fs::read(&p).unwrap();
            let at = b.windows(head.len()).position(|w| w == head)?;
            Some((p, at - 4))
        })
        .unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    bytes[at + 30] ^= 1;
    std::fs::write(&last, &bytes).unwrap();
    let (log, recovered) = Log::open(dir.path(), small()).unwrap();
    assert!(recovered.torn_tail.is_some(), "{recovered:?}");
    assert_eq!(log.last().map(|l| l.index), Some(189));
}

#[test]
fn purged_segments_are_recycled_and_files_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    for i in 1..=2000u64 {
        log.append(LogId { term: 1, index: i }, &payload(i, 100))
            .unwrap();
        if i % 50 == 0 {
            log.sync().unwrap();
            log.purge(LogId {
                term: 1,
                index: i - 10,
            })
            .unwrap();
        }
    }
    log.sync().unwrap();
    let files = segment_files(dir.path()).len();
    assert!(files <= 5, "{files} segment files for a log of ~10 entries");
    assert_eq!(log.first_index(), 1991);
    drop(log);
    let log = open(dir.path());
    assert_eq!(
        log.last(),
        Some(LogId {
            term: 1,
            index: 2000
        })
    );
    assert!(log.first_index() <= 1991);
    for i in 1991..=2000 {
        assert_eq!(log.entry(i).unwrap().payload, payload(i, 100));
    }
}

#[test]
fn purging_past_the_end_empties_the_log_and_moves_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    log.append(LogId { term: 1, index: 1 }, b"a").unwrap();
    log.sync().unwrap();
    log.purge(LogId { term: 2, index: 40 }).unwrap();
    assert_eq!(log.next_index(), 41);
    log.append(LogId { term: 2, index: 41 }, b"b").unwrap();
    log.sync().unwrap();
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.purged(), Some(LogId { term: 2, index: 40 }));
    assert_eq!(log.last(), Some(LogId { term: 2, index: 41 }));
    assert!(log.entry(1).is_err());
}

#[test]
fn a_reset_log_restarts_at_any_index_durably() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = five_synced(dir.path());
    log.purge(LogId { term: 1, index: 3 }).unwrap();
    // Below the purged start and above the end alike.
    for before in [LogId { term: 2, index: 1 }, LogId { term: 4, index: 90 }] {
        log.reset(Some(before)).unwrap();
        assert_eq!(
            (log.first_index(), log.next_index()),
            (before.index + 1, before.index + 1)
        );
        assert_eq!(log.last(), Some(before));
        log.append(
            LogId {
                term: before.term,
                index: before.index + 1,
            },
            b"first",
        )
        .unwrap();
        log.sync().unwrap();
        drop(log);
        log = open(dir.path());
        assert_eq!(log.purged(), Some(before));
        assert_eq!(log.entry(before.index + 1).unwrap().payload, b"first");
        assert!(log.entry(before.index).is_err());
    }
    log.reset(None).unwrap();
    assert_eq!(log.next_index(), 1);
    log.append(LogId { term: 1, index: 1 }, b"again").unwrap();
    log.sync().unwrap();
    drop(log);
    assert_eq!(open(dir.path()).entry(1).unwrap().payload, b"again");
}

#[test]
fn a_power_loss_takes_back_every_write_after_the_last_sync() {
    let dir = tempfile::tempdir().unwrap();
    let power = std::sync::Arc::new(tablix_log::PowerModel::new());
    // Segments large enough that no roll (which syncs) happens.
    let config = LogConfig {
        power: Some(std::sync::Arc::clone(&power)),
        ..LogConfig::default()
    };
    let (mut log, _) = Log::open(dir.path(), config.clone()).unwrap();
    for i in 1..=5u64 {
        log.append(LogId { term: 1, index: i }, &payload(i, 40))
            .unwrap();
    }
    log.sync().unwrap();
    // Written to the file (past the write-behind buffer), never synced.
    log.append(LogId { term: 1, index: 6 }, &payload(6, 2 << 20))
        .unwrap();
    power.halt();
    let e = log.sync().unwrap_err();
    assert!(e.to_string().contains("lost power"), "{e}");
    drop(log);
    // Without the loss the written entries would be read back.
    let seen = Log::inspect(dir.path()).unwrap();
    assert!(seen.last.unwrap().index > 5, "{seen:?}");
    power.lose_unsynced().unwrap();
    let (log, _) = Log::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.last(), Some(LogId { term: 1, index: 5 }));
    for i in 1..=5 {
        assert_eq!(log.entry(i).unwrap().payload, payload(i, 40));
    }
}

#[test]
fn the_vote_is_replaced_whole_and_damage_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    assert_eq!(log.vote().unwrap(), None);
    log.save_vote(b"term 3, node 1").unwrap();
    log.save_vote(b"term 4, node 2").unwrap();
    drop(log);
    let log = open(dir.path());
    assert_eq!(log.vote().unwrap().as_deref(), Some(&b"term 4, node 2"[..]));
    let path = dir.path().join("vote");
    let mut b = std::fs::read(&path).unwrap();
    b[10] ^= 1;
    std::fs::write(&path, b).unwrap();
    assert!(log.vote().unwrap_err().to_string().contains("checksum"));
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<usize>),
    Sync,
    Truncate(u64),
    Purge(u64),
    /// Drops the log without a sync (a process crash: what was written
    /// survives, what was buffered may not) and opens it again.
    Reopen,
    /// The machine loses power: every write since the last sync is lost.
    PowerLoss,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec(0usize..1500, 1..6).prop_map(Op::Append),
        2 => Just(Op::Sync),
        1 => (0u64..8).prop_map(Op::Truncate),
        1 => (0u64..30).prop_map(Op::Purge),
        1 => Just(Op::Reopen),
        1 => Just(Op::PowerLoss),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Against a model of (index -> term, payload): every synced entry
    /// survives reopening; an unsynced one survives only if it is what was
    /// appended; nothing truncated comes back; indexes stay gapless.
    #[test]
    fn the_log_keeps_what_was_synced(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let with_power = |power: &std::sync::Arc<tablix_log::PowerModel>| {
            let config = LogConfig {
                power: Some(std::sync::Arc::clone(power)),
                ..small()
            };
            Log::open(dir.path(), config).expect("open").0
        };
        let mut power = std::sync::Arc::new(tablix_log::PowerModel::new());
        let mut log = with_power(&power);
        // Entries appended (index i at i - 1), terms non-decreasing.
        let mut model: Vec<(u64, usize)> = Vec::new();
        let mut synced = 0u64;
        let mut purged = 0u64;
        let mut term = 1u64;
        for op in ops {
            match &op {
                Op::Append(sizes) => {
                    for &len in sizes {
                        let index = log.next_index();
                        prop_assert_eq!(index, model.len() as u64 + 1);
                        term += (len % 7 == 0) as u64;
                        log.append(LogId { term, index }, &payload(index, len)).unwrap();
                        model.push((term, len));
                    }
                }
                Op::Sync => {
                    log.sync().unwrap();
                    synced = model.len() as u64;
                }
                Op::Truncate(back) => {
                    let back = *back;
                    let since = (model.len() as u64 + 1).saturating_sub(back).max(purged + 1);
                    if since <= model.len() as u64 {
                        log.truncate(since).unwrap();
                        model.truncate(since as usize - 1);
                        synced = synced.min(model.len() as u64);
                        term = model.last().map_or(term, |m| m.0).max(1);
                    }
                }
                Op::Purge(upto) => {
                    let upto = (*upto).min(synced);
                    if upto > purged {
                        let t = model[upto as usize - 1].0;
                        log.purge(LogId { term: t, index: upto }).unwrap();
                        purged = upto;
                    }
                }
                Op::Reopen | Op::PowerLoss => {
                    drop(log);
                    if matches!(op, Op::PowerLoss) {
                        power.halt();
                        power.lose_unsynced().unwrap();
                        power = std::sync::Arc::new(tablix_log::PowerModel::new());
                    }
                    log = with_power(&power);
                    let last = log.next_index() - 1;
                    // Purged entries may go; synced ones that were not
                    // purged may not.
                    prop_assert!(
                        last >= synced || synced <= purged,
                        "synced entry {} lost (log ends at {}, purged to {})", synced, last, purged
                    );
                    prop_assert!(last <= model.len() as u64);
                    model.truncate(last as usize);
                    // What a process crash left is written, not synced.
                    synced = synced.min(last);
                    prop_assert!(log.first_index() <= purged + 1);
                    purged = log.first_index() - 1;
                    term = model.last().map_or(term, |m| m.0);
                }
            }
            for index in purged + 1..=model.len() as u64 {
                let e = log.entry(index).unwrap();
                let (t, len) = model[index as usize - 1];
                prop_assert_eq!(e.id, LogId { term: t, index });
                prop_assert_eq!(e.payload, payload(index, len));
            }
        }
    }
}
