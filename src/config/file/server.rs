//! `server:` in the file: caps on what one client may hold or send, how
//! paths are made canonical, and which HTTP/1.1 code serves.

use schemars::JsonSchema;
use serde::Deserialize;

use super::leaf::{Field, Flag, Int, Text};
use super::shape::spellings;
use crate::config::Http1;
use crate::target::EscapedSlashes;

/// `server:` — caps on what one client may hold or send.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct Server {
    /// `max_connections: 10000`
    pub max_connections: Field<Int>,
    /// `backlog: 4096` (accept queue of each listener; capped by the kernel)
    pub backlog: Field<Int>,
    /// `max_header_size: 128KiB`
    #[schemars(transform = super::shape::size)]
    pub max_header_size: Field<Text>,
    /// `max_uri_size: 16KiB` (path and query of the request target)
    #[schemars(transform = super::shape::size)]
    pub max_uri_size: Field<Text>,
    /// `max_body_size: 10MiB`
    #[schemars(transform = super::shape::size)]
    pub max_body_size: Field<Text>,
    /// `path: { normalize, merge_slashes, escaped_slashes }`
    pub path: Field<ServerPath>,
    /// `http1: hyper | native` (read at start)
    #[schemars(extend("enum" = spellings(&Http1::SPELLINGS)))]
    pub http1: Field<Text>,
}

/// `server.path:` — how request paths are made canonical.
#[derive(Debug, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(default, expecting = "a mapping")]
#[schemars(deny_unknown_fields)]
pub struct ServerPath {
    /// `normalize: true` (false: route on and forward the raw path)
    pub normalize: Field<Flag>,
    /// `merge_slashes: true`
    pub merge_slashes: Field<Flag>,
    /// `escaped_slashes: reject | keep | decode`
    #[schemars(extend("enum" = spellings(&EscapedSlashes::SPELLINGS)))]
    pub escaped_slashes: Field<Text>,
}
