//! `GET /metrics`: the collector's counters in the Prometheus text format, kept and encoded by
//! `prometheus-client`.
//!
//! What an operator alerts on: answers by status (503s and 429s are load being shed), events
//! by outcome, how long the store or broker takes per batch, what is in flight against its
//! bounds, and whether the broker is there and the process ready.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Label = [(&'static str, String); 1];

pub(super) struct Metrics {
    registry: Registry,
    requests: Family<Label, Counter>,
    events: Family<Label, Counter>,
    shed: Family<Label, Counter>,
    store_seconds: Histogram,
    requests_in_flight: Gauge,
    events_in_flight: Gauge,
    bytes_in_flight: Gauge,
    broker_connected: Gauge,
    ready: Gauge,
}

impl Metrics {
    pub(super) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("eventspool_collector");
        let requests = Family::<Label, Counter>::default();
        registry.register(
            "requests",
            "Batch requests answered, by HTTP status (none: closed without an answer)",
            requests.clone(),
        );
        let events = Family::<Label, Counter>::default();
        registry.register(
            "events",
            "Events of answered batches by outcome: accepted (stored now), duplicate (stored \
             before), rejected (listed in the answer, not stored)",
            events.clone(),
        );
        let shed = Family::<Label, Counter>::default();
        registry.register(
            "shed",
            "Requests refused with 503/413/408 before storing, by bound: connections, \
             requests, bytes, events, batch_size, body_timeout, draining",
            shed.clone(),
        );
        // 1 ms .. ~16 s: a healthy broker acks a batch in milliseconds, a sick one in seconds.
        let store_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "store_seconds",
            "Time to store one batch (JetStream: publish until the last ack)",
            store_seconds.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let requests_in_flight = gauge(
            &mut registry,
            "requests_in_flight",
            "Batch requests being read or handled now",
        );
        let events_in_flight = gauge(
            &mut registry,
            "events_in_flight",
            "Events published and not yet acknowledged by the broker",
        );
        let bytes_in_flight = gauge(
            &mut registry,
            "bytes_in_flight",
            "Bytes of request bodies held now",
        );
        let broker_connected = gauge(
            &mut registry,
            "broker_connected",
            "1 while the broker connection is up (always 1 without a broker)",
        );
        let ready = gauge(&mut registry, "ready", "1 while GET /readyz answers 200");
        Metrics {
            registry,
            requests,
            events,
            shed,
            store_seconds,
            requests_in_flight,
            events_in_flight,
            bytes_in_flight,
            broker_connected,
            ready,
        }
    }

    pub(super) fn answered(&self, status: Option<u16>) {
        let status = status.map_or_else(|| "none".to_owned(), |s| s.to_string());
        self.requests.get_or_create(&[("status", status)]).inc();
    }

    pub(super) fn events(&self, accepted: u64, duplicates: u64, rejected: u64) {
        for (outcome, n) in [
            ("accepted", accepted),
            ("duplicate", duplicates),
            ("rejected", rejected),
        ] {
            if n > 0 {
                self.events
                    .get_or_create(&[("outcome", outcome.to_owned())])
                    .inc_by(n);
            }
        }
    }

    pub(super) fn shed(&self, bound: &str) {
        self.shed
            .get_or_create(&[("bound", bound.to_owned())])
            .inc();
    }

    pub(super) fn stored_in(&self, elapsed: std::time::Duration) {
        self.store_seconds.observe(elapsed.as_secs_f64());
    }

    /// The text exposition, with the gauges set to `now` first.
    pub(super) fn render(&self, now: &Gauges) -> String {
        let set = |g: &Gauge, v: usize| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set(&self.requests_in_flight, now.requests_in_flight);
        set(&self.events_in_flight, now.events_in_flight);
        set(&self.bytes_in_flight, now.bytes_in_flight);
        set(&self.broker_connected, usize::from(now.broker_connected));
        set(&self.ready, usize::from(now.ready));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// What the gauges show at a scrape.
pub(super) struct Gauges {
    pub requests_in_flight: usize,
    pub events_in_flight: usize,
    pub bytes_in_flight: usize,
    pub broker_connected: bool,
    pub ready: bool,
}
