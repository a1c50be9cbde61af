//! The listener side of the file: `listen` (addresses and TLS), `server`
//! (connection caps, header, target and body sizes, `server.path`),
//! `timeouts` and `access_log`. Their defaults live beside their types:
//! [`ServerSettings`], [`PathRules`] and [`Timeouts`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::check::{Check, Checked, int, names, parse_timeout, spelled, text};
use crate::config::file::{self, Field, Text};
use crate::config::position::child_key;
use crate::config::{AccessLog, Http1, Listen, ServerSettings, Timeouts};
use crate::target::{EscapedSlashes, PathRules};

/// What `admin` holds: the address, the token, the folder of reports.
type AdminParts = (SocketAddr, Option<Arc<str>>, Option<PathBuf>);

impl Check<'_> {
    /// One `listen` entry: an address, or `{ addr, tls: { cert, key } }`.
    pub(super) fn listen(&mut self, item: &file::Listen, path: &str) -> Checked<Listen> {
        let map = match item {
            file::Listen::Addr(t) => {
                return text(parse_socket_addr)(self, t, path).map(Listen::from);
            }
            file::Listen::Map(map) => map,
        };
        let addr = self.required(&map.addr, path, "addr", text(parse_socket_addr));
        let tls = self.optional(&map.tls, &child_key(path, "tls"), |check, tls, path| {
            let cert = check.required(&tls.cert, path, "cert", text(|s| Ok(s.to_owned())));
            let key = check.required(&tls.key, path, "key", text(|s| Ok(s.to_owned())));
            let (cert, key) = (cert?, key?);
            crate::tls::server_config(&check.file(&cert), &check.file(&key))
                .map_err(|e| check.value_error(path, e.to_string()))
        });
        Ok(Listen {
            addr: addr?,
            tls: tls?,
        })
    }

    /// `admin`: an address, or `{ addr, token | token_file, replays }`;
    /// the address, the token and the console's folder of reports, if any.
    pub(super) fn admin(&mut self, item: &file::Admin, path: &str) -> Checked<Option<AdminParts>> {
        let map = match item {
            file::Admin::Addr(t) => {
                return text(parse_socket_addr)(self, t, path).map(|a| Some((a, None, None)));
            }
            file::Admin::Map(map) => map,
        };
        let addr = self.required(&map.addr, path, "addr", text(parse_socket_addr));
        let token = self.secret(&map.token, &map.token_file, path, "token");
        let replays = self.optional(&map.replays, &child_key(path, "replays"), |check, t, path| {
            let dir = check.file(&t.0);
            if dir.is_dir() {
                Ok(dir)
            } else {
                Err(check.value_error(
                    path,
                    format!("{:?} is not a folder; name the folder simulate writes its HTML reports to", t.0),
                ))
            }
        });
        Ok(Some((addr?, token?.map(Arc::from), replays?)))
    }

    pub(super) fn server(&mut self, server: &file::Server, path: &str) -> Checked<ServerSettings> {
        let defaults = ServerSettings::default();
        let max_connections = self.optional(
            &server.max_connections,
            &child_key(path, "max_connections"),
            int(1, 1_000_000),
        );
        let max_header_size = self.optional(
            &server.max_header_size,
            &child_key(path, "max_header_size"),
            text(|s| {
                let n = parse_size(s)?;
                // hyper's HTTP/1.1 read buffer cannot be smaller than 8 KiB.
                if !(8 * 1024..=16 * 1024 * 1024).contains(&n) {
                    return Err(format!("{s:?} is out of range; write 8KiB to 16MiB"));
                }
                Ok(n)
            }),
        );
        let backlog = self.optional(
            &server.backlog,
            &child_key(path, "backlog"),
            int(1, i64::from(i32::MAX)),
        );
        let max_uri_size = self.optional(
            &server.max_uri_size,
            &child_key(path, "max_uri_size"),
            text(|s| {
                let n = parse_size(s)?;
                // Past hyper's own stop tollgate never sees the request:
                // hyper answers 414 by itself, with an empty body.
                if !(1024..=63 * 1024).contains(&n) {
                    return Err(format!(
                        "{s:?} is out of range; write 1KiB to 63KiB (hyper refuses targets over 64 KiB by itself)"
                    ));
                }
                Ok(n)
            }),
        );
        let max_body_size = self.optional(
            &server.max_body_size,
            &child_key(path, "max_body_size"),
            text(parse_size),
        );
        let rules = self.optional(&server.path, &child_key(path, "path"), Self::path_rules);
        let http1 = self.optional(
            &server.http1,
            &child_key(path, "http1"),
            text(|s| {
                let table = &Http1::SPELLINGS;
                spelled(s, table).ok_or_else(|| format!("{s:?} is not one of {}", names(table)))
            }),
        );
        Ok(ServerSettings {
            max_connections: max_connections?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_connections),
            backlog: backlog?
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(defaults.backlog),
            max_header_size: max_header_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_header_size),
            max_uri_size: max_uri_size?
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(defaults.max_uri_size),
            max_body_size: max_body_size?.or(defaults.max_body_size),
            path: rules?.unwrap_or(defaults.path),
            http1: http1?.unwrap_or(defaults.http1),
        })
    }

    fn path_rules(&mut self, section: &file::ServerPath, path: &str) -> Checked<PathRules> {
        let defaults = PathRules::default();
        let flag = |_: &mut Self, b: &file::Flag, _: &str| Ok(b.0);
        let normalize = self.optional(&section.normalize, &child_key(path, "normalize"), flag);
        let merge_slashes = self.optional(
            &section.merge_slashes,
            &child_key(path, "merge_slashes"),
            flag,
        );
        let escaped_slashes = self.optional(
            &section.escaped_slashes,
            &child_key(path, "escaped_slashes"),
            text(|s| {
                let table = &EscapedSlashes::SPELLINGS;
                spelled(s, table).ok_or_else(|| format!("{s:?} is not one of {}", names(table)))
            }),
        );
        Ok(PathRules {
            normalize: normalize?.unwrap_or(defaults.normalize),
            merge_slashes: merge_slashes?.unwrap_or(defaults.merge_slashes),
            escaped_slashes: escaped_slashes?.unwrap_or(defaults.escaped_slashes),
        })
    }

    pub(super) fn access_log(
        &mut self,
        section: &file::AccessLog,
        path: &str,
    ) -> Checked<AccessLog> {
        let flag = |_: &mut Self, b: &file::Flag, _: &str| Ok(b.0);
        let replay = self.optional(&section.replay, &child_key(path, "replay"), flag);
        Ok(AccessLog {
            replay: replay?.unwrap_or_default(),
        })
    }

    pub(super) fn timeouts(&mut self, timeouts: &file::Timeouts, path: &str) -> Checked<Timeouts> {
        let defaults = Timeouts::default();
        let mut one = |field: &Field<Text>, name: &str, default: Duration| {
            self.optional(field, &child_key(path, name), text(parse_timeout))
                .map(|t| t.unwrap_or(default))
        };
        let header_read = one(&timeouts.header_read, "header_read", defaults.header_read);
        let upstream_connect = one(
            &timeouts.upstream_connect,
            "upstream_connect",
            defaults.upstream_connect,
        );
        let upstream_response = one(
            &timeouts.upstream_response,
            "upstream_response",
            defaults.upstream_response,
        );
        let upstream_idle = one(
            &timeouts.upstream_idle,
            "upstream_idle",
            defaults.upstream_idle,
        );
        let idle = one(&timeouts.idle, "idle", defaults.idle);
        let drain = one(&timeouts.drain, "drain", defaults.drain);
        Ok(Timeouts {
            header_read: header_read?,
            upstream_connect: upstream_connect?,
            upstream_response: upstream_response?,
            upstream_idle: upstream_idle?,
            idle: idle?,
            drain: drain?,
        })
    }
}

pub(super) fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("{s:?} is not a socket address; write IP:PORT, e.g. 127.0.0.1:8080 or [::1]:8080")
    })
}

/// A size in bytes: a whole number, optionally with a binary unit
/// (`512`, `8KiB`, `10MiB`, `1GiB`).
fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = s.split_at(digits);
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "{s:?} is not a size; write bytes or a whole number with KiB, MiB or GiB, e.g. 64KiB"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("{s:?} is not a size; write e.g. 64KiB or 10MiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64KiB"), Ok(65_536));
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("8 KiB"), Ok(8192));
        assert!(parse_size("10MB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }
}
