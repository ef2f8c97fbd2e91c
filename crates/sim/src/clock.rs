//! One simulated clock for every device of a run and for the collector. Time moves only when the
//! world advances it, to the next thing that is due; a sleep of a spool's worker registers its
//! deadline here, so the world knows when the next timer fires and no real time passes.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use eventspool::{Clock, Sleep};

/// 2026-12-01T00:00:00Z: every device's wall clock starts here (plus its own skew).
pub const WALL_START_MS: i64 = 1_764_547_200_000;

#[derive(Default)]
pub struct SimClock {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    now_ms: u64,
    next_id: u64,
    /// Parked sleeps by (deadline, id).
    sleepers: BTreeMap<(u64, u64), Waker>,
}

impl SimClock {
    pub fn new() -> Arc<SimClock> {
        Arc::new(SimClock::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now_ms(&self) -> u64 {
        self.lock().now_ms
    }

    /// The earliest deadline a sleep waits for.
    pub fn next_deadline(&self) -> Option<u64> {
        self.lock().sleepers.keys().next().map(|(d, _)| *d)
    }

    /// Moves time to `t` (never back) and wakes every sleep that is due.
    pub fn advance_to(&self, t: u64) {
        let due: Vec<Waker> = {
            let mut s = self.lock();
            s.now_ms = s.now_ms.max(t);
            let after = s.now_ms + 1;
            let later = s.sleepers.split_off(&(after, 0));
            std::mem::replace(&mut s.sleepers, later)
                .into_values()
                .collect()
        };
        for waker in due {
            waker.wake();
        }
    }
}

/// A device's view of the simulated clock: the shared monotonic time, and a wall clock that
/// may be skewed (a user who set the device's time wrong).
pub struct DeviceClock {
    world: Arc<SimClock>,
    wall_skew_ms: AtomicI64,
}

impl DeviceClock {
    pub fn new(world: Arc<SimClock>) -> Arc<DeviceClock> {
        Arc::new(DeviceClock {
            world,
            wall_skew_ms: AtomicI64::new(0),
        })
    }

    pub fn skew_wall(&self, by_ms: i64) {
        self.wall_skew_ms.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for DeviceClock {
    fn now_ms(&self) -> u64 {
        self.world.now_ms()
    }

    fn wall_ms(&self) -> i64 {
        WALL_START_MS + self.world.now_ms() as i64 + self.wall_skew_ms.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        Box::pin(SimSleep {
            clock: self.world.clone(),
            deadline_ms,
            id: None,
        })
    }
}

struct SimSleep {
    clock: Arc<SimClock>,
    deadline_ms: u64,
    id: Option<u64>,
}

impl Future for SimSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline_ms;
        let mut s = self.clock.lock();
        if s.now_ms >= deadline {
            if let Some(id) = self.id {
                s.sleepers.remove(&(deadline, id));
            }
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                s.next_id += 1;
                s.next_id
            }
        };
        s.sleepers.insert((deadline, id), cx.waker().clone());
        drop(s);
        self.id = Some(id);
        Poll::Pending
    }
}

impl Drop for SimSleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.clock.lock().sleepers.remove(&(self.deadline_ms, id));
        }
    }
}
