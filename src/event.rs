//! Events as the app hands them in, and as they travel: validated once at `track()`, serialized
//! once into their wire form (docs/protocol.md §Event), and from then on moved around as that
//! string, so a batch is built by joining strings and a resend carries byte-identical events.

use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::error::{Error, Result};

pub const MAX_NAME_BYTES: usize = 256;
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// The identity of an event, made once at `track()` (UUID v7: time-ordered, so collectors index
/// it cheaply) and kept through retries, restarts and redrives so the collector can deduplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub Uuid);

impl EventId {
    pub fn new() -> EventId {
        EventId(Uuid::now_v7())
    }

    pub fn parse(text: &str) -> Result<EventId> {
        Uuid::try_parse(text).map(EventId).map_err(|_| {
            Error::InvalidEvent(format!("event_id '{}' is not a UUID", truncate(text, 64)))
        })
    }
}

impl Default for EventId {
    fn default() -> Self {
        EventId::new()
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Which lane an event travels in (docs/critical-lane.md). Critical events are durable before
/// `track()` returns, skip `flush_at` and the throttle, go before the normal backlog and are
/// evicted last at the disk cap; within each lane the order is the timestamp's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priority {
    #[default]
    Normal,
    /// A crash report, a purchase: must not wait behind a backlog.
    Critical,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::Critical => "critical",
        }
    }

    /// The priority named by [`Priority::as_str`]; the error names the value.
    pub fn parse(text: &str) -> Result<Priority> {
        match text {
            "normal" => Ok(Priority::Normal),
            "critical" => Ok(Priority::Critical),
            _ => Err(Error::InvalidEvent(format!(
                "priority '{}' is not one of: normal, critical",
                truncate(text, 32)
            ))),
        }
    }
}

/// The delivery order: lane (critical first), timestamp, then `track()` order.
pub type OrderKey = (u8, i64, u64);

/// The lane number stored with an event: critical events sort first.
pub const LANE_CRITICAL: u8 = 0;
pub const LANE_NORMAL: u8 = 1;

/// An event with every optional field the caller may set (idempotent producers pass their own
/// `event_id`; importers pass historical timestamps).
#[derive(Clone, Debug, Default)]
pub struct NewEvent {
    pub name: String,
    pub properties: Value,
    pub event_id: Option<String>,
    /// RFC 3339; any offset is accepted and normalized to UTC milliseconds.
    pub timestamp: Option<String>,
    pub session_id: Option<String>,
    /// Normal (default) or critical (docs/critical-lane.md).
    pub priority: Priority,
}

impl NewEvent {
    /// The same event in the critical lane.
    pub fn critical(mut self) -> NewEvent {
        self.priority = Priority::Critical;
        self
    }

    /// Validates the event as `track()` would and returns its wire JSON (docs/protocol.md
    /// §Events), recording nothing: what a tool checks a file of events with before sending any
    /// of it. `now_ms` (wall clock, Unix ms) is the timestamp when the event has none.
    pub fn to_wire_json(&self, now_ms: i64, max_event_bytes: u64) -> Result<String> {
        prepare(self.fields(), now_ms, 0, max_event_bytes).map(|q| q.json.into())
    }

    /// Its fields, borrowed, as [`prepare`] reads them.
    pub fn fields(&self) -> EventFields<'_> {
        EventFields {
            name: &self.name,
            properties: &self.properties,
            event_id: self.event_id.as_deref(),
            timestamp: self.timestamp.as_deref(),
            session_id: self.session_id.as_deref(),
            priority: self.priority,
        }
    }

    pub fn new(name: impl Into<String>, properties: Value) -> NewEvent {
        NewEvent {
            name: name.into(),
            properties,
            ..NewEvent::default()
        }
    }
}

/// What [`prepare`] reads of an event: [`NewEvent`]'s fields, borrowed, so that
/// `track(name, properties)` validates and renders an event without first copying its name
/// into a `NewEvent`.
#[derive(Clone, Copy, Debug)]
pub struct EventFields<'a> {
    pub name: &'a str,
    pub properties: &'a Value,
    pub event_id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub session_id: Option<&'a str>,
    pub priority: Priority,
}

impl<'a> EventFields<'a> {
    /// A name and properties, every other field left to the SDK.
    pub fn new(name: &'a str, properties: &'a Value) -> EventFields<'a> {
        EventFields {
            name,
            properties,
            event_id: None,
            timestamp: None,
            session_id: None,
            priority: Priority::Normal,
        }
    }
}

/// One event as a line of JSON, the input format of `eventspool send` and of batch tracking
/// through the bindings: `{"name", "properties"?, "timestamp"?, "event_id"?, "session_id"?,
/// "priority"?}`.
/// Unknown fields are refused, so a typo (`"propeties"`) is an error, not a silent loss.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLine {
    name: String,
    #[serde(default = "empty_object")]
    properties: Value,
    timestamp: Option<String>,
    event_id: Option<String>,
    session_id: Option<String>,
    /// `"normal"` (default) or `"critical"`.
    priority: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl NewEvent {
    /// Parses one JSON line (see [`JsonLine`]'s fields); the error says what is wrong.
    pub fn from_json_line(line: &str) -> Result<NewEvent> {
        let parsed: JsonLine =
            serde_json::from_str(line).map_err(|e| Error::InvalidEvent(e.to_string()))?;
        Ok(NewEvent {
            name: parsed.name,
            properties: parsed.properties,
            event_id: parsed.event_id,
            timestamp: parsed.timestamp,
            session_id: parsed.session_id,
            priority: match parsed.priority {
                Some(p) => Priority::parse(&p)?,
                None => Priority::Normal,
            },
        })
    }

    /// One line of a JSON Lines input (`eventspool send`, the FFI's `track_batch`): `None` for a
    /// blank line; the error names the line by its 1-based `number`.
    pub fn from_numbered_line(number: usize, line: &str) -> Result<Option<NewEvent>, String> {
        if line.trim().is_empty() {
            return Ok(None);
        }
        NewEvent::from_json_line(line)
            .map(Some)
            .map_err(|e| format!("line {number}: {e}"))
    }
}

/// An accepted event in its wire form, with the keys that order it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedEvent {
    /// Milliseconds since the Unix epoch, UTC: the primary delivery order.
    pub ts_ms: i64,
    /// Position in `track()` order: breaks timestamp ties.
    pub seq: u64,
    pub id: EventId,
    /// The event's JSON object exactly as it goes on the wire.
    pub json: Box<str>,
    /// Wall clock (ms since the epoch) when the SDK accepted it: its `track()` or its redrive.
    /// `max_event_age_ms` counts from here, never from `ts_ms`, which the caller may set to any
    /// past time (importers).
    pub accepted_ms: i64,
    /// Requests that carried this event so far; `X-Eventspool-Attempt` is derived from it.
    pub sends: u32,
    /// Of those, the ones that got no answer (timeout, connection dropped): the effect is
    /// unknown. Past `max_event_sends` the event is isolated and quarantined (`max_sends`).
    pub unanswered: u32,
    /// In the critical lane (docs/critical-lane.md): delivered before the normal backlog.
    pub critical: bool,
    /// The store's sealed body of this event, made on the tracking thread while memory is full
    /// (`Store::seal_ahead`), so that the spill thread only writes it; empty otherwise.
    pub sealed: SealedAhead,
}

/// A body sealed for the store before the event reached the spill (`Store::seal_ahead`).
/// The id, timestamp and lane it is bound to are the event's own, which never change once it is
/// made. It compares equal to any other: each sealing draws a new nonce, and the event is the
/// same event whether or not it carries one.
#[derive(Clone, Default)]
pub struct SealedAhead(pub(crate) Option<Box<[u8]>>);

impl SealedAhead {
    /// Bytes held (the spent-string bound of the spill counts them).
    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len())
    }
}

impl PartialEq for SealedAhead {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SealedAhead {}

impl std::fmt::Debug for SealedAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(b) => write!(f, "sealed({} bytes)", b.len()),
            None => f.write_str("none"),
        }
    }
}

impl QueuedEvent {
    /// The delivery order of docs/protocol.md §Request within a lane: timestamp, then `track()`
    /// order; the critical lane goes first.
    pub fn key(&self) -> OrderKey {
        (self.lane(), self.ts_ms, self.seq)
    }

    pub fn lane(&self) -> u8 {
        if self.critical {
            LANE_CRITICAL
        } else {
            LANE_NORMAL
        }
    }

    pub fn bytes(&self) -> u64 {
        self.json.len() as u64
    }

    /// The wire JSON after its head `{"event_id":"<id>","timestamp":"<ts>",`, when it starts
    /// with exactly the head of this event's id and timestamp (what [`prepare`] writes);
    /// [`with_wire_head`] puts the head back, byte for byte. `id` is the hyphenated id text.
    /// Checked, not assumed: a body of another layout (an older release's, a redriven event's)
    /// has none and is kept whole.
    pub fn wire_tail(&self, id: &str) -> Option<&str> {
        let rest = self.json.strip_prefix(HEAD_ID)?.strip_prefix(id)?;
        let rest = rest.strip_prefix(HEAD_TIMESTAMP)?;
        let rest = rest.strip_prefix(Timestamp::new(self.ts_ms).as_str())?;
        let tail = rest.strip_prefix(HEAD_END)?;
        // A tail never starts with `{`, so a row tells which form it holds by its first byte.
        tail.starts_with('"').then_some(tail)
    }
}

const HEAD_ID: &str = r#"{"event_id":""#;
const HEAD_TIMESTAMP: &str = r#"","timestamp":""#;
const HEAD_END: &str = r#"","#;

/// The wire JSON of an event whose head the store left out ([`QueuedEvent::wire_tail`]); a
/// `stored` body that is a whole JSON object (it starts with `{`) is returned as it is.
pub fn with_wire_head(id: &str, ts_ms: i64, stored: String) -> String {
    if stored.starts_with('{') {
        return stored;
    }
    let timestamp = Timestamp::new(ts_ms);
    let timestamp = timestamp.as_str();
    let mut json = String::with_capacity(
        HEAD_ID.len()
            + id.len()
            + HEAD_TIMESTAMP.len()
            + timestamp.len()
            + HEAD_END.len()
            + stored.len(),
    );
    for part in [HEAD_ID, id, HEAD_TIMESTAMP, timestamp, HEAD_END, &stored] {
        json.push_str(part);
    }
    json
}

/// A change to an event's send counts ([`QueuedEvent::sends`], [`QueuedEvent::unanswered`]).
/// A send is counted as unanswered before the request goes out, so an app killed mid-request
/// still counts it; the answer, or a connection that was refused before anything was sent,
/// takes that back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendNote {
    /// A request carrying the event is about to go out.
    Sending,
    /// An HTTP answer (any status) came back for it.
    Answered,
    /// The connection was refused or TLS failed: the request never went out.
    NotSent,
}

impl SendNote {
    /// The change to `(sends, unanswered)`.
    pub fn deltas(self) -> (i64, i64) {
        match self {
            SendNote::Sending => (1, 1),
            SendNote::Answered => (0, -1),
            SendNote::NotSent => (-1, -1),
        }
    }

    pub fn apply(self, event: &mut QueuedEvent) {
        let (sends, unanswered) = self.deltas();
        let add = |n: u32, d: i64| (i64::from(n) + d).clamp(0, i64::from(u32::MAX)) as u32;
        event.sends = add(event.sends, sends);
        event.unanswered = add(event.unanswered, unanswered);
    }
}

/// The wire form's fields in the order they are written. The id and the timestamp come first so
/// that every event starts with the same head, `{"event_id":"…","timestamp":"…",`, which the
/// store leaves out of the row (it has both as columns) and puts back when it reads it
/// ([`QueuedEvent::wire_tail`], [`with_wire_head`]).
#[derive(Serialize)]
struct WireEvent<'a> {
    event_id: &'a str,
    timestamp: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    properties: &'a Map<String, Value>,
}

/// Validates an event and renders its wire form; `now_ms` is the wall clock, the event's
/// acceptance time and its timestamp when the caller gave none.
pub fn prepare(
    event: EventFields<'_>,
    now_ms: i64,
    seq: u64,
    max_event_bytes: u64,
) -> Result<QueuedEvent> {
    if event.name.is_empty() {
        return Err(Error::InvalidEvent("name is empty".into()));
    }
    if event.name.len() > MAX_NAME_BYTES {
        return Err(Error::InvalidEvent(format!(
            "name is {} bytes, over the limit of {MAX_NAME_BYTES}",
            event.name.len()
        )));
    }
    let Value::Object(properties) = event.properties else {
        return Err(Error::InvalidEvent(format!(
            "properties must be a JSON object, got {}",
            json_kind(event.properties)
        )));
    };
    if let Some(session) = event.session_id
        && session.len() > MAX_SESSION_ID_BYTES
    {
        return Err(Error::InvalidEvent(format!(
            "session_id is {} bytes, over the limit of {MAX_SESSION_ID_BYTES}",
            session.len()
        )));
    }
    let id = match event.event_id {
        Some(text) => EventId::parse(text)?,
        None => EventId::new(),
    };
    let ts_ms = match event.timestamp {
        Some(text) => parse_timestamp(text)?,
        None => now_ms,
    };
    let mut id_buf = Uuid::encode_buffer();
    let timestamp = Timestamp::new(ts_ms);
    let wire = WireEvent {
        event_id: id.0.hyphenated().encode_lower(&mut id_buf),
        name: event.name,
        timestamp: timestamp.as_str(),
        session_id: event.session_id,
        properties,
    };
    let json = render(&wire, max_event_bytes)?;
    Ok(QueuedEvent {
        ts_ms,
        seq,
        id,
        json,
        accepted_ms: now_ms,
        sends: 0,
        unanswered: 0,
        critical: event.priority == Priority::Critical,
        sealed: SealedAhead::default(),
    })
}

thread_local! {
    /// Where [`render`] writes an event before it knows its size; kept between calls so a
    /// tracking thread's buffer grows once, not for every event.
    static RENDER_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The scratch buffer is given back to the allocator past this size (one huge event must not
/// pin its memory to the thread).
const RENDER_SCRATCH_KEEP: usize = 64 << 10;

/// Serializes the wire form into the thread's scratch buffer, then copies it into an
/// allocation of exactly its size: one `malloc` per event. Serializing straight into a `String`
/// grows it from 128 bytes by doubling and shrinks it to fit afterwards, four allocator calls
/// for a typical 250-byte event, which made a third of `track()`'s allocator time; the copy
/// and the UTF-8 check of a few hundred bytes cost less than one of them.
fn render(wire: &WireEvent<'_>, max_event_bytes: u64) -> Result<Box<str>> {
    let serialize = |buf: &mut Vec<u8>| -> Result<Box<str>> {
        buf.clear();
        serde_json::to_writer(&mut *buf, wire)
            .map_err(|e| Error::InvalidEvent(format!("cannot serialize: {e}")))?;
        if buf.len() as u64 > max_event_bytes {
            return Err(Error::EventTooLarge {
                size: buf.len() as u64,
                limit: max_event_bytes,
            });
        }
        let text = std::str::from_utf8(buf)
            .map_err(|e| Error::InvalidEvent(format!("cannot serialize: {e}")))?;
        Ok(Box::from(text))
    };
    RENDER_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let rendered = serialize(&mut buf);
            if buf.capacity() > RENDER_SCRATCH_KEEP {
                *buf = Vec::new();
            }
            rendered
        }
        // Only if serializing re-entered `track()` on this thread (it calls no app code today).
        Err(_) => serialize(&mut Vec::new()),
    })
}

/// Parses RFC 3339 (any offset) into UTC milliseconds.
pub fn parse_timestamp(text: &str) -> Result<i64> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            Error::InvalidEvent(format!(
                "timestamp '{}' is not RFC 3339: {e}",
                truncate(text, 64)
            ))
        })
}

/// RFC 3339 UTC with millisecond precision, the one timestamp format on the wire.
pub fn format_timestamp(ms: i64) -> String {
    Timestamp::new(ms).as_str().to_owned()
}

thread_local! {
    /// The day number (days since the epoch) and the date text [`Timestamp::new`] made last.
    static LAST_DATE: std::cell::Cell<Option<(i64, [u8; 10])>> = const { std::cell::Cell::new(None) };
}

/// Writes `value` as `digits` decimal digits (zero-padded) at `at`.
fn put_digits(text: &mut [u8], at: usize, digits: usize, mut value: u32) {
    for i in (at..at + digits).rev() {
        text[i] = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// [`format_timestamp`] without an allocation, for `track()`: chrono works out the calendar,
/// the digits are written into a fixed layout here (`to_rfc3339_opts` goes through the
/// formatting machinery and a `String`, a tenth of making an event).
struct Timestamp {
    text: [u8; 24],
    /// Years outside 0000–9999 do not fit the layout: chrono formats those.
    wide: Option<String>,
}

impl Timestamp {
    fn new(ms: i64) -> Timestamp {
        const DAY_MS: i64 = 86_400_000;
        let (day, in_day) = (ms.div_euclid(DAY_MS), ms.rem_euclid(DAY_MS));
        let mut text = *b"0000-00-00T00:00:00.000Z";
        // The calendar date, from chrono, once per day and thread: events come in bursts of
        // the same day, and the date was most of the cost.
        let date = LAST_DATE.with(|last| match last.get() {
            Some((d, date)) if d == day => Some(date),
            _ => {
                let date = DateTime::<Utc>::from_timestamp_millis(day * DAY_MS)
                    .filter(|t| (0..=9999).contains(&t.year()))
                    .map(|t| {
                        let mut date = *b"0000-00-00";
                        put_digits(&mut date, 0, 4, t.year() as u32);
                        put_digits(&mut date, 5, 2, t.month());
                        put_digits(&mut date, 8, 2, t.day());
                        date
                    })?;
                last.set(Some((day, date)));
                Some(date)
            }
        });
        let Some(date) = date else {
            let t = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default();
            return Timestamp {
                text,
                wide: Some(t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            };
        };
        text[..10].copy_from_slice(&date);
        let in_day = in_day as u32;
        put_digits(&mut text, 11, 2, in_day / 3_600_000);
        put_digits(&mut text, 14, 2, in_day / 60_000 % 60);
        put_digits(&mut text, 17, 2, in_day / 1_000 % 60);
        put_digits(&mut text, 20, 3, in_day % 1_000);
        Timestamp { text, wide: None }
    }

    fn as_str(&self) -> &str {
        match &self.wide {
            Some(wide) => wide,
            // Only ASCII digits and separators are ever written into `text`.
            None => std::str::from_utf8(&self.text).unwrap_or_default(),
        }
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Cuts echoed input so an error message stays short (and never carries a whole payload).
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The fixed-layout timestamp is chrono's RFC 3339 text, digit for digit, across the
    /// calendar: leap days, the end of a year, the epoch, years before it and past 9999.
    #[test]
    fn timestamps_are_written_as_chrono_writes_them() {
        let chrono = |ms: i64| {
            DateTime::<Utc>::from_timestamp_millis(ms)
                .unwrap()
                .to_rfc3339_opts(SecondsFormat::Millis, true)
        };
        let mut samples = vec![
            0,
            1,
            999,
            -1,
            1_709_164_800_000,
            1_735_689_599_999,
            1_735_689_600_000,
            1_735_689_599_998,
            1_735_689_600_001,
            253_402_300_799_999,
            253_402_300_800_000,
            -62_167_219_200_000,
            -62_167_219_200_001,
        ];
        let mut x: i64 = 1_764_417_600_123;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            samples.push(x.rem_euclid(4_102_444_800_000));
        }
        for ms in samples {
            assert_eq!(format_timestamp(ms), chrono(ms), "{ms} ms");
        }
    }

    fn prep(e: &NewEvent) -> Result<QueuedEvent> {
        prepare(e.fields(), 1_764_417_600_000, 1, 32 * 1024)
    }

    #[test]
    fn wire_form_matches_the_protocol() {
        let mut e = NewEvent::new("screen_view", json!({"screen": "home"}));
        e.session_id = Some("s-1".into());
        e.timestamp = Some("2026-11-29T12:58:00.001+01:00".into());
        let q = prep(&e).unwrap();
        let v: Value = serde_json::from_str(&q.json).unwrap();
        assert_eq!(v["name"], "screen_view");
        assert_eq!(v["timestamp"], "2026-11-29T11:58:00.001Z");
        assert_eq!(v["session_id"], "s-1");
        assert_eq!(v["properties"]["screen"], "home");
        assert_eq!(v["event_id"], q.id.to_string());
    }

    /// The store keeps an event without its head and puts it back: byte for byte the JSON
    /// `track()` rendered, whatever the timestamp, session id or
    /// properties. A body of any other layout has no tail and is kept whole.
    #[test]
    fn the_wire_head_comes_off_and_goes_back_byte_for_byte() {
        let mut events = vec![
            NewEvent::new("screen_view", json!({"screen": "home", "n": 1.5})),
            NewEvent::new(
                "a\"b",
                json!({"t": "tab\tand \u{e9}\u{1f600}", "nested": {"x": [1, null]}}),
            ),
            NewEvent::new("e", json!({})),
        ];
        events[0].session_id = Some("s-1".into());
        events[1].timestamp = Some("2026-11-29T12:58:00.001+01:00".into());
        events[2].timestamp = Some("9999-12-31T23:59:59.999Z".into());
        for e in &events {
            let q = prep(e).unwrap();
            let id = q.id.to_string();
            let tail = q
                .wire_tail(&id)
                .unwrap_or_else(|| panic!("no tail in {}", q.json));
            assert!(tail.len() + 80 < q.json.len(), "{tail}");
            assert_eq!(with_wire_head(&id, q.ts_ms, tail.to_owned()), &*q.json);
            assert_eq!(
                q.wire_tail(&EventId::new().to_string()),
                None,
                "another id's head"
            );
            let moved = QueuedEvent {
                ts_ms: q.ts_ms + 1,
                ..q.clone()
            };
            assert_eq!(moved.wire_tail(&id), None, "another timestamp's head");
        }
        let old_layout = QueuedEvent {
            json: format!(
                r#"{{"event_id":"{}","name":"e","timestamp":"x","properties":{{}}}}"#,
                EventId::new()
            )
            .into(),
            ..prep(&events[0]).unwrap()
        };
        assert_eq!(old_layout.wire_tail(&old_layout.id.to_string()), None);
        assert_eq!(
            with_wire_head("id", 0, old_layout.json.to_string()),
            &*old_layout.json
        );
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let cases = [
            (NewEvent::new("", json!({})), "name is empty"),
            (
                NewEvent::new("x".repeat(257), json!({})),
                "name is 257 bytes",
            ),
            (NewEvent::new("a", json!([1])), "an array"),
            (NewEvent::new("a", json!(3)), "a number"),
            (
                NewEvent {
                    event_id: Some("nope".into()),
                    ..NewEvent::new("a", json!({}))
                },
                "not a UUID",
            ),
            (
                NewEvent {
                    timestamp: Some("yesterday".into()),
                    ..NewEvent::new("a", json!({}))
                },
                "RFC 3339",
            ),
        ];
        for (event, expected) in cases {
            let e = prep(&event).unwrap_err().to_string();
            assert!(e.contains(expected), "{e} should contain {expected}");
        }
    }

    #[test]
    fn oversized_event_names_size_and_limit() {
        let e = prepare(
            NewEvent::new("a", json!({"x": "y".repeat(500)})).fields(),
            0,
            1,
            300,
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("300") && text.contains("max_event_bytes"),
            "{text}"
        );
    }

    #[test]
    fn json_lines_parse_and_refuse_typos() {
        let e = NewEvent::from_json_line(r#"{"name":"a","properties":{"x":1},"session_id":"s"}"#)
            .unwrap();
        assert_eq!((e.name.as_str(), e.session_id.as_deref()), ("a", Some("s")));
        assert_eq!(
            NewEvent::from_json_line(r#"{"name":"a"}"#)
                .unwrap()
                .properties,
            json!({})
        );
        let err = NewEvent::from_json_line(r#"{"name":"a","propeties":{}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("propeties"), "{err}");
        assert!(NewEvent::from_json_line("not json").is_err());
    }

    #[test]
    fn explicit_event_id_is_kept() {
        let id = "0193a0b2-7c4e-7000-8000-000000000001";
        let q = prep(&NewEvent {
            event_id: Some(id.into()),
            ..NewEvent::new("a", json!({}))
        })
        .unwrap();
        assert_eq!(q.id.to_string(), id);
    }
}
