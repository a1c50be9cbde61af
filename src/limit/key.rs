//! A counter's key as a decision carries it to a store ([`StoreKey`]),
//! and the numbers that name a limit's prefix and suffix in one
//! ([`limit_id`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::sync::{LazyLock, Mutex, PoisonError};

use ipnet::IpNet;

/// The store key of one caller and one limit, as a decision carries it:
/// its text (`store::keys::counter_key`), or, for a limit keyed by the
/// client IP alone and counted in process, the limit's number and the
/// caller's address. The in-process store hashes and compares the second
/// as a few bytes ([`StoreKey::Address`]); its text is written only where
/// something reads it ([`StoreKey::text`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreKey {
    /// The key's text: `<prefix>{<identity>}<suffix>`.
    Text(String),
    /// `<prefix>{ip=<net>}<suffix>` where `limit` names the prefix and
    /// the suffix ([`limit_id`]): made only for the in-process store,
    /// which alone reads it without its text.
    Address {
        /// The limit's prefix and suffix, by their number.
        limit: u32,
        /// The caller's address, grouped.
        net: IpNet,
    },
}

impl Default for StoreKey {
    fn default() -> Self {
        Self::Text(String::new())
    }
}

impl From<String> for StoreKey {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<&str> for StoreKey {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl StoreKey {
    /// The key's text, written out for an [`StoreKey::Address`].
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Self::Text(t) => Cow::Borrowed(t),
            Self::Address { limit, net } => {
                let (prefix, suffix) = limit_text(*limit);
                let mut out = String::with_capacity(prefix.len() + 24 + suffix.len());
                out.push_str(&prefix);
                out.push('{');
                // `ip=<net>` as `identity::write_key` writes it, the
                // address by `IpNet`'s `Display`.
                let _ = write!(out, "ip={net}");
                out.push('}');
                out.push_str(&suffix);
                Cow::Owned(out)
            }
        }
    }

    /// The key's text when it holds it.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(t) => Some(t),
            Self::Address { .. } => None,
        }
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// Every prefix and suffix pair a configuration of this process has
/// keyed a limit by, numbered in the order met: the numbers stay the same
/// across reloads, so an in-process counter outlives a reload that keeps
/// its limit, and no two pairs share one.
#[derive(Default)]
struct LimitNames {
    ids: HashMap<(String, String), u32>,
    texts: Vec<(String, String)>,
}

static LIMIT_NAMES: LazyLock<Mutex<LimitNames>> = LazyLock::new(Mutex::default);

/// The number of `prefix` and `suffix` together (see [`LimitNames`]);
/// read when a configuration is loaded, not per request. `None` past
/// four billion names, whose keys are then written out.
pub fn limit_id(prefix: &str, suffix: &str) -> Option<u32> {
    let mut names = LIMIT_NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let pair = (prefix.to_owned(), suffix.to_owned());
    if let Some(&id) = names.ids.get(&pair) {
        return Some(id);
    }
    let id = u32::try_from(names.texts.len()).ok()?;
    names.texts.push(pair.clone());
    names.ids.insert(pair, id);
    Some(id)
}

/// The prefix and suffix numbered `id` by [`limit_id`].
fn limit_text(id: u32) -> (String, String) {
    let names = LIMIT_NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    usize::try_from(id)
        .ok()
        .and_then(|i| names.texts.get(i))
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_keeps_its_number_and_an_address_key_reads_as_text() {
        let id = limit_id("tg:", ":key-tests:per_ip").unwrap();
        assert_eq!(limit_id("tg:", ":key-tests:per_ip"), Some(id));
        assert_ne!(limit_id("tg2:", ":key-tests:per_ip"), Some(id));
        assert_ne!(limit_id("tg:", ":key-tests:per_ip2"), Some(id));
        let key = StoreKey::Address {
            limit: id,
            net: "2001:db8::/64".parse().unwrap(),
        };
        assert_eq!(key.text(), "tg:{ip=2001:db8::/64}:key-tests:per_ip");
        assert_eq!(key.as_text(), None);
        let text = StoreKey::from("tg:{ip=192.0.2.7/32}:a:b");
        assert_eq!(text.as_text(), Some("tg:{ip=192.0.2.7/32}:a:b"));
        assert!(matches!(text.text(), Cow::Borrowed(_)));
    }
}
