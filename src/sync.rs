//! The crate's one way to take a mutex. Its own module, below everything: the queue, the store,
//! the fleet loop and the observers all lock, and none of them should import the shared state
//! to do it.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex even if a panicking thread poisoned it: every structure behind these locks is
/// left consistent between statements, and a caught panic must not wedge the app's `track()`.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
