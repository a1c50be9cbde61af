//! Which of a caller's values a decision looks up ([`Sources`]): the
//! client IP always, the API key and the user only where something reads
//! them.

use crate::config::{KeySource, KeySpec};

/// Which of a caller's values a decision reads besides the client IP, so
/// that the others are not looked up: an application's layer whose limits
/// count by IP has no use for the API key's header or a JWT. The gateway
/// reads them all: its access log names the strongest identity a caller
/// presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// The API key (its header, or `Authorization: Bearer`).
    pub api_key: bool,
    /// The user (a verified JWT's or a trusted peer's header) and the
    /// plan a JWT's claim or a header names.
    pub user: bool,
}

impl Sources {
    /// Every value.
    pub const ALL: Self = Self {
        api_key: true,
        user: true,
    };

    /// The values keys written by `specs` read: an API key for
    /// `api_key`, a user for `user`.
    pub fn of_keys<'k>(specs: impl IntoIterator<Item = &'k KeySpec>) -> Self {
        let mut read = Self {
            api_key: false,
            user: false,
        };
        for source in specs.into_iter().flat_map(|s| s.parts.iter().flatten()) {
            match source {
                KeySource::ApiKey => read.api_key = true,
                KeySource::User => read.user = true,
                KeySource::Ip | KeySource::Header(_) | KeySource::Route | KeySource::Json(_) => {}
            }
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use http::{HeaderMap, HeaderValue};

    use super::*;
    use crate::config::{ApiKeyConfig, ClientIpConfig, PlansFrom, UserConfig};
    use crate::identity::{IdentityConfig, caller, caller_reading};

    fn spec(parts: Vec<Vec<KeySource>>) -> KeySpec {
        KeySpec { parts }
    }

    #[test]
    fn a_caller_read_in_part_lacks_only_what_was_left_out() {
        let (client_ip, api_keys, users) = (
            ClientIpConfig::default(),
            ApiKeyConfig::default(),
            UserConfig::default(),
        );
        let cfg = IdentityConfig {
            client_ip: &client_ip,
            api_keys: &api_keys,
            users: &users,
            plans_from: &PlansFrom::ApiKey,
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("k1"));
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        let all = caller(cfg, peer, &headers);
        assert_eq!(all.api_key, Some(&b"k1"[..]));
        let read = |api_key, user| caller_reading(cfg, peer, &headers, Sources { api_key, user });
        assert_eq!(read(true, false).api_key, Some(&b"k1"[..]));
        let ip_only = read(false, false);
        assert_eq!(ip_only.api_key, None);
        assert_eq!(ip_only.ip, all.ip);

        let by = |sources: Vec<KeySource>| Sources::of_keys([&spec(vec![sources])]);
        assert_eq!(
            by(vec![KeySource::Ip]),
            Sources {
                api_key: false,
                user: false
            }
        );
        assert_eq!(
            by(vec![KeySource::User, KeySource::ApiKey, KeySource::Ip]),
            Sources::ALL
        );
    }
}
