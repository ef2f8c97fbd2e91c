//! The queue's door to the fleet loop's tables (src/fleet): the store stays the queue's alone;
//! without one (memory only) nothing persists and these calls keep nothing.

use super::Queue;
use crate::error::Result;

impl Queue {
    pub fn fleet_get(&self, name: &str) -> Result<Option<String>> {
        match &self.store {
            Some(store) => store.meta(name),
            None => Ok(None),
        }
    }

    pub fn fleet_put(&self, name: &str, value: &str) -> Result<()> {
        match &self.store {
            Some(store) => store.set_meta(name, value),
            None => Ok(()),
        }
    }

    pub fn fleet_delete(&self, name: &str) -> Result<()> {
        match &self.store {
            Some(store) => store.delete_meta(name),
            None => Ok(()),
        }
    }

    pub fn reports(&self) -> Result<Vec<(u64, String)>> {
        match &self.store {
            Some(store) => store.reports(),
            None => Ok(Vec::new()),
        }
    }

    pub fn report_add(&self, id: u64, body: &str) -> Result<()> {
        match &self.store {
            Some(store) => store.report_add(id, body),
            None => Ok(()),
        }
    }

    pub fn reports_delete(&self, ids: &[u64]) -> Result<()> {
        match &self.store {
            Some(store) => store.reports_delete(ids),
            None => Ok(()),
        }
    }
}
