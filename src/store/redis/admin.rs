//! The admin API's side of Redis: the overrides hash and the generation
//! counter gateways watch (`admin.lua`), and counters reset (`reset.lua`).
//! Each call is one `EVAL`, bounded by the store's timeout like a decision.

use fred::types::Value;

use super::RedisStore;
use super::clients::slot_groups;
use crate::store::StoreError;
use crate::store::keys;

/// The overrides hash and its generation counter (KEYS, ARGV in the file).
pub const ADMIN: &str = include_str!("admin.lua");
/// Deletes counter keys of one slot (KEYS in the file).
pub const RESET: &str = include_str!("reset.lua");

/// The overrides as Redis holds them: the generation they belong to and
/// every field with its JSON value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    /// The generation counter when they were read.
    pub generation: i64,
    /// `(id, JSON)` pairs.
    pub entries: Vec<(String, String)>,
}

impl RedisStore {
    async fn admin_call(&self, prefix: &str, args: Vec<Value>) -> Result<Value, StoreError> {
        let (hash, generation) = (keys::overrides(prefix), keys::admin_generation(prefix));
        self.eval(ADMIN, &[&hash, &generation], args).await
    }

    /// The generation counter of `prefix`'s overrides (0 before any write).
    ///
    /// # Errors
    /// Redis cannot answer, or answers something other than an integer.
    pub async fn admin_generation(&self, prefix: &str) -> Result<i64, StoreError> {
        let v = self.admin_call(prefix, vec!["gen".into()]).await?;
        integer(&v).ok_or_else(|| StoreError::Protocol(format!("generation {v:?}")))
    }

    /// Every override with the generation they were read at.
    ///
    /// # Errors
    /// Redis cannot answer, or answers something other than the list.
    pub async fn overrides(&self, prefix: &str) -> Result<Listed, StoreError> {
        let v = self.admin_call(prefix, vec!["list".into()]).await?;
        let Value::Array(items) = v else {
            return Err(StoreError::Protocol("overrides: not a list".into()));
        };
        let mut items = items.into_iter();
        let generation = items
            .next()
            .as_ref()
            .and_then(integer)
            .ok_or_else(|| StoreError::Protocol("overrides: no generation".into()))?;
        let mut entries = Vec::new();
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            if let (Some(k), Some(v)) = (text(k), text(v)) {
                entries.push((k, v));
            }
        }
        Ok(Listed {
            generation,
            entries,
        })
    }

    /// Sets override `id` to `json`; the value it replaced.
    ///
    /// # Errors
    /// Redis cannot answer.
    pub async fn put_override(
        &self,
        prefix: &str,
        id: &str,
        json: &str,
    ) -> Result<Option<String>, StoreError> {
        let v = self
            .admin_call(prefix, vec!["put".into(), id.into(), json.into()])
            .await?;
        Ok(text(v))
    }

    /// Removes override `id`; the value removed, if it was there.
    ///
    /// # Errors
    /// Redis cannot answer.
    pub async fn remove_override(
        &self,
        prefix: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        let v = self
            .admin_call(prefix, vec!["del".into(), id.into()])
            .await?;
        Ok(text(v))
    }

    /// Deletes counter `keys` (one `EVAL` per slot), then bumps the
    /// generation so every gateway forgets its denials; how many keys
    /// existed.
    ///
    /// # Errors
    /// Redis cannot answer; keys of slots already called stay deleted.
    pub async fn reset_keys(&self, prefix: &str, keys: &[String]) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for group in slot_groups(self.is_clustered(), keys.iter().map(String::as_str)) {
            let of_slot: Vec<&str> = group.iter().map(|&i| keys[i].as_str()).collect();
            let v = self.eval(RESET, &of_slot, Vec::new()).await?;
            deleted += integer(&v).and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        }
        self.admin_call(prefix, vec!["bump".into()]).await?;
        Ok(deleted)
    }
}

fn integer(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(n) => Some(*n),
        Value::String(s) => s.parse().ok(),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.to_string()),
        Value::Bytes(b) => String::from_utf8(b.to_vec()).ok(),
        _ => None,
    }
}
