//! Time, injected. Retry timers and throttling run on a monotonic clock (a wall-clock jump never
//! makes a retry fire early or wait for hours); event timestamps and age limits use the wall
//! clock. Tests swap in `ManualClock` (feature `test-util`) so no test sleeps through a real
//! backoff.

use std::future::Future;
use std::pin::Pin;
#[cfg(feature = "test-util")]
use std::sync::Mutex;
#[cfg(feature = "test-util")]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[cfg(feature = "test-util")]
use tokio::sync::Notify;

pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

pub trait Clock: Send + Sync + 'static {
    /// Monotonic milliseconds since an arbitrary origin.
    fn now_ms(&self) -> u64;
    /// Wall clock, milliseconds since the Unix epoch.
    fn wall_ms(&self) -> i64;
    /// Completes once `now_ms() >= deadline_ms`.
    fn sleep_until(&self, deadline_ms: u64) -> Sleep;
}

/// The real clocks: `Instant` for timers, `SystemTime` for timestamps.
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn wall_ms(&self) -> i64 {
        // Seconds and milliseconds apart: `as_millis` divides a u128, on every `track()`.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64 * 1_000 + i64::from(d.subsec_millis()))
            .unwrap_or(0)
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let deadline =
            tokio::time::Instant::from_std(self.origin + Duration::from_millis(deadline_ms));
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

#[cfg(feature = "test-util")]
/// A clock that moves only when told to. In `auto_advance` mode a sleep jumps the clock straight
/// to its deadline (drain tests: throttles and backoffs are honoured in virtual time, cost none
/// in real time); otherwise a test calls [`ManualClock::advance`] and sees every tick.
/// Behind the `test-util` feature: an app never wants a clock it must move itself.
pub struct ManualClock {
    inner: Mutex<ManualState>,
    changed: Notify,
    sleepers: AtomicUsize,
    parks: AtomicUsize,
}

#[cfg(feature = "test-util")]
struct ManualState {
    now_ms: u64,
    wall_offset_ms: i64,
    auto_advance: bool,
}

#[cfg(feature = "test-util")]
impl ManualClock {
    /// Starts at monotonic 0 and the given wall time.
    pub fn new(wall_start_ms: i64) -> ManualClock {
        ManualClock {
            inner: Mutex::new(ManualState {
                now_ms: 0,
                wall_offset_ms: wall_start_ms,
                auto_advance: false,
            }),
            changed: Notify::new(),
            sleepers: AtomicUsize::new(0),
            parks: AtomicUsize::new(0),
        }
    }

    /// A manual clock whose sleeps complete at once, moving time to their deadline.
    pub fn auto_advancing(wall_start_ms: i64) -> ManualClock {
        let clock = ManualClock::new(wall_start_ms);
        clock.lock().auto_advance = true;
        clock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_auto_advance(&self, on: bool) {
        self.lock().auto_advance = on;
        self.changed.notify_waiters();
    }

    /// Moves both clocks forward and wakes every sleeper whose deadline has come.
    pub fn advance(&self, by: Duration) {
        self.lock().now_ms += by.as_millis() as u64;
        self.changed.notify_waiters();
    }

    /// Steps only the wall clock (a user changing the device time): monotonic timers must not care.
    pub fn jump_wall(&self, by_ms: i64) {
        self.lock().wall_offset_ms += by_ms;
        self.changed.notify_waiters();
    }

    /// How many sleeps are waiting right now; a test waits for the worker to park before advancing.
    pub fn sleepers(&self) -> usize {
        self.sleepers.load(Ordering::SeqCst)
    }

    /// How many times a sleeper has parked so far: a test that advances the clock waits for this
    /// to grow, so it knows the worker has reacted to the last step before taking the next.
    pub fn parks(&self) -> usize {
        self.parks.load(Ordering::SeqCst)
    }

    /// Advances, then waits (real time, bounded) until a sleeper parks again or `settled()`
    /// holds; returns false on timeout.
    pub fn step(&self, by: Duration, real_timeout: Duration, settled: impl Fn() -> bool) -> bool {
        let before = self.parks();
        self.advance(by);
        let start = Instant::now();
        while self.parks() == before && !settled() {
            if start.elapsed() > real_timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

#[cfg(feature = "test-util")]
impl Clock for std::sync::Arc<ManualClock> {
    fn now_ms(&self) -> u64 {
        self.lock().now_ms
    }

    fn wall_ms(&self) -> i64 {
        let s = self.lock();
        s.wall_offset_ms + s.now_ms as i64
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let clock = self.clone();
        Box::pin(async move {
            {
                let mut s = clock.lock();
                if s.auto_advance {
                    s.now_ms = s.now_ms.max(deadline_ms);
                    return;
                }
            }
            clock.sleepers.fetch_add(1, Ordering::SeqCst);
            let _parked = SleeperGuard(&clock.sleepers);
            let mut counted = false;
            loop {
                let notified = clock.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let mut s = clock.lock();
                    if s.now_ms >= deadline_ms {
                        return;
                    }
                    if s.auto_advance {
                        s.now_ms = deadline_ms;
                        return;
                    }
                }
                if !counted {
                    counted = true;
                    clock.parks.fetch_add(1, Ordering::SeqCst);
                }
                notified.await;
            }
        })
    }
}

#[cfg(feature = "test-util")]
struct SleeperGuard<'a>(&'a AtomicUsize);

#[cfg(feature = "test-util")]
impl Drop for SleeperGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
