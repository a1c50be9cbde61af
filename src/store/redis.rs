//! Redis store (to be written).
use super::{Store, StoreError};
use crate::limit::{Decision, LimitRequest};

/// Redis-backed store.
#[derive(Debug)]
pub struct RedisStore;

impl Store for RedisStore {
    async fn decide(&self, _now_ms: u64, _requests: &[LimitRequest]) -> Result<Decision, StoreError> {
        Err(StoreError::Unavailable("todo".into()))
    }
}
