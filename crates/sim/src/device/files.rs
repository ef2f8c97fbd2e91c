//! What the store's files hold, read byte for byte: the payload marker every simulated event
//! carries, and event ids (UUIDs, in the clear in every row, sealed store or not). The oracles
//! that promise bytes are gone (a denial) or never written in plain text (a sealed store) read
//! them here.

use std::collections::HashMap;
use std::io::Read;

use super::Device;

/// The payload marker every simulated event carries (`Device::payload`), followed by its index.
const MARKER: &[u8] = b"SIMPAYLOAD-";

/// A hyphenated UUID's length, and where its hyphens are.
const UUID_LEN: usize = 36;
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

/// The device's files as read once, by name: each scan below reads the same bytes.
pub(super) struct Files(Vec<(String, Vec<u8>)>);

impl Device {
    /// Every file of the device's directory (the database, its WAL, anything else SQLite left).
    pub(super) fn files(&self) -> Files {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Files(Vec::new());
        };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let mut bytes = Vec::new();
            if std::fs::File::open(&path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .is_ok()
            {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                out.push((name.into_owned(), bytes));
            }
        }
        Files(out)
    }
}

impl Files {
    /// The first payload marker whose event `hit` says must not be there: (file name, event
    /// index).
    pub(super) fn payload(&self, hit: impl Fn(usize) -> bool) -> Result<(), (String, usize)> {
        let finder = memchr::memmem::Finder::new(MARKER);
        for (name, bytes) in &self.0 {
            for pos in finder.find_iter(bytes) {
                let digits: String = bytes[pos + MARKER.len()..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .map(|b| *b as char)
                    .collect();
                if let Ok(idx) = digits.parse::<usize>()
                    && hit(idx)
                {
                    return Err((name.clone(), idx));
                }
            }
        }
        Ok(())
    }

    /// The first event id whose event `hit` says must not be there: (file name, event index).
    /// Only ids of events the app tracked (`by_id`) count.
    pub(super) fn ids(
        &self,
        by_id: &HashMap<String, usize>,
        hit: impl Fn(usize) -> bool,
    ) -> Result<(), (String, usize)> {
        for (name, bytes) in &self.0 {
            for id in ids_in(bytes) {
                if let Some(&idx) = by_id.get(id)
                    && hit(idx)
                {
                    return Err((name.clone(), idx));
                }
            }
        }
        Ok(())
    }
}

/// Every hyphenated lower-case UUID in `bytes`, found from its first hyphen.
fn ids_in(bytes: &[u8]) -> impl Iterator<Item = &str> {
    memchr::memchr_iter(b'-', bytes).filter_map(move |pos| {
        let start = pos.checked_sub(HYPHENS[0])?;
        let id = bytes.get(start..start + UUID_LEN)?;
        let shaped = id
            .iter()
            .enumerate()
            .all(|(i, b)| match HYPHENS.contains(&i) {
                true => *b == b'-',
                false => b.is_ascii_digit() || (b'a'..=b'f').contains(b),
            });
        shaped.then(|| std::str::from_utf8(id).ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::ids_in;

    #[test]
    fn ids_are_found_wherever_they_sit() {
        let bytes = b"\x00\x0101a248f0-652b-7047-925e-44ae5107ec98{\"x\":\"2026-12-06\"}\
                      01a248f0-6535-7731-87ea-00b5170fac5e";
        let found: Vec<&str> = ids_in(bytes).collect();
        assert_eq!(
            found,
            [
                "01a248f0-652b-7047-925e-44ae5107ec98",
                "01a248f0-6535-7731-87ea-00b5170fac5e"
            ]
        );
    }
}
