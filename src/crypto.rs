//! Encryption at rest: the keys an app supplies ([`EncryptionKeys`], config `encryption_keys`)
//! and the sealing the store applies to every payload it writes (queued bodies, and the body,
//! reason and detail of quarantined events).
//!
//! The AEAD is XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`): its 24-byte nonce is safe
//! to draw at random for every row, so no nonce counter has to survive crashes or be shared
//! between processes, and it is fast in software on phones whose CPUs lack AES instructions.
//! Each sealed value is `nonce ‖ ciphertext ‖ tag`; the associated data names the column and
//! the event id, so a ciphertext moved to another row or column fails authentication instead of
//! being read as someone else's payload.
//!
//! Every row records the id of the key that sealed it (0: written in plain text, by a release
//! without encryption or before a key was supplied). The first key of `encryption_keys` seals
//! new rows; the others only open old ones, which is how keys are rotated.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

use crate::error::ConfigError;

/// Bytes of a key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the random nonce in front of every sealed value.
const NONCE_BYTES: usize = 24;
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

/// The keys ready for sealing and opening.
pub(crate) struct Keyring {
    /// The current key first.
    ciphers: Vec<(u32, XChaCha20Poly1305)>,
}

impl Keyring {
    pub fn new(keys: &EncryptionKeys) -> Keyring {
        Keyring {
            ciphers: keys
                .keys
                .iter()
                .map(|(id, key)| {
                    (
                        *id,
                        XChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(key)),
                    )
                })
                .collect(),
        }
    }

    /// No keys: rows are written in plain text (key id 0).
    pub fn plain() -> Keyring {
        Keyring {
            ciphers: Vec::new(),
        }
    }

    /// The id new rows get: the current key's, or 0 for plain text.
    pub fn current_id(&self) -> u32 {
        self.ciphers.first().map(|(id, _)| *id).unwrap_or(0)
    }

    pub fn has(&self, key_id: u32) -> bool {
        self.ciphers.iter().any(|(id, _)| *id == key_id)
    }

    pub fn ids(&self) -> Vec<u32> {
        self.ciphers.iter().map(|(id, _)| *id).collect()
    }

    fn cipher(&self, key_id: u32) -> Option<&XChaCha20Poly1305> {
        self.ciphers
            .iter()
            .find(|(id, _)| *id == key_id)
            .map(|(_, c)| c)
    }

    /// Seals `plain` for the column `column` of the row of `event_id` with the current key;
    /// without keys, the text as is.
    pub fn seal<'a>(&self, column: &str, event_id: &str, plain: &'a str) -> Stored<'a> {
        match self.ciphers.first() {
            None => Stored::Text(plain),
            Some((_, cipher)) => {
                Stored::Sealed(seal_with(cipher, &aad(column, event_id), plain.as_bytes()))
            }
        }
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
                let cipher = self.cipher(id).ok_or(Unreadable)?;
                let plain = open_with(cipher, &aad(column, event_id), b)?;
                String::from_utf8(plain).map_err(|_| Unreadable)
            }
            _ => Err(Unreadable),
        }
    }

    /// The record that proves, at the next open, that key `key_id` is the one it was.
    pub fn check_record(&self, key_id: u32) -> Option<Vec<u8>> {
        self.cipher(key_id)
            .map(|c| seal_with(c, &check_aad(key_id), CHECK_TEXT))
    }

    /// Whether `record` was made by the supplied key `key_id`.
    pub fn verifies(&self, key_id: u32, record: &[u8]) -> bool {
        self.cipher(key_id)
            .and_then(|c| open_with(c, &check_aad(key_id), record).ok())
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

fn aad(column: &str, event_id: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(column.len() + event_id.len() + 1);
    aad.extend_from_slice(column.as_bytes());
    aad.push(b'|');
    aad.extend_from_slice(event_id.as_bytes());
    aad
}

fn check_aad(key_id: u32) -> Vec<u8> {
    format!("keys.check|{key_id}").into_bytes()
}

fn seal_with(cipher: &XChaCha20Poly1305, aad: &[u8], plain: &[u8]) -> Vec<u8> {
    let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
    // Encryption fails only for messages beyond the cipher's limit (256 GiB), far above
    // `max_event_bytes`.
    let sealed = cipher
        .encrypt(&nonce, Payload { msg: plain, aad })
        .expect("an event is far below the AEAD's message limit");
    let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&sealed);
    out
}

fn open_with(cipher: &XChaCha20Poly1305, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, Unreadable> {
    if sealed.len() < NONCE_BYTES {
        return Err(Unreadable);
    }
    let (nonce, body) = sealed.split_at(NONCE_BYTES);
    cipher
        .decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad })
        .map_err(|_| Unreadable)
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
