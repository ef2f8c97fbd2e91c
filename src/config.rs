//! Configuration: every knob of docs/configuration.md, its default, and the rules that refuse a bad
//! value.
//!
//! One home for all of it: the Rust builder, the FFI config record and the CLI's `--set name=value`
//! all end up in [`Config::set`] or [`Config::validate`], so a name or a default is spelled once.

use std::path::PathBuf;

use crate::consent::Consent;
pub use crate::crypto::EncryptionKeys;
use crate::error::ConfigError;
pub use crate::setting::SettingValue;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const SECOND_MS: u64 = 1000;
const DAY_MS: u64 = 24 * 60 * 60 * SECOND_MS;

/// Below this the SQLite file cannot hold its schema pages plus a useful backlog, so a smaller
/// cap would make the store evict everything it is given.
pub const MIN_DISK_BYTES: u64 = 64 * KIB;

/// Bytes of a batch body that are not events: `{"sent_at":"…","batch":[` and `]}`.
pub const BATCH_OVERHEAD_BYTES: u64 = 64;

/// Whether request bodies are gzipped (only bodies over 1 KiB; smaller ones gain nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    None,
    Gzip,
}

/// When an event becomes durable on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Memory first; the store takes the overflow and everything on `persist()`/`shutdown()`.
    /// An app killed without either loses what was only in memory.
    Spill,
    /// Every event is in the store before `track()` returns (concurrent callers share one commit).
    Always,
}

/// The one table of settings (docs/configuration.md): name, Rust type, default, doc, and the
/// type the FFI record carries when the app sets it. It hands the rows to the macro `$then`,
/// which generates what it needs from them: here the [`Config`] struct, [`CONFIG_NAMES`],
/// [`Config::new`], [`Config::set`] and `Debug`; in the UniFFI surface the `SpoolConfig` record,
/// its `Debug` and its conversion. A setting added to this table appears in all of them, so no
/// list can forget one. How a text value parses follows from the Rust type ([`SettingValue`]);
/// `secret` marks what `Debug` must never print.
#[doc(hidden)]
#[macro_export]
macro_rules! config_table {
    ($then:ident) => {
        $then! {
            required {
                /// The collector's batch URL: `https://`; `http://` only to loopback or with
                /// `allow_insecure_http`.
                endpoint: String;
            }
            optional {
                /// Sent as `Authorization: Bearer …`; never logged.
                api_key: Option<String> = None, ffi String, secret;
                /// SQLite file (created 0600); absent keeps events in memory only.
                db_path: Option<PathBuf> = None, ffi String, plain;
                /// Encrypts what the store writes: `(key_id, 32 bytes)` pairs, the first
                /// sealing new rows, the others only reading old ones (rotation). Text form
                /// `ID:HEX64[,ID:HEX64…]`; empty stores in plain text.
                encryption_keys: EncryptionKeys = EncryptionKeys::default(), ffi Vec<EncryptionKey>, secret;
                /// Events in memory before the oldest spill.
                memory_capacity: u64 = 1000, ffi u64, plain;
                /// Database + WAL, quarantine included.
                max_disk_bytes: u64 = DEFAULT_MAX_DISK_BYTES, ffi u64, plain;
                max_event_bytes: u64 = 32 * KIB, ffi u64, plain;
                max_batch_events: u64 = 100, ffi u64, plain;
                /// Counts the body before compression.
                max_batch_bytes: u64 = 512 * KIB, ffi u64, plain;
                /// Pause between batches while draining.
                min_batch_interval_ms: u64 = SECOND_MS, ffi u64, plain;
                flush_at: u64 = 20, ffi u64, plain;
                flush_interval_ms: u64 = 30 * SECOND_MS, ffi u64, plain;
                // The retry defaults are chosen so each knob can decide: the ceilings run 1, 2,
                // 4, 8, then 15 s (the cap, from retry 5), so ten retries take 52 s on average
                // and at most 105 s; the 60 s elapsed budget ends the high draws, the attempt
                // count the low ones. A 15 s cap also means a collector back from an outage is
                // tried again within 15 s while the episode lasts; after it, the probe takes over.
                backoff_base_ms: u64 = SECOND_MS, ffi u64, plain;
                backoff_cap_ms: u64 = 15 * SECOND_MS, ffi u64, plain;
                max_auto_attempts: u32 = 10, ffi u32, plain;
                max_retry_elapsed_ms: u64 = 60 * SECOND_MS, ffi u64, plain;
                // First probe within a minute of the hand-over, then doubling to 15 minutes: slow
                // enough for a fleet stuck behind a long outage, soon enough that no event waits
                // for a person once the collector is back.
                /// `WaitingForUser`'s slow automatic probe: ceiling of the delay before probe k is
                /// `min(probe_cap_ms, probe_base_ms · 2^(k-1))`, full jitter (see `retry.rs`).
                probe_base_ms: u64 = 60 * SECOND_MS, ffi u64, plain;
                probe_cap_ms: u64 = 15 * 60 * SECOND_MS, ffi u64, plain;
                attempt_timeout_ms: u64 = 10 * SECOND_MS, ffi u64, plain;
                retry_after_cap_ms: u64 = 300 * SECOND_MS, ffi u64, plain;
                /// Counted from acceptance; older events are dropped (`expired`), never sent.
                max_event_age_ms: u64 = 7 * DAY_MS, ffi u64, plain;
                /// Requests without an answer (timeout, connection dropped) an event may ride
                /// before it is isolated and quarantined as `max_sends`: it ends the "retried for
                /// ever" of an event the collector crashes on, while a flaky network rarely
                /// reaches it.
                max_event_sends: u32 = 10, ffi u32, plain;
                quarantine_max_events: u64 = 10_000, ffi u64, plain;
                quarantine_retention_ms: u64 = 30 * DAY_MS, ffi u64, plain;
                /// `"gzip"` (default) or `"none"`.
                compression: Compression = Compression::Gzip, ffi String, plain;
                /// `"spill"` (default) or `"always"` (needs `db_path`).
                durability: Durability = Durability::Spill, ffi String, plain;
                allow_insecure_http: bool = false, ffi bool, plain;
                /// Take directives from the collector's answers (docs/protocol.md §Directives);
                /// `false` ignores them (counted in `directives_ignored`). Reports go either way.
                directives: bool = true, ffi bool, plain;
                // Delivery conditions (`set_conditions`): which of them hold delivery back, as
                // `Deferred{reason}`. Metered networks are allowed by default (a few KB per batch);
                // power saving and a low battery defer, as the platforms ask of background work.
                /// Deliver on a metered network; `false` defers as `Deferred{metered}`.
                deliver_on_metered: bool = true, ffi bool, plain;
                /// Deliver while the device saves power; `false` defers as `Deferred{low_power}`.
                deliver_on_low_power: bool = false, ffi bool, plain;
                /// Deliver on a low battery; `false` defers as `Deferred{battery_low}`.
                deliver_on_battery_low: bool = false, ffi bool, plain;
                /// Consent a store without a record starts in, and records (a memory-only
                /// spool: at every open): `"granted"` (default), `"pending"` or `"denied"`. From
                /// then on the store's record (changed by `set_consent`) wins over this.
                consent: Consent = Consent::Granted, ffi String, plain;
                /// `false` opens the spool opted out, as after `set_enabled(false)`: nothing is
                /// sent and `track()` is refused until `set_enabled(true)`. Opted out when either
                /// this or the store's record (kept by `set_enabled`) says so, so a restored
                /// backlog never starts sending before the app's own call.
                enabled: bool = true, ffi bool, plain;
            }
        }
    };
}

/// How `Debug` shows one field of a config: as is, or (`secret`) only whether it is set.
#[doc(hidden)]
#[macro_export]
macro_rules! config_shown {
    (plain, $value:expr) => {
        $value
    };
    (secret, $value:expr) => {
        &$crate::redacted_key($value)
    };
}

macro_rules! define_config {
    (
        required { $(#[$rmeta:meta])* $req:ident: $rty:ty; }
        optional { $( $(#[$meta:meta])* $name:ident: $ty:ty = $default:expr, ffi $fty:ty, $show:ident; )* }
    ) => {
        /// A validated configuration. Build it with [`Config::new`] and plain field assignment,
        /// or [`Config::set`] by name; [`crate::EventSpool::open`] validates it again before use.
        /// `Debug` shows whether an API key is set, never the key (configs end up in logs and
        /// panics).
        #[derive(Clone)]
        #[non_exhaustive]
        pub struct Config {
            $(#[$rmeta])*
            pub $req: $rty,
            $( $(#[$meta])* pub $name: $ty, )*
        }

        /// Every name [`Config::set`] accepts, in docs/configuration.md order (the CLI lists them
        /// in its help).
        pub const CONFIG_NAMES: &[&str] = &[stringify!($req), $(stringify!($name)),*];

        impl Config {
            /// The defaults of docs/configuration.md with the one required field.
            pub fn new($req: impl Into<String>) -> Config {
                Config {
                    $req: $req.into(),
                    $( $name: $default, )*
                }
            }

            /// Sets one field from its docs/configuration.md name and a textual value, as the
            /// CLI and bindings do.
            pub fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
                match name {
                    stringify!($req) => self.$req = SettingValue::parse(name, value)?,
                    $( stringify!($name) => self.$name = SettingValue::parse(name, value)?, )*
                    _ => {
                        return Err(ConfigError::new(
                            name,
                            format!(
                                "unknown setting; known settings: {}",
                                CONFIG_NAMES.join(", ")
                            ),
                        ));
                    }
                }
                Ok(())
            }
        }

        impl std::fmt::Debug for Config {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Config")
                    .field(stringify!($req), &self.$req)
                    $( .field(stringify!($name), $crate::config_shown!($show, &self.$name)) )*
                    .finish()
            }
        }
    };
}

config_table!(define_config);

/// How `Debug` shows a secret (an API key, encryption keys): whether there is one, never its
/// value.
#[doc(hidden)]
pub fn redacted_key(key: &impl crate::crypto::Redact) -> Option<String> {
    key.redacted()
}

/// The default `max_disk_bytes`; also the cap a store opened for triage (no config) gets.
pub const DEFAULT_MAX_DISK_BYTES: u64 = 10 * MIB;

impl SettingValue for Compression {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        match value {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            _ => Err(ConfigError::new(
                name,
                format!("'{value}' is not one of: none, gzip"),
            )),
        }
    }
}

impl SettingValue for Durability {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        match value {
            "spill" => Ok(Durability::Spill),
            "always" => Ok(Durability::Always),
            _ => Err(ConfigError::new(
                name,
                format!("'{value}' is not one of: spill, always"),
            )),
        }
    }
}

impl Config {
    /// Refuses a configuration the SDK could not honour, naming the field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_endpoint(&self.endpoint, self.allow_insecure_http)?;
        for (name, value) in [
            ("memory_capacity", self.memory_capacity),
            ("max_event_bytes", self.max_event_bytes),
            ("max_batch_events", self.max_batch_events),
            ("max_batch_bytes", self.max_batch_bytes),
            ("flush_at", self.flush_at),
            ("flush_interval_ms", self.flush_interval_ms),
            ("backoff_base_ms", self.backoff_base_ms),
            ("backoff_cap_ms", self.backoff_cap_ms),
            ("max_retry_elapsed_ms", self.max_retry_elapsed_ms),
            ("probe_base_ms", self.probe_base_ms),
            ("probe_cap_ms", self.probe_cap_ms),
            ("attempt_timeout_ms", self.attempt_timeout_ms),
            ("max_event_age_ms", self.max_event_age_ms),
            ("max_event_sends", u64::from(self.max_event_sends)),
            ("quarantine_max_events", self.quarantine_max_events),
            ("quarantine_retention_ms", self.quarantine_retention_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::new(name, "must be greater than 0"));
            }
        }
        if self.backoff_cap_ms < self.backoff_base_ms {
            return Err(ConfigError::new(
                "backoff_cap_ms",
                format!(
                    "{} is below backoff_base_ms ({})",
                    self.backoff_cap_ms, self.backoff_base_ms
                ),
            ));
        }
        if self.probe_cap_ms < self.probe_base_ms {
            return Err(ConfigError::new(
                "probe_cap_ms",
                format!(
                    "{} is below probe_base_ms ({})",
                    self.probe_cap_ms, self.probe_base_ms
                ),
            ));
        }
        if self.max_batch_bytes < self.max_event_bytes.saturating_add(BATCH_OVERHEAD_BYTES) {
            return Err(ConfigError::new(
                "max_batch_bytes",
                format!(
                    "{} cannot hold one event of max_event_bytes ({}) plus {} bytes of envelope",
                    self.max_batch_bytes, self.max_event_bytes, BATCH_OVERHEAD_BYTES
                ),
            ));
        }
        let min_disk = MIN_DISK_BYTES.max(self.max_event_bytes.saturating_mul(4));
        if self.db_path.is_some() && self.max_disk_bytes < min_disk {
            return Err(ConfigError::new(
                "max_disk_bytes",
                format!(
                    "{} is too small: the store needs at least {} bytes (64 KiB and 4 × max_event_bytes)",
                    self.max_disk_bytes, min_disk
                ),
            ));
        }
        if let Some(key) = &self.api_key {
            check_api_key(key)?;
        }
        self.encryption_keys.validate()?;
        Ok(())
    }
}

/// An API key goes into an HTTP header: it must be non-empty and free of control characters.
pub(crate) fn check_api_key(key: &str) -> Result<(), ConfigError> {
    if key.is_empty() || key.chars().any(|c| c.is_control()) {
        return Err(ConfigError::new(
            "api_key",
            "must be non-empty and contain no control characters",
        ));
    }
    Ok(())
}

/// `https://` anywhere; `http://` only to loopback, unless the app says otherwise on purpose.
fn validate_endpoint(endpoint: &str, allow_insecure_http: bool) -> Result<(), ConfigError> {
    let url = url::Url::parse(endpoint)
        .map_err(|e| ConfigError::new("endpoint", format!("'{endpoint}' is not a URL: {e}")))?;
    let host = url
        .host_str()
        .ok_or_else(|| ConfigError::new("endpoint", format!("'{endpoint}' has no host")))?;
    match url.scheme() {
        "https" => Ok(()),
        "http" if allow_insecure_http || is_loopback(host) => Ok(()),
        "http" => Err(ConfigError::new(
            "endpoint",
            format!(
                "plain http to non-loopback host '{host}' is refused; use https or set allow_insecure_http"
            ),
        )),
        other => Err(ConfigError::new(
            "endpoint",
            format!("scheme '{other}' is not http or https"),
        )),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = Config::new("https://collector.example/v1/batch");
        c.validate().unwrap();
        assert_eq!(c.memory_capacity, 1000);
        assert_eq!(c.max_disk_bytes, 10 * 1024 * 1024);
        assert_eq!(c.max_event_age_ms, 7 * 24 * 3600 * 1000);
        assert_eq!(c.max_event_sends, 10);
        assert_eq!(c.compression, Compression::Gzip);
    }

    /// With the old 5 × 1 s base, the fifth retry's ceiling (16 s) never reached the
    /// 30 s cap, and the retries could never last the 300 s elapsed budget. Each knob must be
    /// able to end or shape an episode with the defaults.
    #[test]
    fn every_retry_default_can_matter() {
        use crate::retry::backoff_ceiling_ms;
        let c = Config::new("https://collector.example/v1/batch");
        let ceilings: Vec<u64> = (1..=c.max_auto_attempts)
            .map(|k| backoff_ceiling_ms(k, c.backoff_base_ms, c.backoff_cap_ms))
            .collect();
        let uncapped = c.backoff_base_ms << (c.max_auto_attempts - 1);
        assert!(uncapped > c.backoff_cap_ms, "the cap is reached");
        let longest: u64 = ceilings.iter().sum();
        let average = longest / 2;
        assert!(
            longest > c.max_retry_elapsed_ms,
            "the elapsed budget can end an episode ({longest} ms at most)"
        );
        assert!(
            average < c.max_retry_elapsed_ms,
            "the attempt count ends a typical episode ({average} ms on average)"
        );
        assert!(c.probe_base_ms >= c.backoff_cap_ms && c.probe_cap_ms > c.probe_base_ms);
    }

    #[test]
    fn every_name_can_be_set() {
        let mut c = Config::new("https://x.example");
        for name in CONFIG_NAMES {
            let value = match *name {
                "endpoint" => "https://y.example",
                "api_key" => "k",
                "db_path" => "/tmp/x.db",
                "encryption_keys" => {
                    "7:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
                }
                "compression" => "none",
                "durability" => "always",
                "allow_insecure_http"
                | "enabled"
                | "directives"
                | "deliver_on_metered"
                | "deliver_on_low_power"
                | "deliver_on_battery_low" => "true",
                "consent" => "pending",
                _ => "7",
            };
            c.set(name, value).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!((c.max_auto_attempts, c.max_event_sends), (7, 7));
        assert_eq!(c.consent, Consent::Pending);
        let e = c.set("consent", "maybe").unwrap_err();
        assert!(
            e.to_string().contains("consent") && e.to_string().contains("maybe"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let mut c = Config::new("https://x.example");
        let e = c.set("flush_at", "many").unwrap_err();
        assert!(e.to_string().contains("flush_at"), "{e}");
        let e = c.set("no_such_thing", "1").unwrap_err();
        assert!(e.to_string().contains("no_such_thing"), "{e}");
        c.memory_capacity = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("memory_capacity")
        );
    }

    #[test]
    fn plain_http_only_to_loopback() {
        for ok in [
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "http://[::1]:8/x",
        ] {
            Config::new(ok).validate().unwrap();
        }
        let e = Config::new("http://collector.example/x")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("endpoint"), "{e}");
        let mut c = Config::new("http://collector.example/x");
        c.allow_insecure_http = true;
        c.validate().unwrap();
        assert!(Config::new("ftp://x").validate().is_err());
        assert!(Config::new("not a url").validate().is_err());
    }

    #[test]
    fn debug_never_prints_the_api_key() {
        let mut c = Config::new("https://x.example");
        c.api_key = Some("sk-live-0123456789".into());
        c.encryption_keys = EncryptionKeys::new([(3, [0xab; 32])]);
        let text = format!("{c:?} {c:#?}");
        assert!(!text.contains("sk-live-0123456789"), "{text}");
        assert!(!text.to_lowercase().contains("abab"), "{text}");
        assert!(!text.contains("171, 171"), "{text}");
        assert!(text.contains("key ids [3]"), "{text}");
        assert!(text.contains("api_key"), "the field is still shown: {text}");
        assert!(text.contains("https://x.example"), "{text}");
    }

    /// docs/configuration.md is the contract apps read: its table lists exactly the settings
    /// the table in this file generates, in the same order.
    #[test]
    fn configuration_doc_table_lists_exactly_the_settings() {
        let doc = include_str!("../docs/configuration.md");
        let mut listed = Vec::new();
        for row in doc.lines().filter(|l| l.starts_with("| `")) {
            let first_cell = row.split('|').nth(1).unwrap();
            listed.extend(first_cell.split('`').skip(1).step_by(2));
        }
        assert_eq!(
            listed, CONFIG_NAMES,
            "docs/configuration.md vs config_table!"
        );
    }

    #[test]
    fn disk_cap_smaller_than_events_is_refused() {
        let mut c = Config::new("https://x.example");
        c.db_path = Some("/tmp/x".into());
        c.max_disk_bytes = 1000;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("max_disk_bytes")
        );
    }
}
