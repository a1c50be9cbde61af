//! `exempt:` at the top level and per route: client addresses (CIDR or
//! single addresses, as `trusted_proxies` takes them) and API keys whose
//! requests the route's limits do not count. A route's own `exempt:`
//! replaces the top level's, as its `cors:` does; `exempt: {}` on a route
//! exempts nobody there.

use std::sync::Arc;

use super::callers::parse_ip_net;
use super::check::{Check, Checked, text};
use crate::config::file::{self, Text};
use crate::config::position::child_key;
use crate::config::{Exempt, Route};

impl Check<'_> {
    pub(super) fn exempt(&mut self, exempt: &file::Exempt, path: &str) -> Checked<Exempt> {
        let ips = self.optional(
            &exempt.ips,
            &child_key(path, "ips"),
            |check, items, path| check.each(items, path, text(parse_ip_net)),
        );
        let api_keys = self.optional(
            &exempt.api_keys,
            &child_key(path, "api_keys"),
            |check, items, path| check.each(items, path, api_key),
        );
        Ok(Exempt {
            ips: ips?.unwrap_or_default(),
            api_keys: api_keys?.unwrap_or_default(),
        })
    }
}

fn api_key(check: &mut Check<'_>, key: &Text, path: &str) -> Checked<Box<[u8]>> {
    if key.0.is_empty() {
        return Err(check.value_error(path, "an API key cannot be empty"));
    }
    Ok(key.0.as_bytes().into())
}

/// Gives every route without an `exempt:` of its own the top level's.
pub(super) fn inherit(routes: &mut [Route], top: Option<&Arc<Exempt>>) {
    for route in routes.iter_mut().filter(|r| r.exempt.is_none()) {
        route.exempt = top.cloned();
    }
}
