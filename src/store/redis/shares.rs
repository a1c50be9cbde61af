//! Shares' fingerprints in Redis (`shares.lua`): the definition a share's
//! first process wrote, which every other process compares with its own.

use fred::types::Value;

use super::RedisStore;
use crate::store::StoreError;

/// Writes a share's fingerprint when absent and reads it (KEYS, ARGV in
/// the file).
pub const SHARES: &str = include_str!("shares.lua");

/// How long a fingerprint stays unchecked before it lapses: a day, so a
/// share whose definition the whole fleet changed stops warning within a
/// day of its last process with the old numbers.
pub const FINGERPRINT_TTL_MS: u64 = 86_400_000;

impl RedisStore {
    /// The fingerprint Redis holds at `key`, after writing `fingerprint`
    /// there when nothing was.
    ///
    /// # Errors
    /// Redis cannot answer, or answers something other than text.
    pub async fn share_fingerprint(
        &self,
        key: &str,
        fingerprint: &str,
    ) -> Result<String, StoreError> {
        let ttl = Value::from(FINGERPRINT_TTL_MS.to_string());
        let v = self
            .eval(SHARES, &[key], vec![fingerprint.into(), ttl])
            .await?;
        match v {
            Value::String(s) => Ok(s.to_string()),
            Value::Bytes(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(StoreError::Protocol(format!("share fingerprint {other:?}"))),
        }
    }
}
