//! Every store operation of the queue × every place a write can fail in it: the first, a
//! middle and the last transaction, the first write, the checkpoint after, a disk that stays
//! full, with `SQLITE_FULL` and `SQLITE_IOERR`. After the faulted operation the exact ledger,
//! the table and memory must agree, with no event in two places; then space returns, and
//! every tracked event is delivered exactly once or counted dropped.

use std::collections::HashMap;

use super::failure_tests::{Faulty, event_of, params_of};
use super::*;
use crate::event::SendNote;
use crate::quarantine::QuarantinedEvent;
use crate::stats::{Entry, Exit};
use store::faults::{FaultError, FaultSite};

#[derive(Clone, Copy, Debug)]
enum Op {
    Spill,
    Persist,
    TrackBatch,
    DurablePush,
    Ack,
    Expire,
    DropExpired,
    Quarantine,
    Redrive,
    Purge,
    NoteSends,
}

const OPS: [Op; 11] = [
    Op::Spill,
    Op::Persist,
    Op::TrackBatch,
    Op::DurablePush,
    Op::Ack,
    Op::Expire,
    Op::DropExpired,
    Op::Quarantine,
    Op::Redrive,
    Op::Purge,
    Op::NoteSends,
];

#[derive(Clone, Copy, Debug)]
enum Fault {
    Commit(u64),
    FirstWrite,
    CheckpointAfter,
    DiskStaysFull,
}

const FAULTS: [Fault; 6] = [
    Fault::Commit(1),
    Fault::Commit(2),
    Fault::Commit(3),
    Fault::FirstWrite,
    Fault::CheckpointAfter,
    Fault::DiskStaysFull,
];

const NOW_MS: i64 = 1_764_417_600_000;

struct Case {
    f: Faulty,
    seq: u64,
    /// Ids delivered (acknowledged) so far, and how often.
    delivered: HashMap<String, u32>,
    durability: Durability,
}

impl Case {
    fn new(dir: &std::path::Path, durability: Durability) -> Case {
        // 256 KiB: an 8 KiB transaction, so a spill chunk is many of them, and the cap is close.
        let f = Faulty::open(dir, 256 << 10, params_of(10, durability));
        let mut c = Case {
            f,
            seq: 0,
            delivered: HashMap::new(),
            durability,
        };
        // A backlog on disk, some of it in a quarantine, and events in memory.
        c.track(120, 250);
        c.f.q.persist().unwrap();
        let batch = c.f.q.next_batch(5, u64::MAX);
        let entries = batch
            .iter()
            .map(|(e, _)| QuarantinedEvent::new(e, "rejected", "no".into(), Some(200), 1, 0))
            .collect();
        c.f.q.quarantine(entries, &batch, NOW_MS).unwrap();
        c.f.q.ack(&batch).unwrap();
        c.f.counters.left(Exit::Quarantined, batch.len() as u64);
        c.track(8, 250);
        c.f.check().unwrap();
        c
    }

    fn events(&mut self, n: u64, pad: usize) -> Vec<QueuedEvent> {
        (0..n)
            .map(|_| {
                self.seq += 1;
                event_of(self.seq, pad, false)
            })
            .collect()
    }

    fn track(&mut self, n: u64, pad: usize) {
        let events = self.events(n, pad);
        match self.durability {
            Durability::Spill => self.f.track(events),
            Durability::Always => {
                self.f.counters.entered(Entry::Tracked, n);
                let _ = self.f.q.push_durably(events, None);
            }
        }
    }

    fn deliver(&mut self, batch: &[(QueuedEvent, bool)]) -> Result<()> {
        let result = self.f.q.ack(batch);
        self.f.counters.left(Exit::Delivered, batch.len() as u64);
        for (e, _) in batch {
            *self.delivered.entry(e.id.to_string()).or_default() += 1;
        }
        result
    }

    fn run(&mut self, op: Op) {
        let q = &self.f.q;
        match op {
            Op::Spill => {
                let events = self.events(300, 250);
                self.f.track(events);
                let _ = self.f.q.spill_now();
            }
            Op::Persist => {
                // With a batch in flight, which persist() copies as leased rows.
                let batch = q.next_batch(4, u64::MAX);
                let events = self.events(200, 250);
                self.f.track(events);
                let _ = self.f.q.persist();
                self.f.q.release(&batch);
            }
            Op::TrackBatch => {
                let room = q.memory().room(10);
                let events = self.events(room as u64 + 100, 250);
                let tracked = self.f.counters.snapshot().tracked;
                match self.f.q.push_batch_spilling(events) {
                    Ok(_) => {}
                    Err(Error::BatchRefused(_)) => {
                        assert_eq!(
                            self.f.counters.snapshot().tracked,
                            tracked,
                            "a refused batch was counted"
                        );
                    }
                    Err(e) => panic!("track_batch failed otherwise: {e}"),
                }
            }
            Op::DurablePush => {
                let events = self.events(40, 250);
                self.f.counters.entered(Entry::Tracked, 40);
                let _ = self.f.q.push_durably(events, None);
            }
            Op::Ack => {
                let batch = q.next_batch(30, u64::MAX);
                let _ = self.deliver(&batch);
            }
            Op::Expire => {
                // Everything tracked so far is a day old by then.
                let gone = q.expire(NOW_MS + 86_400_000);
                let _ = gone;
            }
            Op::DropExpired => {
                let batch = q.next_batch(30, u64::MAX);
                let _ = q.drop_expired(&batch);
            }
            Op::Quarantine => {
                let batch = q.next_batch(30, u64::MAX);
                let entries = batch
                    .iter()
                    .map(|(e, _)| {
                        QuarantinedEvent::new(e, "rejected", "no".into(), Some(200), 1, 0)
                    })
                    .collect();
                // As the worker does: on a refusal the events stay queued.
                if q.quarantine(entries, &batch, NOW_MS).is_ok() {
                    let _ = q.ack(&batch);
                    self.f.counters.left(Exit::Quarantined, batch.len() as u64);
                } else {
                    q.release(&batch);
                }
            }
            Op::Redrive => {
                let mut next = 1_000_000 + self.seq;
                let n = q.redrive(&Selector::All, NOW_MS, || {
                    next += 1;
                    next
                });
                if let Ok(n) = n {
                    let _ = n;
                }
                self.seq = next;
            }
            Op::Purge => {
                let _ = q.purge();
            }
            Op::NoteSends => {
                let batch = q.next_batch(30, u64::MAX);
                let _ = q.note_sends(&batch, SendNote::Sending);
                q.release(&batch);
            }
        }
    }

    /// Space returns: everything is written, then delivered; each id once, the ledger exact.
    fn drain(&mut self) -> std::result::Result<(), String> {
        self.f.faults.disarm();
        for _ in 0..10_000 {
            let batch = self.f.q.next_batch(2_000, u64::MAX);
            if batch.is_empty() {
                break;
            }
            self.deliver(&batch).map_err(|e| format!("ack: {e}"))?;
        }
        self.f.check()?;
        let st = self.f.counters.snapshot();
        if st.pending != 0 {
            return Err(format!(
                "{} events left pending after the drain",
                st.pending
            ));
        }
        if let Some((id, n)) = self.delivered.iter().find(|(_, n)| **n > 1) {
            return Err(format!("{id} was delivered {n} times"));
        }
        Ok(())
    }
}

fn arm(f: &Faulty, fault: Fault, error: FaultError) {
    match fault {
        Fault::Commit(n) => f.faults.fail_nth(FaultSite::Commit, n, error),
        Fault::FirstWrite => f.faults.fail_nth(FaultSite::Write, 1, error),
        Fault::CheckpointAfter => f.faults.fail_next(FaultSite::Checkpoint, 1_000, error),
        Fault::DiskStaysFull => f.faults.fill_disk(error),
    }
}

fn every_operation_at_every_fault_position(durability: Durability) {
    let mut cases = 0;
    let mut faults_fired = 0;
    let mut took: HashMap<String, std::time::Duration> = HashMap::new();
    {
        // `track_batch` with `always` is a durable push (`Op::DurablePush`).
        let ops = OPS
            .into_iter()
            .filter(|op| durability == Durability::Spill || !matches!(op, Op::TrackBatch));
        for op in ops {
            for fault in FAULTS {
                for error in [FaultError::Full, FaultError::IoErr] {
                    let started = std::time::Instant::now();
                    let dir = tempfile::tempdir().unwrap();
                    let mut case = Case::new(dir.path(), durability);
                    let before: u64 = [FaultSite::Write, FaultSite::Commit, FaultSite::Checkpoint]
                        .iter()
                        .map(|s| case.f.faults.injected(*s))
                        .sum();
                    arm(&case.f, fault, error);
                    case.run(op);
                    let after: u64 = [FaultSite::Write, FaultSite::Commit, FaultSite::Checkpoint]
                        .iter()
                        .map(|s| case.f.faults.injected(*s))
                        .sum();
                    faults_fired += u64::from(after > before);
                    let what = format!("{durability:?} {op:?} with {fault:?} ({error:?})");
                    case.f
                        .check()
                        .unwrap_or_else(|e| panic!("{what}, after the operation: {e}"));
                    case.drain()
                        .unwrap_or_else(|e| panic!("{what}, once space returned: {e}"));
                    cases += 1;
                    *took.entry(format!("{op:?}")).or_default() += started.elapsed();
                }
            }
        }
    }
    eprintln!(
        "{durability:?}: {cases} cases, a fault fired in {faults_fired}; time by operation: {took:?}"
    );
    assert!(
        faults_fired * 2 > cases,
        "most cases must actually fail a write ({faults_fired} of {cases})"
    );
}

#[test]
fn with_durability_spill_every_store_operation_at_every_fault_position_keeps_the_ledger_exact() {
    every_operation_at_every_fault_position(Durability::Spill);
}

#[test]
fn with_durability_always_every_store_operation_at_every_fault_position_keeps_the_ledger_exact() {
    every_operation_at_every_fault_position(Durability::Always);
}
