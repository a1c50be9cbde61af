//! [`StoreKey`], a limit request's store key.
//!
//! A request builds one key per limit and drops it when decided. Held in
//! the request itself up to [`INLINE`] bytes — a key for an IPv4 or IPv6
//! identity with short route and limit names, or a digested key — it costs
//! no allocation and no free; longer keys go to the heap. The bytes are
//! those the key's text would have as a `String`: Redis, `sync` mode and
//! the in-process store see the same key.

use std::fmt;

use smallvec::SmallVec;

/// Bytes of a key held in the request itself.
pub const INLINE: usize = 48;

/// A store key: `<prefix>{<identity>}<limit>` (see
/// [`keys::counter_key`](crate::store::keys::counter_key)). Written from
/// text only, so its bytes are always UTF-8.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreKey(SmallVec<[u8; INLINE]>);

impl StoreKey {
    /// An empty key with room for `bytes` (on the heap past [`INLINE`]).
    pub fn with_capacity(bytes: usize) -> Self {
        Self(SmallVec::with_capacity(bytes))
    }

    /// Appends `s`.
    #[inline]
    pub fn push_str(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    /// Appends `c`.
    #[inline]
    pub fn push(&mut self, c: char) {
        match u8::try_from(c) {
            Ok(b) if b.is_ascii() => self.0.push(b),
            _ => self.push_str(c.encode_utf8(&mut [0; 4])),
        }
    }

    /// The key's bytes, as Redis and the in-process store read them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The key's text (its bytes checked: for logs, the admin API and
    /// tests, not the decision's path).
    pub fn as_str(&self) -> &str {
        // Written from `&str`s and `char`s only: never empty for a
        // non-empty key.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The key's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for StoreKey {
    fn from(s: &str) -> Self {
        Self(SmallVec::from_slice(s.as_bytes()))
    }
}

impl From<String> for StoreKey {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl From<&String> for StoreKey {
    fn from(s: &String) -> Self {
        Self::from(s.as_str())
    }
}

impl From<&StoreKey> for String {
    fn from(k: &StoreKey) -> Self {
        k.as_str().to_owned()
    }
}

impl AsRef<[u8]> for StoreKey {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq<str> for StoreKey {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for StoreKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Write for StoreKey {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_the_bytes_of_its_text() {
        let mut k = StoreKey::with_capacity(8);
        k.push_str("tollgate:{ip=10.0.0.1/32}");
        k.push(':');
        k.push('é');
        assert_eq!(k.as_str(), "tollgate:{ip=10.0.0.1/32}:é");
        assert_eq!(k.as_bytes(), "tollgate:{ip=10.0.0.1/32}:é".as_bytes());
        assert_eq!(k, *"tollgate:{ip=10.0.0.1/32}:é");
    }

    #[test]
    fn a_long_key_goes_to_the_heap() {
        let text = "k".repeat(INLINE * 3);
        let mut k = StoreKey::default();
        for _ in 0..3 {
            k.push_str(&text[..INLINE]);
        }
        assert_eq!(k.as_str(), text);
        assert_eq!(k, StoreKey::from(text.as_str()));
    }
}
