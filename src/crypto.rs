//! Encryption at rest: the keys an app supplies ([`EncryptionKeys`], config `encryption_keys`)
//! and the sealing the store applies to every payload it writes (queued bodies, and the body,
//! reason and detail of quarantined events).
//!
//! Each sealed value is `nonce ‖ ciphertext ‖ tag` with a 24-byte nonce; the associated data
//! names the column and the event id, so a ciphertext moved to another row or column fails
//! authentication instead of being read as someone else's payload. The nonce's first 16 bytes
//! and the key give a subkey (HChaCha20, 20 rounds); its last 8 bytes, a little-endian count,
//! are the message nonce under that subkey and say which AEAD sealed the value ([`Aead`]):
//!
//! - **XChaCha20-Poly1305** (bit 62 of the count clear): ChaCha20-Poly1305 under the subkey,
//!   fast in software on phones whose CPUs lack AES instructions. Every store written before
//!   schema version 8 holds only these.
//! - **AES-256-GCM** (bit 62 set): the same subkey and message nonce, AES-256-GCM. Where the CPU
//!   has AES and carry-less multiply instructions (x86 AES-NI and PCLMULQDQ, ARMv8's AES and
//!   PMULL: nearly every phone and desktop today) it seals a 250-byte event in about half of
//!   ChaCha20-Poly1305's time, so a keyring seals with it there ([`Aead::for_this_cpu`]).
//!   Opening follows the value's bit, whatever the CPU: a store copied to another device opens.
//!   (Releases before dd05d03 drew the whole nonce from the OS, so an old XChaCha value may
//!   have the bit set by chance; such a value is opened as XChaCha once AES fails.)
//!
//! A [`Keyring`] draws the 16 bytes from the OS once and counts the last 8 (in two halves of
//! the range: the store's own seals and tracking threads' seals ahead): every nonce it makes is
//! new without a counter that has to survive a crash or be shared between processes (two
//! keyrings meet only if two draws of 128 random bits are equal, and a subkey only ever seals
//! with one AEAD, its keyring's), and the subkey is derived once per key instead of once per
//! row. The sealing itself is ring's (assembly on x86 and ARM): with RustCrypto's
//! `XChaCha20Poly1305` and a nonce from the OS for each row, sealing a 250-byte event took
//! 2.7 µs, most of an encrypted spill's cost; ring's ChaCha20-Poly1305 takes about 0.26 µs and
//! its AES-256-GCM about 0.14 µs (BENCHMARKS.md, "Encrypted spill" and "AES-256-GCM where the
//! CPU has AES instructions"). Both formats are checked against RustCrypto's implementations
//! (`tests::the_format_is_xchacha20_poly1305`, `tests::the_aes_format_is_aes_256_gcm_under_the_subkey`).
//!
//! Every row records the id of the key that sealed it (0: written in plain text, by a release
//! without encryption or before a key was supplied). The first key of `encryption_keys` seals
//! new rows; the others only open old ones, which is how keys are rotated.

use std::sync::atomic::{AtomicU64, Ordering};

use chacha20::cipher::consts::U10;
use crossbeam_utils::CachePadded;
use ring::aead::{AES_256_GCM, Aad, Algorithm, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

use crate::error::ConfigError;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the nonce in front of every sealed value.
const NONCE_BYTES: usize = 24;
/// The nonce's first bytes, the input of HChaCha20 (the rest is the message nonce).
const PREFIX_BYTES: usize = 16;
/// Bytes of the tag after the ciphertext.
const TAG_BYTES: usize = 16;
/// What the key check record seals (see `Store::check_keys`).
const CHECK_TEXT: &[u8] = b"eventspool key check";

/// The keys of `encryption_keys`: `(key_id, 32 bytes)`, the first the one new rows are sealed
/// with. Empty (the default) stores in plain text. `Debug` shows the ids, never a key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EncryptionKeys {
    keys: Vec<(u32, [u8; KEY_BYTES])>,
}

impl EncryptionKeys {
    /// Keys as the app holds them; the first is the current one. [`crate::Config::validate`]
    /// refuses id 0 (it means plain text) and an id given twice.
    pub fn new(keys: impl IntoIterator<Item = (u32, [u8; KEY_BYTES])>) -> EncryptionKeys {
        EncryptionKeys {
            keys: keys.into_iter().collect(),
        }
    }

    /// Keys from byte slices (what the FFI hands over); a key of the wrong length is refused,
    /// naming its id.
    pub fn from_slices<'a>(
        keys: impl IntoIterator<Item = (u32, &'a [u8])>,
    ) -> Result<EncryptionKeys, ConfigError> {
        let mut out = Vec::new();
        for (id, bytes) in keys {
            let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| {
                ConfigError::new(
                    "encryption_keys",
                    format!(
                        "key id {id} is {} bytes; a key is {KEY_BYTES} bytes",
                        bytes.len()
                    ),
                )
            })?;
            out.push((id, key));
        }
        Ok(EncryptionKeys { keys: out })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The id new rows are sealed with; `None` without keys.
    pub fn current_id(&self) -> Option<u32> {
        self.keys.first().map(|(id, _)| *id)
    }

    /// Every id, the current one first.
    pub fn ids(&self) -> Vec<u32> {
        self.keys.iter().map(|(id, _)| *id).collect()
    }

    /// Refuses id 0 and an id given twice.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, (id, _)) in self.keys.iter().enumerate() {
            if *id == 0 {
                return Err(ConfigError::new(
                    "encryption_keys",
                    "key id 0 is reserved for rows stored in plain text; use ids from 1",
                ));
            }
            if self.keys[..i].iter().any(|(other, _)| other == id) {
                return Err(ConfigError::new(
                    "encryption_keys",
                    format!("key id {id} is given twice"),
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for EncryptionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKeys {{ ids: {:?} }}", self.ids())
    }
}

/// `ID:HEX[,ID:HEX…]` (64 hex digits a key), the CLI's and environment's form; empty is none.
/// Errors name the key id, never the key.
impl crate::setting::SettingValue for EncryptionKeys {
    fn parse(name: &str, value: &str) -> Result<Self, ConfigError> {
        let mut keys = Vec::new();
        for (i, item) in value.split(',').map(str::trim).enumerate() {
            if item.is_empty() {
                continue;
            }
            let bad = |why: &str| ConfigError::new(name, format!("key {}: {why}", i + 1));
            let (id, hex) = item
                .split_once(':')
                .ok_or_else(|| bad("expected KEY_ID:64_HEX_DIGITS"))?;
            let id: u32 = id
                .trim()
                .parse()
                .map_err(|_| bad("the key id is not a whole number"))?;
            let hex = hex.trim();
            if hex.len() != KEY_BYTES * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ConfigError::new(
                    name,
                    format!("key id {id}: expected {} hex digits", KEY_BYTES * 2),
                ));
            }
            let mut key = [0u8; KEY_BYTES];
            for (j, byte) in key.iter_mut().enumerate() {
                *byte =
                    u8::from_str_radix(&hex[j * 2..j * 2 + 2], 16).map_err(|_| bad("not hex"))?;
            }
            keys.push((id, key));
        }
        Ok(EncryptionKeys { keys })
    }
}

/// What `Debug` of a config shows of a secret: whether it is set, never its value.
#[doc(hidden)]
pub trait Redact {
    fn redacted(&self) -> Option<String>;
}

impl Redact for Option<String> {
    fn redacted(&self) -> Option<String> {
        self.as_ref().map(|_| "<redacted>".to_string())
    }
}

impl Redact for EncryptionKeys {
    fn redacted(&self) -> Option<String> {
        (!self.is_empty()).then(|| format!("<redacted: key ids {:?}>", self.ids()))
    }
}

impl<T> Redact for Option<Vec<T>> {
    fn redacted(&self) -> Option<String> {
        self.as_ref()
            .map(|keys| format!("<redacted: {} key(s)>", keys.len()))
    }
}

/// A value that could not be opened: its key is unknown, or it fails authentication.
#[derive(Debug)]
pub(crate) struct Unreadable;

/// The AEAD that seals under a keyring's subkey. A sealed value names its own in bit 62 of its
/// nonce's count ([`AES_MARK`]), so a store holds rows of both (written before and after an
/// upgrade, or on two devices) and opens each with the one that sealed it. Tests choose one
/// (`SpoolBuilder::aead`, feature `test-util`); apps get [`Aead::for_this_cpu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aead {
    /// XChaCha20-Poly1305: constant time and fast in software, on any CPU.
    ChaCha20Poly1305,
    /// AES-256-GCM under the same subkey: about twice as fast where the CPU has AES and
    /// carry-less multiply instructions, slow (ring's constant-time software AES) where not.
    Aes256Gcm,
}

/// Bit 62 of a nonce's count: clear, the value is XChaCha20-Poly1305 (a keyring's counts start
/// at 0 and at 2^63 and never reach 2^62 more); set, AES-256-GCM, or an older release's
/// XChaCha20-Poly1305 with a random nonce ([`Aead::candidates`]). Each counter of an AES
/// keyring starts with it set.
const AES_MARK: u64 = 1 << 62;

impl Aead {
    /// AES-256-GCM where the CPU has the instructions that make it fast and constant time (as
    /// TLS stacks choose between the two), XChaCha20-Poly1305 elsewhere.
    pub fn for_this_cpu() -> Aead {
        if hardware_aes() {
            Aead::Aes256Gcm
        } else {
            Aead::ChaCha20Poly1305
        }
    }

    /// The AEADs that may have sealed a value whose nonce counts `count`, to try in this order.
    /// A clear mark is XChaCha20-Poly1305 alone. A set mark is AES-256-GCM, or XChaCha20-Poly1305
    /// sealed by a release that drew the whole nonce from the OS (before dd05d03: rows of
    /// schema versions up to 7 may hold such values, their count random): those are tried as
    /// ChaCha once AES fails. Each attempt checks a 128-bit tag, so a value opens only with the
    /// AEAD that sealed it.
    fn candidates(count: u64) -> &'static [Aead] {
        if count & AES_MARK == 0 {
            &[Aead::ChaCha20Poly1305]
        } else {
            &[Aead::Aes256Gcm, Aead::ChaCha20Poly1305]
        }
    }

    /// Where a keyring's counts start: each counter's first value is this added to it.
    fn mark(self) -> u64 {
        match self {
            Aead::ChaCha20Poly1305 => 0,
            Aead::Aes256Gcm => AES_MARK,
        }
    }

    fn algorithm(self) -> &'static Algorithm {
        match self {
            Aead::ChaCha20Poly1305 => &CHACHA20_POLY1305,
            Aead::Aes256Gcm => &AES_256_GCM,
        }
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn hardware_aes() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn hardware_aes() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
fn hardware_aes() -> bool {
    false
}

/// The keys ready for sealing and opening.
pub(crate) struct Keyring {
    /// The current key first.
    keys: Vec<(u32, [u8; KEY_BYTES])>,
    /// The first 16 bytes of every nonce this keyring makes, from the OS.
    prefix: [u8; PREFIX_BYTES],
    /// The current key's subkey for `prefix`, under `aead`: what seals.
    sealing: Option<LessSafeKey>,
    /// What this keyring seals with (opening follows each value's own mark).
    aead: Aead,
    /// The last 8 bytes of the next nonce: the store's writes count from 0, tracking threads
    /// sealing ahead of the spill ([`Keyring::seal_ahead`]) from 2^63, both plus
    /// [`Aead::mark`], so the two never meet (2^62 seals each). Each on a cache line of its
    /// own: a tracking thread and the spill thread seal side by side, and a shared line (with
    /// the other counter, or with the key both read) would move between their cores at every
    /// seal.
    counters: [CachePadded<AtomicU64>; 2],
}

/// Where the counter of [`Keyring::seal_ahead`] starts.
const AHEAD_COUNTS_FROM: u64 = 1 << 63;

impl Keyring {
    /// Keys sealing with the AEAD this CPU runs fastest ([`Aead::for_this_cpu`]).
    pub fn new(keys: &EncryptionKeys) -> Keyring {
        Keyring::sealing_with(keys, Aead::for_this_cpu())
    }

    /// Keys sealing with `aead`: the queue's choice (`QueueParams::aead`, which tests set to
    /// write both formats on any CPU).
    pub fn sealing_with(keys: &EncryptionKeys, aead: Aead) -> Keyring {
        let mut prefix = [0u8; PREFIX_BYTES];
        if !keys.is_empty() {
            // Without the OS's generator no nonce could be trusted to be new: nothing may be
            // sealed, and there is no store to open. Never seen on a platform the SDK builds for.
            getrandom::getrandom(&mut prefix).expect("the OS's random generator answers");
        }
        Keyring {
            sealing: keys.keys.first().map(|(_, key)| subkey(key, &prefix, aead)),
            keys: keys.keys.clone(),
            prefix,
            aead,
            counters: [
                CachePadded::new(AtomicU64::new(aead.mark())),
                CachePadded::new(AtomicU64::new(AHEAD_COUNTS_FROM | aead.mark())),
            ],
        }
    }

    /// No keys: rows are written in plain text (key id 0).
    pub fn plain() -> Keyring {
        Keyring::new(&EncryptionKeys::default())
    }

    /// The id new rows get: the current key's, or 0 for plain text.
    pub fn current_id(&self) -> u32 {
        self.keys.first().map(|(id, _)| *id).unwrap_or(0)
    }

    /// Rows are sealed (a current key exists).
    pub fn seals(&self) -> bool {
        self.sealing.is_some()
    }

    /// What new rows are sealed with; `None` without a current key.
    pub fn aead(&self) -> Option<Aead> {
        self.seals().then_some(self.aead)
    }

    pub fn has(&self, key_id: u32) -> bool {
        self.keys.iter().any(|(id, _)| *id == key_id)
    }

    pub fn ids(&self) -> Vec<u32> {
        self.keys.iter().map(|(id, _)| *id).collect()
    }

    fn key(&self, key_id: u32) -> Option<&[u8; KEY_BYTES]> {
        self.keys
            .iter()
            .find(|(id, _)| *id == key_id)
            .map(|(_, k)| k)
    }

    /// Seals `plain` for the column `column` of the row of `event_id` with the current key;
    /// without keys, the text as is.
    pub fn seal<'a>(&self, column: &str, event_id: &str, plain: &'a str) -> Stored<'a> {
        self.seal_counting(&self.counters[0], column, event_id, plain)
            .map_or(Stored::Text(plain), Stored::Sealed)
    }

    /// [`Keyring::seal`] on a tracking thread, for a row the spill will write (`None` without
    /// keys). The nonce comes from a counter of its own, so that the thread does not contend
    /// with the spill thread's seals for one.
    pub fn seal_ahead(&self, column: &str, event_id: &str, plain: &str) -> Option<Vec<u8>> {
        self.seal_counting(&self.counters[1], column, event_id, plain)
    }

    /// `plain` sealed with the current key for `column` of `event_id`'s row, its nonce drawn
    /// from `counter`; `None` without keys.
    fn seal_counting(
        &self,
        counter: &AtomicU64,
        column: &str,
        event_id: &str,
        plain: &str,
    ) -> Option<Vec<u8>> {
        let sealing = self.sealing.as_ref()?;
        Some(with_aad(column, event_id, |aad| {
            self.seal_with(counter, sealing, aad, plain.as_bytes())
        }))
    }

    /// `nonce ‖ ciphertext ‖ tag`, the nonce `counter`'s next.
    fn seal_with(
        &self,
        counter: &AtomicU64,
        sealing: &LessSafeKey,
        aad: &[u8],
        plain: &[u8],
    ) -> Vec<u8> {
        let count = counter.fetch_add(1, Ordering::Relaxed).to_le_bytes();
        let mut out = Vec::with_capacity(NONCE_BYTES + plain.len() + TAG_BYTES);
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(&count);
        out.extend_from_slice(plain);
        // Fails only for messages beyond the cipher's limit (256 GiB), far above
        // `max_event_bytes`.
        let tag = sealing
            .seal_in_place_separate_tag(
                message_nonce(&count),
                Aad::from(aad),
                &mut out[NONCE_BYTES..],
            )
            .expect("an event is far below the AEAD's message limit");
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// Opens what [`Keyring::seal`] stored with key `key_id` (0: plain text).
    pub fn open(
        &self,
        key_id: u32,
        column: &str,
        event_id: &str,
        stored: rusqlite::types::ValueRef<'_>,
    ) -> Result<String, Unreadable> {
        use rusqlite::types::ValueRef;
        match (key_id, stored) {
            (0, ValueRef::Text(t)) => String::from_utf8(t.to_vec()).map_err(|_| Unreadable),
            (0, _) => Err(Unreadable),
            (id, ValueRef::Blob(b)) => {
                let key = self.key(id).ok_or(Unreadable)?;
                let plain = with_aad(column, event_id, |aad| open_with(key, aad, b))?;
                String::from_utf8(plain).map_err(|_| Unreadable)
            }
            _ => Err(Unreadable),
        }
    }

    /// The record that proves, at the next open, that key `key_id` is the one it was.
    pub fn check_record(&self, key_id: u32) -> Option<Vec<u8>> {
        let key = self.key(key_id)?;
        Some(self.seal_with(
            &self.counters[0],
            &subkey(key, &self.prefix, self.aead),
            &check_aad(key_id),
            CHECK_TEXT,
        ))
    }

    /// Whether `record` was made by the supplied key `key_id`.
    pub fn verifies(&self, key_id: u32, record: &[u8]) -> bool {
        self.key(key_id)
            .and_then(|key| open_with(key, &check_aad(key_id), record).ok())
            .is_some_and(|text| text == CHECK_TEXT)
    }
}

/// A column's value as stored: text for plain rows (borrowed, no copy), a sealed blob otherwise.
pub(crate) enum Stored<'a> {
    Text(&'a str),
    Sealed(Vec<u8>),
}

impl rusqlite::ToSql for Stored<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(match self {
            Stored::Text(t) => rusqlite::types::ToSqlOutput::from(*t),
            Stored::Sealed(b) => rusqlite::types::ToSqlOutput::from(b.as_slice()),
        })
    }
}

/// `column|event_id`, a value's associated data.
fn aad(column: &str, event_id: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(column.len() + event_id.len() + 1);
    aad.extend_from_slice(column.as_bytes());
    aad.push(b'|');
    aad.extend_from_slice(event_id.as_bytes());
    aad
}

/// [`aad`] handed to `f` from the stack when it fits (every one the store builds: a column's
/// name and an id, timestamp and lane), so a seal on a tracking thread allocates only its output.
fn with_aad<R>(column: &str, event_id: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    let mut stack = [0u8; 128];
    let len = column.len() + 1 + event_id.len();
    match stack.get_mut(..len) {
        Some(out) => {
            let (head, tail) = out.split_at_mut(column.len());
            head.copy_from_slice(column.as_bytes());
            tail[0] = b'|';
            tail[1..].copy_from_slice(event_id.as_bytes());
            f(out)
        }
        None => f(&aad(column, event_id)),
    }
}

fn check_aad(key_id: u32) -> Vec<u8> {
    format!("keys.check|{key_id}").into_bytes()
}

/// The subkey for a nonce's first 16 bytes: HChaCha20 (20 rounds) of the key and them (as
/// XChaCha20-Poly1305 derives it), ready to seal or open with `aead`.
fn subkey(key: &[u8; KEY_BYTES], prefix: &[u8; PREFIX_BYTES], aead: Aead) -> LessSafeKey {
    keyed(&derive(key, prefix), aead)
}

/// HChaCha20 (20 rounds) of the key and a nonce's first 16 bytes.
fn derive(key: &[u8; KEY_BYTES], prefix: &[u8; PREFIX_BYTES]) -> [u8; KEY_BYTES] {
    chacha20::hchacha::<U10>(key.into(), prefix.into()).into()
}

fn keyed(derived: &[u8; KEY_BYTES], aead: Aead) -> LessSafeKey {
    LessSafeKey::new(
        UnboundKey::new(aead.algorithm(), derived).expect("a subkey is 32 bytes, as both AEADs'"),
    )
}

/// The 12-byte nonce under the subkey: four zero bytes, then the 24-byte nonce's last 8.
fn message_nonce(tail: &[u8; 8]) -> Nonce {
    let mut nonce = [0u8; 12];
    nonce[4..].copy_from_slice(tail);
    Nonce::assume_unique_for_key(nonce)
}

fn open_with(key: &[u8; KEY_BYTES], aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, Unreadable> {
    if sealed.len() < NONCE_BYTES + TAG_BYTES {
        return Err(Unreadable);
    }
    let (nonce, body) = sealed.split_at(NONCE_BYTES);
    let (prefix, tail) = nonce.split_at(PREFIX_BYTES);
    let prefix: &[u8; PREFIX_BYTES] = prefix.try_into().map_err(|_| Unreadable)?;
    let tail: &[u8; 8] = tail.try_into().map_err(|_| Unreadable)?;
    let derived = derive(key, prefix);
    for &aead in Aead::candidates(u64::from_le_bytes(*tail)) {
        let mut buf = body.to_vec();
        if let Ok(plain) =
            keyed(&derived, aead).open_in_place(message_nonce(tail), Aad::from(aad), &mut buf)
        {
            let plain_len = plain.len();
            buf.truncate(plain_len);
            return Ok(buf);
        }
    }
    Err(Unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setting::SettingValue;
    use rusqlite::types::ValueRef;

    fn sealed<'a>(s: &'a Stored<'_>) -> &'a [u8] {
        match s {
            Stored::Sealed(b) => b,
            Stored::Text(_) => panic!("not sealed"),
        }
    }

    #[test]
    fn a_sealed_value_opens_only_in_its_own_row_and_column_with_its_key() {
        let ring = Keyring::new(&EncryptionKeys::new([(2, [7; 32]), (1, [9; 32])]));
        let s = ring.seal("events.body", "id-1", "{\"secret\":1}");
        let b = sealed(&s);
        assert!(!b.windows(6).any(|w| w == b"secret"));
        assert_eq!(
            ring.open(2, "events.body", "id-1", ValueRef::Blob(b))
                .unwrap(),
            "{\"secret\":1}"
        );
        assert!(
            ring.open(2, "events.body", "id-2", ValueRef::Blob(b))
                .is_err()
        );
        assert!(
            ring.open(2, "quarantine.body", "id-1", ValueRef::Blob(b))
                .is_err()
        );
        assert!(
            ring.open(1, "events.body", "id-1", ValueRef::Blob(b))
                .is_err()
        );
        let mut flipped = b.to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(
            ring.open(2, "events.body", "id-1", ValueRef::Blob(&flipped))
                .is_err()
        );
        assert!(ring.verifies(1, &ring.check_record(1).unwrap()));
        assert!(!ring.verifies(2, &ring.check_record(1).unwrap()));
    }

    /// A reference AEAD (RustCrypto's) keyed as the format says for a value's 24-byte nonce,
    /// and the nonce it takes.
    type Reference<R> = dyn Fn(&[u8]) -> (R, Vec<u8>);

    const PLAIN: &str = "{\"name\":\"checkout\",\"cart_cents\":129900,\"items\":[1,2,3,4,5]}";

    /// What the reference seals under each of `nonces` opens with `ring`.
    fn opens_what_the_reference_sealed<R: chacha20poly1305::aead::Aead>(
        ring: &Keyring,
        nonces: &[[u8; NONCE_BYTES]],
        reference: &Reference<R>,
    ) {
        use chacha20poly1305::aead::{Payload, generic_array::GenericArray};
        let ad = aad("events.body", "id-7");
        for nonce in nonces {
            let (cipher, message_nonce) = reference(nonce);
            let payload = Payload {
                msg: PLAIN.as_bytes(),
                aad: &ad,
            };
            let mut theirs = nonce.to_vec();
            let sealed = cipher.encrypt(GenericArray::from_slice(&message_nonce), payload);
            theirs.extend(sealed.unwrap());
            let opened = ring.open(3, "events.body", "id-7", ValueRef::Blob(&theirs));
            assert_eq!(opened.ok().as_deref(), Some(PLAIN), "nonce {nonce:x?}");
        }
    }

    /// What `ring` seals, the store's seals and seals ahead, opens with the reference.
    fn the_reference_opens_what_it_seals<R: chacha20poly1305::aead::Aead>(
        ring: &Keyring,
        reference: &Reference<R>,
    ) {
        use chacha20poly1305::aead::{Payload, generic_array::GenericArray};
        let ad = aad("events.body", "id-7");
        for ahead in [false, true] {
            let ours = if ahead {
                ring.seal_ahead("events.body", "id-7", PLAIN).unwrap()
            } else {
                sealed(&ring.seal("events.body", "id-7", PLAIN)).to_vec()
            };
            let (nonce, body) = ours.split_at(NONCE_BYTES);
            let (cipher, message_nonce) = reference(nonce);
            let payload = Payload {
                msg: body,
                aad: &ad,
            };
            let opened = cipher.decrypt(GenericArray::from_slice(&message_nonce), payload);
            assert_eq!(opened.unwrap(), PLAIN.as_bytes(), "sealed ahead: {ahead}");
        }
    }

    /// The nonce's count as the format reads it.
    fn count_of(nonce: &[u8]) -> u64 {
        u64::from_le_bytes(nonce[PREFIX_BYTES..NONCE_BYTES].try_into().unwrap())
    }

    /// Rows sealed by RustCrypto's `XChaCha20Poly1305` (every store written before version 8)
    /// open, whatever their nonce, on a keyring of either AEAD, and what a ChaCha keyring
    /// seals opens with it: the same format. Older releases drew the whole nonce from the OS,
    /// so bit 62 (the AES mark) is as often set (0x57…) as not (0x17…).
    #[test]
    fn the_format_is_xchacha20_poly1305() {
        use chacha20poly1305::aead::KeyInit;
        let key = [0x42u8; KEY_BYTES];
        let keys = EncryptionKeys::new([(3, key)]);
        let reference = move |nonce: &[u8]| {
            let cipher = chacha20poly1305::XChaCha20Poly1305::new((&key).into());
            (cipher, nonce.to_vec())
        };
        let old = [[0x17u8; NONCE_BYTES], [0x57; NONCE_BYTES]];
        assert_eq!(count_of(&old[0]) & AES_MARK, 0);
        assert_ne!(count_of(&old[1]) & AES_MARK, 0);
        for aead in [Aead::ChaCha20Poly1305, Aead::Aes256Gcm] {
            let ring = Keyring::sealing_with(&keys, aead);
            opens_what_the_reference_sealed(&ring, &old, &reference);
        }
        let chacha = Keyring::sealing_with(&keys, Aead::ChaCha20Poly1305);
        the_reference_opens_what_it_seals(&chacha, &reference);
    }

    /// AES values: AES-256-GCM (RustCrypto's, as reference) under the subkey HChaCha20 gives
    /// for the nonce's first 16 bytes, with the 12-byte nonce `0000 ‖ count`, the count's bit
    /// 62 set. Values it seals open with ours, and ours open with it.
    #[test]
    fn the_aes_format_is_aes_256_gcm_under_the_subkey() {
        use aes_gcm::aead::KeyInit;
        let key = [0x42u8; KEY_BYTES];
        let ring = Keyring::sealing_with(&EncryptionKeys::new([(3, key)]), Aead::Aes256Gcm);
        let reference = move |nonce: &[u8]| {
            assert_ne!(count_of(nonce) & AES_MARK, 0, "an AES value is marked");
            let prefix: &[u8; PREFIX_BYTES] = nonce[..PREFIX_BYTES].try_into().unwrap();
            let derived = chacha20::hchacha::<U10>((&key).into(), prefix.into());
            let cipher = aes_gcm::Aes256Gcm::new_from_slice(&derived).unwrap();
            (cipher, [&[0u8; 4][..], &nonce[PREFIX_BYTES..]].concat())
        };
        let mut nonce = [0x17u8; NONCE_BYTES];
        nonce[PREFIX_BYTES..].copy_from_slice(&(AES_MARK | 5).to_le_bytes());
        opens_what_the_reference_sealed(&ring, &[nonce], &reference);
        the_reference_opens_what_it_seals(&ring, &reference);
    }

    /// A store holds rows of both AEADs (sealed before an upgrade, or on another CPU) and opens
    /// each by its mark, whatever its own keyring seals with; the key check records of either
    /// verify under the other. The mark is authenticated: flipped, a value does not open.
    #[test]
    fn each_value_opens_with_the_aead_that_sealed_it() {
        let keys = EncryptionKeys::new([(2, [7; 32])]);
        let chacha = Keyring::sealing_with(&keys, Aead::ChaCha20Poly1305);
        let aes = Keyring::sealing_with(&keys, Aead::Aes256Gcm);
        for (by, with) in [(&chacha, &aes), (&aes, &chacha), (&aes, &aes)] {
            let s = by.seal("events.body", "id-1", "{\"a\":1}");
            let ahead = by.seal_ahead("events.body", "id-1", "{\"a\":1}").unwrap();
            for value in [sealed(&s), &ahead[..]] {
                let opened = with.open(2, "events.body", "id-1", ValueRef::Blob(value));
                assert_eq!(opened.ok().as_deref(), Some("{\"a\":1}"));
                let mut flipped = value.to_vec();
                flipped[NONCE_BYTES - 1] ^= 0x40; // bit 62 of the little-endian count
                let opened = with.open(2, "events.body", "id-1", ValueRef::Blob(&flipped));
                assert!(opened.is_err(), "the mark flipped still opened");
            }
            assert!(with.verifies(2, &by.check_record(2).unwrap()));
        }
        let count = |ring: &Keyring| count_of(sealed(&ring.seal("events.body", "id", "x")));
        assert_eq!(count(&chacha) & AES_MARK, 0);
        assert_ne!(count(&aes) & AES_MARK, 0);
        let native = Keyring::new(&keys);
        assert_eq!(count(&native) & AES_MARK != 0, hardware_aes());
    }

    /// Every nonce a keyring makes is new, from either of its counters (the store's seals and
    /// the tracking threads' seals ahead), and two keyrings (two opens, two processes) draw
    /// their own random half. A seal ahead opens like any other.
    #[test]
    fn nonces_never_repeat_within_or_across_keyrings() {
        let keys = EncryptionKeys::new([(1, [5; KEY_BYTES])]);
        let (a, b) = (Keyring::new(&keys), Keyring::new(&keys));
        let chacha = Keyring::sealing_with(&keys, Aead::ChaCha20Poly1305);
        let aes = Keyring::sealing_with(&keys, Aead::Aes256Gcm);
        let mut seen = std::collections::HashSet::new();
        for ring in [&a, &b, &chacha, &aes] {
            for _ in 0..1_000 {
                let s = ring.seal("events.body", "id", "x");
                let ahead = ring.seal_ahead("events.body", "id", "x").unwrap();
                for nonce in [&sealed(&s)[..NONCE_BYTES], &ahead[..NONCE_BYTES]] {
                    assert!(seen.insert(nonce.to_vec()), "a nonce repeated");
                }
                let opened = ring.open(1, "events.body", "id", ValueRef::Blob(&ahead));
                assert_eq!(opened.ok().as_deref(), Some("x"));
            }
        }
        assert_ne!(a.prefix, b.prefix);
        assert!(
            Keyring::plain()
                .seal_ahead("events.body", "id", "x")
                .is_none()
        );
    }

    /// The associated data built on the stack is the bytes of [`aad`], and an id too long for
    /// the stack seals and opens the same way.
    #[test]
    fn the_associated_data_is_the_same_on_the_stack_and_past_it() {
        let ring = Keyring::new(&EncryptionKeys::new([(1, [3; KEY_BYTES])]));
        for id in [
            "id-7".to_string(),
            "x".repeat(116),
            "x".repeat(117),
            "y".repeat(300),
        ] {
            let built = with_aad("events.body", &id, |a| a.to_vec());
            assert_eq!(built, aad("events.body", &id), "{} bytes", id.len());
            let s = ring.seal("events.body", &id, "{}");
            let opened = ring.open(1, "events.body", &id, ValueRef::Blob(sealed(&s)));
            assert_eq!(opened.ok().as_deref(), Some("{}"));
        }
    }

    #[test]
    fn keys_parse_from_text_and_errors_never_show_the_key() {
        let hex = "ab".repeat(32);
        let keys = EncryptionKeys::parse("encryption_keys", &format!("3:{hex}, 1:{hex}")).unwrap();
        assert_eq!(keys.ids(), [3, 1]);
        assert!(!format!("{keys:?}").contains("abab"));
        let e = EncryptionKeys::parse("encryption_keys", &format!("3:{}", &hex[..60])).unwrap_err();
        assert!(e.to_string().contains("key id 3"), "{e}");
        assert!(!e.to_string().contains("abab"), "{e}");
        assert!(EncryptionKeys::new([(0, [1; 32])]).validate().is_err());
        assert!(
            EncryptionKeys::new([(4, [1; 32]), (4, [2; 32])])
                .validate()
                .is_err()
        );
        let e = EncryptionKeys::from_slices([(5, &[1u8; 16][..])]).unwrap_err();
        assert!(e.to_string().contains("key id 5"), "{e}");
    }
}
