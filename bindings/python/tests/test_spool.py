"""The Python bindings against the real library and a real collector process."""

import gc
import json
import threading
import time
import weakref

import pytest

import eventspool
from eventspool import DeliveryState, EventSpool, SpoolError
from conftest import wait_until
from transports import FlakyTransport, HttpClientTransport, Recorder, RejectingTransport, ThrowingObserver


def track_many(spool, n, name="screen_view"):
    return [spool.track(name, json.dumps({"screen": f"s-{i % 7}", "i": i})) for i in range(n)]


def test_tracked_offline_then_drained(collector, fast_config):
    spool = EventSpool(fast_config(collector.url, memory_capacity=20), start_offline=True)
    ids = track_many(spool, 150)
    assert len(set(ids)) == 150
    status = spool.state()
    assert isinstance(status.state, DeliveryState.OFFLINE)
    assert status.pending == 150
    # The spill thread writes what is past memory_capacity on its own time (it gathers a few
    # events before a commit), so the store is looked at until it has them.
    assert wait_until(lambda: spool.stats().pending_disk > 0), "memory_capacity 20 must spill to the store"

    spool.set_online(True)
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 150
    stats = spool.stats()
    assert (stats.delivered, stats.pending) == (150, 0)
    spool.shutdown(5_000)


def test_outage_countdown_waiting_for_user_then_retry_now(collector, fast_config):
    recorder = Recorder()
    spool = EventSpool(fast_config(collector.url), observer=recorder)
    track_many(spool, 10)
    spool.flush()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 10

    collector.stop()  # outage: the port now refuses connections
    track_many(spool, 25)
    spool.flush()
    assert wait_until(lambda: isinstance(spool.state().state, DeliveryState.WAITING_FOR_USER))

    scheduled = [s for s in recorder.states() if isinstance(s, DeliveryState.RETRY_SCHEDULED)]
    # Each attempt is announced, possibly more than once as its countdown ticks.
    assert sorted(set(s.attempt for s in scheduled)) == [1, 2, 3]
    assert [s.attempt for s in scheduled] == sorted(s.attempt for s in scheduled)
    for attempt in (1, 2, 3):
        ticks = [s.retry_in_ms for s in scheduled if s.attempt == attempt]
        assert ticks == sorted(ticks, reverse=True), "the countdown only goes down"
    assert all(s.max_attempts == 3 for s in scheduled)
    # Full jitter may draw a delay under a millisecond: an announced retry can say 0 ms.
    assert all(0 <= s.retry_in_ms <= 200 for s in scheduled), (
        "a countdown within backoff_cap_ms",
        [s.retry_in_ms for s in scheduled],
    )
    assert scheduled[0].last_error.status is None and scheduled[0].last_error.message
    waiting = spool.state()
    assert waiting.state.attempts == 3 and waiting.pending == 25
    assert "waiting for retry" in waiting.summary

    collector.start()  # recovery: same port, same database
    spool.retry_now()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 35
    stats = spool.stats()
    assert stats.delivered == 35 and stats.tracked == 35 and stats.pending == 0
    spool.shutdown(5_000)


def test_app_http_transport_delivers_everything(collector, fast_config):
    transport = HttpClientTransport()
    spool = EventSpool(fast_config(collector.url, max_batch_events=40), transport=transport)
    track_many(spool, 300)
    spool.flush()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 300
    assert transport.calls >= 300 // 40
    assert spool.stats().requests == transport.calls
    spool.shutdown(5_000)


def test_app_http_transport_outage_maps_to_retry(collector, fast_config):
    spool = EventSpool(fast_config(collector.url), transport=HttpClientTransport())
    collector.stop()
    track_many(spool, 5)
    spool.flush()
    assert wait_until(lambda: isinstance(spool.state().state, DeliveryState.WAITING_FOR_USER))
    assert "connect" in spool.state().state.last_error.message.lower()
    collector.start()
    spool.retry_now()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 5
    spool.shutdown(5_000)


def test_bad_input_raises_typed_errors(collector, fast_config):
    spool = EventSpool(fast_config(collector.url))
    with pytest.raises(SpoolError.InvalidEvent) as e:
        spool.track("click", "{not json")
    assert "properties_json" in str(e.value)
    with pytest.raises(SpoolError.InvalidEvent):
        spool.track("click", "[1, 2]")
    with pytest.raises(SpoolError.InvalidEvent):
        spool.track("", "{}")
    with pytest.raises(SpoolError.InvalidEvent):
        spool.track_event(eventspool.NewEvent(name="click", timestamp="yesterday"))
    with pytest.raises(SpoolError.EventTooLarge) as e:
        spool.track("big", json.dumps({"blob": "x" * 40_000}))
    assert e.value.limit == 32 * 1024
    assert spool.stats().tracked == 0
    spool.shutdown(5_000)

    with pytest.raises(SpoolError.InvalidConfig) as e:
        EventSpool(fast_config(collector.url, flush_at=0))
    assert e.value.field == "flush_at"
    with pytest.raises(SpoolError.InvalidConfig) as e:
        EventSpool(fast_config("http://collector.example/v1/batch"))
    assert e.value.field == "endpoint"
    with pytest.raises(SpoolError.InvalidConfig) as e:
        EventSpool(fast_config(collector.url, compression="zip"))
    assert e.value.field == "compression"
    assert isinstance(e.value, Exception)


def test_full_event_keeps_the_callers_id(collector, fast_config):
    spool = EventSpool(fast_config(collector.url))
    given = "0193a5b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"
    event = eventspool.NewEvent(
        name="purchase", properties_json='{"sku": "A-1"}', event_id=given,
        timestamp="2026-11-29T11:58:00.001Z", session_id="s-1",
    )
    assert spool.track_event(event) == given
    spool.flush()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 1
    spool.shutdown(5_000)


def test_throwing_observer_and_transport_do_not_stop_delivery(collector, fast_config):
    observer = ThrowingObserver()
    transport = FlakyTransport(failures=2)
    spool = EventSpool(fast_config(collector.url), transport=transport, observer=observer)
    track_many(spool, 40)
    spool.flush()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 40
    stats = spool.stats()
    assert observer.calls > 0 and stats.callback_errors > 0
    assert transport.failures < 0, "the transport threw twice, then delivered"
    assert stats.delivered == 40
    spool.shutdown(5_000)


def test_shutdown_releases_the_store(collector, fast_config):
    spool = EventSpool(fast_config(collector.url), start_offline=True)
    track_many(spool, 12)
    spool.shutdown(5_000)
    with pytest.raises(SpoolError.ShutDown):
        spool.track("late", "{}")
    spool.shutdown(5_000)  # twice is fine

    again = EventSpool(fast_config(collector.url))  # the store's lock was released
    assert again.stats().restored == 12
    again.flush()
    assert again.wait_drained(20_000)
    assert collector.distinct() == 12
    again.shutdown(5_000)


def test_quarantine_list_redrive_purge(collector, fast_config):
    transport = RejectingTransport()
    spool = EventSpool(fast_config(collector.url), transport=transport)
    track_many(spool, 5)
    poison = [spool.track("poison", json.dumps({"n": i})) for i in range(3)]
    spool.flush()
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 5

    listed = spool.quarantine_list()
    assert sorted(q.event_id for q in listed) == sorted(poison)
    assert all(q.reason == "rejected" and "poison" in q.detail for q in listed)
    assert spool.quarantine_get(poison[0]).event_id == poison[0]
    assert spool.quarantine_get("00000000-0000-7000-8000-000000000000") is None
    assert spool.stats().quarantine == {"rejected": 3}

    transport.rejecting = False
    assert spool.quarantine_redrive(eventspool.QuarantineSelector.IDS(ids=poison[:2])) == 2
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 7
    assert spool.quarantine_purge(eventspool.QuarantineSelector.ALL()) == 1
    assert spool.quarantine_list() == []
    stats = spool.stats()
    assert stats.tracked + stats.redriven == stats.delivered + stats.quarantined + stats.pending
    spool.shutdown(5_000)


def test_opt_out_and_purge(collector, fast_config):
    spool = EventSpool(fast_config(collector.url), start_offline=True)
    track_many(spool, 4)
    spool.set_enabled(False)
    with pytest.raises(SpoolError.TrackingDisabled):
        spool.track("x", "{}")
    assert spool.purge_pending() == 4
    assert spool.stats().dropped["purged"] == 4
    assert spool.persist() == 0
    spool.set_api_key("k-1")
    with pytest.raises(SpoolError.InvalidConfig):
        spool.set_api_key("")
    spool.shutdown(5_000)


def test_nan_and_infinity_are_refused_by_name(collector, fast_config):
    from eventspool.batching import BatchingTracker

    spool = EventSpool(fast_config(collector.url), start_offline=True)
    # json.dumps writes NaN and Infinity by default; the SDK names them instead of "expected value".
    with pytest.raises(SpoolError.InvalidEvent) as e:
        spool.track("score", json.dumps({"ratio": float("nan")}))
    assert "NaN is not a JSON number" in str(e.value)
    with pytest.raises(SpoolError.InvalidEvent) as e:
        spool.track("score", json.dumps({"ratio": [1.0, float("-inf")]}))
    assert "-Infinity is not a JSON number" in str(e.value)
    with BatchingTracker(spool) as tracker:
        with pytest.raises(ValueError) as e:
            tracker.track("score", {"cart": {"total": float("inf")}})
        assert "property cart.total: Infinity is not a JSON number" in str(e.value)
        with pytest.raises(ValueError) as e:
            tracker.track("score", {"ratios": [0.5, float("nan")]})
        assert "property ratios[1]: NaN" in str(e.value)
        tracker.track("score", {"ratio": 0.5})
    assert tracker.errors() == []
    assert spool.stats().tracked == 1
    spool.shutdown(5_000)


def test_batching_tracker_hands_everything_over_in_order(collector, fast_config):
    from eventspool.batching import BatchingTracker

    spool = EventSpool(fast_config(collector.url), start_offline=True)
    with BatchingTracker(spool, max_events=64, max_delay_s=0.01) as tracker:
        for i in range(1000):
            tracker.track("batched", {"i": i})
        tracker.track("too big", {"pad": "x" * 100_000})  # refused by the SDK, reported, skipped
        with pytest.raises(TypeError):
            tracker.track("bad", [1, 2])
        with pytest.raises(ValueError):
            tracker.track("", {})
    errors = tracker.errors()
    assert len(errors) == 1 and "max_event_bytes" in errors[0][0]
    assert spool.stats().tracked == 1000
    spool.set_online(True)
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 1000
    spool.shutdown(5_000)


def test_batching_tracker_bounds_what_it_holds_in_a_tight_loop(collector, fast_config):
    from eventspool.batching import BatchingTracker

    spool = EventSpool(fast_config(collector.url), start_offline=True)

    class Counting:
        """The real spool, with the size of each call it receives noted."""

        def __init__(self, spool):
            self.spool = spool
            self.sizes = []

        def track_batch(self, lines):
            self.sizes.append(lines.count("\n") + 1)
            return self.spool.track_batch(lines)

    counting = Counting(spool)
    held = 0
    tracker = BatchingTracker(counting, max_events=512, max_delay_s=0.05)
    for i in range(30_000):
        tracker.track("tight", {"i": i})
        held = max(held, len(tracker._waiting))
    tracker.close()
    assert held <= 4 * 512, f"the tracker held {held} events"
    assert max(counting.sizes) <= 512, f"one call carried {max(counting.sizes)} events"
    stats = spool.stats()
    assert stats.tracked == 30_000
    assert stats.dropped["memory_overflow"] == 0
    spool.shutdown(5_000)


class _SlowStore:
    """The real spool behind a store that takes 20 ms per call (a slow disk). At the start of
    each call it notes how many events were outside the spool (their `track()` returned, the
    spool has not recorded them yet), and it notes the order in which the spool took them."""

    def __init__(self, spool):
        self.spool = spool
        self.lock = threading.Lock()
        self.returned = 0  # track() calls that returned, set by the tracking thread
        self.recorded = 0
        self.most_outside = 0
        self.order = []

    def track_batch(self, lines):
        with self.lock:
            self.most_outside = max(self.most_outside, self.returned - self.recorded)
        time.sleep(0.02)
        with self.lock:
            recorded = self.spool.track_batch(lines)
            self.recorded += recorded
            self.order.extend(json.loads(line)["properties"]["i"] for line in lines.split("\n"))
        return recorded


def test_batching_tracker_bounds_every_event_outside_the_spool_and_keeps_order(collector, fast_config):
    """What a hard kill can lose is what the tracker holds: waiting, or inside a hand-over that
    has not returned. With a slow store, the tracking thread meets a hand-over in progress;
    `max_held` still bounds the sum, and the spool takes the events in track() order."""
    from eventspool.batching import BatchingTracker

    spool = EventSpool(fast_config(collector.url), start_offline=True)
    slow = _SlowStore(spool)
    tracker = BatchingTracker(slow, max_events=64, max_delay_s=0.005, max_held=256)
    for i in range(3000):
        tracker.track("slow_store", {"i": i})
        slow.returned = i + 1
    tracker.close()
    assert slow.most_outside <= 256, f"{slow.most_outside} events were outside the spool at once"
    assert slow.most_outside > 64, "the store was never slow enough to meet back-pressure"
    assert tracker.held() == 0
    assert slow.order == list(range(3000)), "the spool took the events out of order"
    assert spool.stats().tracked == 3000
    spool.shutdown(5_000)


def _told_pending(recorder, pending):
    with recorder.lock:
        return any(s.pending == pending for s in recorder.statuses)


def test_removed_observer_is_told_nothing_more_and_released(collector, fast_config):
    spool = EventSpool(fast_config(collector.url), start_offline=True)
    removed, dropped = Recorder(), Recorder()
    kept = Recorder()  # registered last: once it was told something, the two before it were too
    removed_handle = spool.add_observer(removed)
    dropped_handle = spool.add_observer(dropped)
    kept_handle = spool.add_observer(kept)
    spool.track("a", "{}")
    spool.dismiss()  # wakes the worker, which shows the new pending count
    assert wait_until(lambda: _told_pending(kept, 1))
    assert _told_pending(removed, 1) and _told_pending(dropped, 1)

    removed_handle.remove()
    del dropped_handle  # the last reference: the handle is freed and unregisters
    told = (len(removed.statuses), len(dropped.statuses))
    kept_before = len(kept.statuses)
    spool.track("b", "{}")
    spool.set_online(True)
    assert spool.wait_drained(20_000)
    assert wait_until(lambda: any(isinstance(s, DeliveryState.IDLE) for s in kept.states()[kept_before:]))
    assert len(kept.statuses) > kept_before
    assert (len(removed.statuses), len(dropped.statuses)) == told, "told after removal"

    # The spool let go of both: nothing but this test holds them any more.
    gone = [weakref.ref(removed), weakref.ref(dropped)]
    del removed, dropped
    gc.collect()
    assert [r() for r in gone] == [None, None]
    removed_handle.remove()  # twice is fine
    kept_handle.remove()
    spool.shutdown(5_000)
    assert collector.distinct() == 2


def test_deliver_within_and_conditions(collector, fast_config):
    """The bounded drain and the delivery conditions through the generated bindings: deferred
    on a metered network (nothing sent, the drain says Blocked), drained once allowed."""
    from eventspool import DeferReason, DeliveryConditions, DrainOutcome

    spool = EventSpool(fast_config(collector.url, deliver_on_metered=False, flush_at=5))
    spool.set_conditions(DeliveryConditions(metered=True, low_power=False, battery_low=False))
    track_many(spool, 40)
    outcome = spool.deliver_within(2_000)
    assert isinstance(outcome, DrainOutcome.BLOCKED), outcome
    assert isinstance(outcome.status.state, DeliveryState.DEFERRED)
    assert outcome.status.state.reason == DeferReason.METERED
    assert outcome.status.pending == 40
    assert outcome.status.summary == "deferred (metered network), 40 pending"
    assert spool.stats().requests == 0
    assert collector.stats()["requests"] == 0

    spool.set_conditions(DeliveryConditions(metered=False, low_power=False, battery_low=False))
    outcome = spool.deliver_within(20_000)
    assert isinstance(outcome, DrainOutcome.DRAINED), outcome
    assert collector.distinct() == 40
    assert spool.stats().pending == 0

    spool.set_online(False)
    assert isinstance(spool.deliver_within(1_000), DrainOutcome.BLOCKED)
    spool.shutdown(5_000)
    with pytest.raises(SpoolError.ShutDown):
        spool.deliver_within(1_000)


def _files_with(directory, needle):
    hits = []
    for path in directory.iterdir():
        if path.is_file() and needle in path.read_bytes():
            hits.append(path.name)
    return hits


def test_consent_pending_survives_a_restart_then_granted_delivers(collector, fast_config):
    spool = EventSpool(fast_config(collector.url, consent="pending"))
    assert spool.consent() == eventspool.Consent.PENDING
    ids = track_many(spool, 30)
    spool.flush()
    assert wait_until(lambda: spool.state().pending == 30
                      and isinstance(spool.state().state, DeliveryState.DEFERRED))
    assert spool.state().state.reason == eventspool.DeferReason.CONSENT
    assert "deferred (consent)" in spool.state().summary
    spool.shutdown(5_000)
    assert collector.stats()["requests"] == 0, "nothing sent while pending"

    # The config says granted (the default); the store remembers pending.
    again = EventSpool(fast_config(collector.url))
    assert again.consent() == eventspool.Consent.PENDING
    assert again.stats().restored == 30
    again.set_consent(eventspool.Consent.GRANTED)
    assert again.wait_drained(20_000)
    assert collector.distinct() == 30
    assert again.stats().delivered == len(ids)
    again.shutdown(5_000)


def test_consent_denied_deletes_everything_and_refuses(collector, fast_config, tmp_path):
    spool = EventSpool(fast_config(collector.url, consent="pending", memory_capacity=5))
    mark = "py-consent-secret-5d1c"
    for i in range(40):
        spool.track("private", json.dumps({"secret": f"{mark}-{i}"}))
    spool.persist()
    assert _files_with(tmp_path, mark.encode()), "on disk before the denial"
    spool.set_consent(eventspool.Consent.DENIED)
    with pytest.raises(SpoolError.ConsentDenied):
        spool.track("after", "{}")
    stats = spool.stats()
    assert stats.dropped["consent_denied"] == 40 and stats.pending == 0
    assert wait_until(lambda: isinstance(spool.state().state, DeliveryState.DISABLED))
    spool.shutdown(5_000)
    assert _files_with(tmp_path, mark.encode()) == [], "nothing of the user's data left"
    assert collector.stats()["requests"] == 0
    again = EventSpool(fast_config(collector.url))
    assert again.consent() == eventspool.Consent.DENIED
    again.shutdown(5_000)


def test_critical_event_goes_before_the_backlog(collector, fast_config):
    spool = EventSpool(fast_config(collector.url, memory_capacity=50), start_offline=True)
    track_many(spool, 500)
    urgent = spool.track_event(eventspool.NewEvent(
        name="crash", properties_json="{}", priority=eventspool.Priority.CRITICAL))
    spool.set_online(True)
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 501
    stats = spool.stats()
    assert stats.delivered == 501
    spool.shutdown(5_000)
    assert urgent


def test_encryption_key_seals_the_store_and_a_wrong_key_is_refused_by_id(collector, fast_config, tmp_path):
    # Bytes the app would take from the iOS Keychain or the Android Keystore.
    key = bytes(range(32))
    keys = [eventspool.EncryptionKey(key_id=1, key=key)]
    spool = EventSpool(fast_config(collector.url, encryption_keys=keys), start_offline=True)
    for i in range(20):
        spool.track("checkout", json.dumps({"email": f"py-secret-{i:02}"}))
    spool.shutdown(5_000)
    store_files = [f for f in tmp_path.iterdir() if f.is_file() and f.name.startswith("events.db")]
    assert store_files, "the store wrote its files"
    for f in store_files:
        assert b"py-secret-" not in f.read_bytes(), f"plain text in {f.name}"

    wrong = [eventspool.EncryptionKey(key_id=1, key=bytes(32))]
    with pytest.raises(SpoolError.EncryptionKey) as refused:
        EventSpool(fast_config(collector.url, encryption_keys=wrong))
    assert refused.value.key_id == 1
    with pytest.raises(SpoolError.EncryptionKey) as missing:
        EventSpool(fast_config(collector.url))
    assert missing.value.key_id == 1
    with pytest.raises(SpoolError.InvalidConfig) as short:
        EventSpool(fast_config(collector.url, encryption_keys=[eventspool.EncryptionKey(key_id=1, key=b"short")]))
    assert short.value.field == "encryption_keys"

    spool = EventSpool(fast_config(collector.url, encryption_keys=keys))
    assert spool.wait_drained(20_000)
    assert collector.distinct() == 20
    spool.shutdown(5_000)
