//! The simulated network between one device and the collector: the spool's [`Transport`]. A
//! request handed to it waits in the [`Link`] until the world decides its fate (the collector
//! answers, the answer is lost, the connection is refused or times out) and delivers that at a
//! simulated time. The link also checks, at the moment a request starts, the promise of README
//! §Consent: after the app said no, no request leaves.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use eventspool::{HttpRequest, HttpResponse, Transport, TransportError};

type Answer = Result<HttpResponse, TransportError>;

/// What the world shares with a device's transport.
#[derive(Default)]
pub struct Link {
    /// A request the transport was handed and the world has not looked at yet.
    pub outgoing: Option<(HttpRequest, Arc<Mutex<Slot>>)>,
    /// Set while the app's last word was `set_consent(Denied)` or `set_enabled(false)`.
    pub said_no: bool,
    /// Requests that started while `said_no` held (an oracle's finding).
    pub started_after_no: u64,
    /// Requests handed to the transport so far.
    pub started: u64,
}

/// Where an answer waits for the request's future.
#[derive(Default)]
pub struct Slot {
    answer: Option<Answer>,
    waker: Option<Waker>,
    /// The worker dropped the future (shutdown abandoned it).
    pub gone: bool,
}

impl Slot {
    pub fn answer(slot: &Arc<Mutex<Slot>>, answer: Answer) {
        let waker = {
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            s.answer = Some(answer);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

pub struct SimTransport {
    pub link: Arc<Mutex<Link>>,
}

impl Transport for SimTransport {
    fn send(
        &self,
        request: HttpRequest,
    ) -> futures_boxed::BoxFuture<'static, Result<HttpResponse, TransportError>> {
        let slot = Arc::new(Mutex::new(Slot::default()));
        {
            let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
            link.started += 1;
            if link.said_no {
                link.started_after_no += 1;
            }
            link.outgoing = Some((request, slot.clone()));
        }
        Box::pin(Pending { slot })
    }
}

/// The boxed future type of [`Transport::send`], spelt out without a dependency.
mod futures_boxed {
    pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
}

struct Pending {
    slot: Arc<Mutex<Slot>>,
}

impl Future for Pending {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut s = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match s.answer.take() {
            Some(a) => Poll::Ready(a),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).gone = true;
    }
}
