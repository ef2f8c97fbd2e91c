//! Fault points for the crate's own tests (feature `test-util`, never in an app's build): the
//! moments of README §Consent that a test cannot otherwise reach on purpose, between the denial
//! being recorded and the kept events being deleted, and a deletion that fails.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

type Hook = Box<dyn Fn() + Send + Sync>;

static BETWEEN_RECORD_AND_DELETE: Mutex<Option<Hook>> = Mutex::new(None);
static FAILING_DELETES: Mutex<Vec<(PathBuf, u32)>> = Mutex::new(Vec::new());

fn lock<T>(m: &'static Mutex<T>) -> std::sync::MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `hook` in every `set_consent(Denied)` of this process after the denial is recorded in
/// the store and before the kept events are deleted: a crash test's child blocks there and is
/// killed.
pub fn between_denial_record_and_delete(hook: impl Fn() + Send + Sync + 'static) {
    *lock(&BETWEEN_RECORD_AND_DELETE) = Some(Box::new(hook));
}

/// The next `times` deletions of a denial (README §Consent) on the store at `db` fail with a
/// storage error, before anything is deleted.
pub fn fail_consent_deletes(db: &Path, times: u32) {
    let mut failing = lock(&FAILING_DELETES);
    failing.retain(|(path, _)| path != db);
    failing.push((db.to_path_buf(), times));
}

pub(crate) fn denial_recorded() {
    if let Some(hook) = lock(&BETWEEN_RECORD_AND_DELETE).as_ref() {
        hook();
    }
}

/// Whether this deletion on the store at `db` is one a test asked to fail.
pub(crate) fn consent_delete_fails(db: &Path) -> bool {
    let mut failing = lock(&FAILING_DELETES);
    match failing
        .iter_mut()
        .find(|(path, left)| path == db && *left > 0)
    {
        Some((_, left)) => {
            *left -= 1;
            true
        }
        None => false,
    }
}
