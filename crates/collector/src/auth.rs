//! Per-project API keys: which project a request belongs to, or a 401.
//!
//! A key file holds one `PROJECT KEY` pair a line (`#` starts a comment). The project names
//! the dedup scope downstream (`project:event_id`), so two apps that happen to send the same
//! id never drop each other's events. Keys are compared in constant time over their SHA-256
//! digests: neither a key's bytes nor its length leak through the answer's timing, and every
//! configured key is compared on every request, so neither does which one matched.

use std::path::Path;

use subtle::{Choice, ConstantTimeEq};

/// The project of requests when no keys are configured.
pub const DEFAULT_PROJECT: &str = "default";
/// Longest project name: it goes into every stream message id.
const MAX_PROJECT_BYTES: usize = 64;

/// The keys a collector accepts, each with its project.
#[derive(Clone)]
pub struct ApiKeys {
    keys: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for ApiKeys {
    /// Projects only: a key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let projects: Vec<&str> = self.keys.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("ApiKeys")
            .field("projects", &projects)
            .finish()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Whether a project name can be part of a stream message id and a subject token.
pub fn valid_project(project: &str) -> bool {
    !project.is_empty()
        && project.len() <= MAX_PROJECT_BYTES
        && project
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl ApiKeys {
    /// From `(project, key)` pairs; names the first pair that cannot be used.
    pub fn new<P: Into<String>, K: AsRef<[u8]>>(
        pairs: impl IntoIterator<Item = (P, K)>,
    ) -> Result<ApiKeys, String> {
        let mut keys = Vec::new();
        for (project, key) in pairs {
            let project = project.into();
            if !valid_project(&project) {
                return Err(format!(
                    "project {project:?}: 1 to {MAX_PROJECT_BYTES} of A-Z a-z 0-9 - _"
                ));
            }
            let key = key.as_ref();
            if key.len() < 16 {
                return Err(format!("project {project}: a key needs at least 16 bytes"));
            }
            keys.push((project, digest(key)));
        }
        if keys.is_empty() {
            return Err("no key given".into());
        }
        Ok(ApiKeys { keys })
    }

    /// Reads a key file: `PROJECT KEY` a line, blank lines and `#` comments skipped.
    pub fn from_file(path: &Path) -> Result<ApiKeys, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("key file {}: {e}", path.display()))?;
        let mut pairs = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some(project), Some(key), None) => {
                    pairs.push((project.to_owned(), key.to_owned()))
                }
                _ => {
                    return Err(format!(
                        "key file {} line {}: expected `PROJECT KEY`",
                        path.display(),
                        n + 1
                    ));
                }
            }
        }
        ApiKeys::new(pairs).map_err(|e| format!("key file {}: {e}", path.display()))
    }

    /// The project of a `Bearer` token, comparing it with every key.
    pub fn project_of(&self, authorization: Option<&str>) -> Option<&str> {
        let token = bearer_token(authorization)?;
        let presented = digest(token.as_bytes());
        let mut found: Option<&str> = None;
        for (project, key) in &self.keys {
            let hit: Choice = presented.ct_eq(key);
            if bool::from(hit) && found.is_none() {
                found = Some(project);
            }
        }
        found
    }
}

/// The token of `Authorization: Bearer <token>`.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// `Authorization: Bearer <key>` against one key, in constant time (the reference collector's
/// `required_api_key`).
pub fn bearer_matches(authorization: Option<&str>, key: &str) -> bool {
    bearer_token(authorization)
        .is_some_and(|token| bool::from(digest(token.as_bytes()).ct_eq(&digest(key.as_bytes()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_project_and_nothing_else_passes() {
        let keys =
            ApiKeys::new([("shop", "k-shop-0123456789"), ("blog", "k-blog-0123456789")]).unwrap();
        assert_eq!(
            keys.project_of(Some("Bearer k-blog-0123456789")),
            Some("blog")
        );
        assert_eq!(
            keys.project_of(Some("bearer  k-shop-0123456789 ")),
            Some("shop")
        );
        assert_eq!(keys.project_of(Some("Bearer k-shop-012345678")), None);
        assert_eq!(keys.project_of(Some("Basic k-shop-0123456789")), None);
        assert_eq!(keys.project_of(None), None);
        assert!(ApiKeys::new([("a b", "0123456789abcdef")]).is_err());
        assert!(ApiKeys::new([("a", "short")]).is_err());
        assert!(format!("{keys:?}").contains("shop") && !format!("{keys:?}").contains("k-shop"));
        assert!(bearer_matches(Some("Bearer k1"), "k1"));
        assert!(!bearer_matches(Some("Bearer k2"), "k1"));
    }
}
