//! The worker's moment between taking a batch and sending it, as a stepped spool shows it to a
//! simulation (feature `test-util`; see [`crate::testing::Stepper`]). Its own module because the
//! shared state holds it and the stepper reads the shared state.

use std::sync::Mutex;

/// The worker's moment between taking a batch and sending it, for a [`crate::testing::Stepper`]: the batches it
/// took, and a pause there when asked.
#[derive(Default)]
pub struct TakePoint {
    pub(crate) taken: Mutex<Vec<Vec<crate::EventId>>>,
    /// Only a stepped spool notes its batches: a spool on its own threads would keep every id.
    pub(crate) record: std::sync::atomic::AtomicBool,
    pub(crate) pause: std::sync::atomic::AtomicBool,
    pub(crate) paused: std::sync::atomic::AtomicBool,
}

impl TakePoint {
    /// Called by the worker after every take: notes the batch, and returns `Pending` once (its
    /// waker woken at once) when a pause was asked for, so a stepped worker's poll ends here.
    pub(crate) async fn taken(&self, events: Option<&[(crate::event::QueuedEvent, bool)]>) {
        use std::sync::atomic::Ordering;
        let Some(events) = events.filter(|e| !e.is_empty()) else {
            return;
        };
        if self.record.load(Ordering::Relaxed) {
            crate::sync::lock(&self.taken).push(events.iter().map(|(e, _)| e.id).collect());
        }
        if self.pause.swap(false, Ordering::SeqCst) {
            self.paused.store(true, Ordering::SeqCst);
            let mut yielded = false;
            std::future::poll_fn(|cx| {
                if yielded {
                    return std::task::Poll::Ready(());
                }
                yielded = true;
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            })
            .await;
        }
    }
}
