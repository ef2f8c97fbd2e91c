//! Fault points for the crate's own tests (feature `test-util`, never in an app's build): the
//! moments of README §Consent that a test cannot otherwise reach on purpose, between the denial
//! being recorded and the kept events being deleted, and a deletion that fails. Also the crate's
//! own figures that the simulation's collector models, so it never writes them a second time.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

type Hook = Box<dyn Fn() + Send + Sync>;

static BETWEEN_RECORD_AND_DELETE: Mutex<Option<Hook>> = Mutex::new(None);
static FAILING_DELETES: Mutex<Vec<(PathBuf, u32)>> = Mutex::new(Vec::new());
type SharedHook = std::sync::Arc<dyn Fn() + Send + Sync>;
static BEFORE_WORKER_DISCARD: Mutex<Vec<(PathBuf, SharedHook)>> = Mutex::new(Vec::new());

/// The smallest body size a 413 may teach (src/split.rs), for the simulation's proxy that
/// refuses small bodies: a 413 for a body under it is no size limit.
pub const MIN_LEARNED_BYTES: u64 = crate::split::MIN_LEARNED_BYTES;

fn lock<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `hook` in every `set_consent(Denied)` of this process after the denial is recorded in
/// the store and before the kept events are deleted: a crash test's child blocks there and is
/// killed.
pub fn between_denial_record_and_delete(hook: impl Fn() + Send + Sync + 'static) {
    *lock(&BETWEEN_RECORD_AND_DELETE) = Some(Box::new(hook));
}

/// The next `times` deletions of a denial (README §Consent) on the store at `db` fail with a
/// storage error, before anything is deleted.
pub fn fail_consent_deletes(db: &Path, times: u32) {
    let mut failing = lock(&FAILING_DELETES);
    failing.retain(|(path, _)| path != db);
    failing.push((db.to_path_buf(), times));
}

/// Runs `hook` on the delivery worker of the store at `db` each time it is about to carry out a
/// denial's deletion it decided on (README §Consent): a test holds it there while the app's
/// verbs move on.
pub fn before_worker_discard(db: &Path, hook: impl Fn() + Send + Sync + 'static) {
    let mut hooks = lock(&BEFORE_WORKER_DISCARD);
    hooks.retain(|(path, _)| path != db);
    hooks.push((db.to_path_buf(), std::sync::Arc::new(hook)));
}

pub(crate) fn worker_discard_due(db: Option<&Path>) {
    let hook = db.and_then(|db| {
        lock(&BEFORE_WORKER_DISCARD)
            .iter()
            .find(|(path, _)| path == db)
            .map(|(_, hook)| hook.clone())
    });
    // Run without the lock: the hook may wait for the test's other thread.
    if let Some(hook) = hook {
        hook();
    }
}

pub(crate) fn denial_recorded() {
    if let Some(hook) = lock(&BETWEEN_RECORD_AND_DELETE).as_ref() {
        hook();
    }
}

/// Whether this deletion on the store at `db` is one a test asked to fail.
pub(crate) fn consent_delete_fails(db: &Path) -> bool {
    let mut failing = lock(&FAILING_DELETES);
    match failing
        .iter_mut()
        .find(|(path, left)| path == db && *left > 0)
    {
        Some((_, left)) => {
            *left -= 1;
            true
        }
        None => false,
    }
}

/// The threads of a spool opened with [`crate::SpoolBuilder::open_stepped`], run by hand: the
/// delivery worker is a future this polls on the caller's thread, the spill a call. A
/// simulation owns the clock (every sleep of the worker is on the spool's [`crate::Clock`]), so
/// with a seeded jitter the same calls in the same order give the same run.
pub struct Stepper {
    shared: std::sync::Arc<crate::shared::Shared>,
    worker: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    woken: std::sync::Arc<WakeFlag>,
    done: Option<std::sync::mpsc::Sender<()>>,
    /// Entered while the worker is polled: its safety-net timer around a send is a tokio timer,
    /// which needs a runtime to register with. The runtime is never driven, so that timer never
    /// fires; the transport's own timeout (simulated) is what ends an attempt.
    runtime: tokio::runtime::Runtime,
}

/// Set by the worker's waker: the worker has something to look at.
struct WakeFlag(std::sync::atomic::AtomicBool);

impl std::task::Wake for WakeFlag {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Stepper {
    pub(crate) fn new(
        shared: std::sync::Arc<crate::shared::Shared>,
        done: std::sync::mpsc::Sender<()>,
    ) -> crate::Result<Stepper> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|source| crate::Error::Runtime {
                what: "the stepped worker's timers",
                source,
            })?;
        shared
            .take_point
            .record
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(Stepper {
            worker: Some(Box::pin(crate::worker::run(shared.clone()))),
            shared,
            woken: std::sync::Arc::new(WakeFlag(std::sync::atomic::AtomicBool::new(true))),
            done: Some(done),
            runtime,
        })
    }

    /// Whether something woke the worker since it was last polled (its clock, the app, its
    /// transport): polling it then makes progress.
    pub fn woken(&self) -> bool {
        self.worker.is_some() && self.woken.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the worker has not ended yet.
    pub fn running(&self) -> bool {
        self.worker.is_some()
    }

    /// Polls the worker once if it was woken; `true` if it was polled. Runs until the worker
    /// waits on something (its clock, the app, an answer); a panic in it reaches the caller.
    pub fn poll_worker(&mut self) -> bool {
        use std::sync::atomic::Ordering;
        let Some(worker) = self.worker.as_mut() else {
            return false;
        };
        if !self.woken.0.swap(false, Ordering::SeqCst) {
            return false;
        }
        let waker = std::task::Waker::from(self.woken.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let finished = {
            let _enter = self.runtime.enter();
            worker.as_mut().poll(&mut cx).is_ready()
        };
        if finished {
            self.worker = None;
            if let Some(done) = self.done.take() {
                let _ = done.send(());
            }
        }
        true
    }

    /// One turn of the spill thread: `None` when no spill was asked for, else its result. A
    /// refusal's notices are delivered to the observers, as the thread does.
    pub fn spill(&self) -> Option<crate::Result<()>> {
        let result = self.shared.queue.spill_turn()?;
        self.shared.deliver_notices();
        Some(result)
    }

    /// The ids of each batch the worker took since the last call, in the order it took them
    /// (a batch is taken once and may be sent several times, split, or given back).
    pub fn taken(&self) -> Vec<Vec<crate::EventId>> {
        std::mem::take(&mut *crate::sync::lock(&self.shared.take_point.taken))
    }

    /// Whether the worker stops right after it takes its next batch, before it looks at consent
    /// and starts the request: the poll that took it returns there, so the caller can act (deny,
    /// crash, track) in the moment the worker's own threads rarely leave open.
    pub fn pause_after_next_take(&self, pause: bool) {
        use std::sync::atomic::Ordering;
        self.shared.take_point.pause.store(pause, Ordering::SeqCst);
    }

    /// Whether the last poll stopped right after a take ([`Stepper::pause_after_next_take`]);
    /// reading it clears it. The next poll goes on to the send.
    pub fn paused_at_take(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.shared.take_point.paused.swap(false, Ordering::SeqCst)
    }

    /// The store's queued rows of the normal lane as (skipping the ordering index, in it);
    /// `None` without a store. Every row written in delivery order after the older ones left
    /// should skip it (src/queue/store/frontier.rs).
    pub fn normal_rows_by_order(&self) -> Option<crate::Result<(u64, u64)>> {
        self.shared.queue.normal_rows_by_order()
    }

    /// How long after a refused spill the spill thread would try again
    /// ([`crate::queue::Queue::spill_retry_delay`]).
    pub fn spill_retry_ms(&self) -> u64 {
        self.shared.queue.spill_retry_delay().as_millis() as u64
    }

    /// What `shutdown()` tells the worker: stop at the next step, abandoning an attempt in
    /// flight. Poll the worker until it ends ([`Stepper::running`]), then call `shutdown()`.
    pub fn request_stop(&self) {
        self.shared.control(|c| c.shutdown = true);
        self.shared.shutdown.send_replace(true);
    }
}
