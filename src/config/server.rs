//! `server:`, the caps on what one client may make the gateway hold, and
//! which HTTP/1.1 code serves it.

/// Caps that bound what one client can make the gateway hold.
#[derive(Debug, Clone, Copy)]
pub struct ServerSettings {
    /// Connections served at once; further ones wait in the kernel's
    /// accept backlog.
    pub max_connections: usize,
    /// Length of each listener's accept queue, passed to `listen(2)`. The
    /// kernel caps it at `net.core.somaxconn` (Linux) or `kern.ipc.somaxconn`.
    pub backlog: u32,
    /// Largest request header block in bytes, counted as HTTP/1.1 text
    /// (request line and `name: value` lines); larger gets a 431 (see
    /// [`guard`](crate::guard) for the heads hyper refuses by itself).
    pub max_header_size: usize,
    /// Longest path and query of a request target in bytes; longer gets 414.
    pub max_uri_size: usize,
    /// Largest request body in bytes; larger gets 413. `None`: no cap.
    pub max_body_size: Option<u64>,
    /// How request paths are made canonical before routing.
    pub path: crate::target::PathRules,
    /// Which HTTP/1.1 code serves clients and speaks to plain `http://`
    /// upstreams; read at start only.
    pub http1: Http1,
}

/// `server.http1`: the HTTP/1.1 implementation on both sides of the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Http1 {
    /// hyper's server and client connections, kept so that an operator
    /// can go back without a rebuild.
    Hyper,
    /// tollgate's own, one buffer each way per connection.
    #[default]
    Native,
}

impl Http1 {
    /// Every spelling the configuration accepts, with its value.
    pub const SPELLINGS: [(&'static str, Self); 2] =
        [("hyper", Self::Hyper), ("native", Self::Native)];
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            // std and tokio bind with 128, which a burst of new clients (a
            // fleet reconnecting, or clients queued at `max_connections`)
            // overflows: the kernel then drops SYNs and clients retry after
            // a second or more. nginx asks for 511; 4096 is Linux's default
            // `somaxconn` since 5.4, so on a default kernel the system
            // setting, not tollgate, is the bound.
            backlog: 4096,
            // Room for a 64 KB credential plus ordinary headers; Envoy's
            // default is 60 KiB, hyper's own read buffer about 400 KiB.
            max_header_size: 128 * 1024,
            // Twice the request line nginx (8 KiB buffers) and Apache
            // (`LimitRequestLine 8190`) accept, the request line AWS load
            // balancers take (16 KiB), and well under hyper's own 64 KiB
            // stop, so that an overlong target gets tollgate's 414.
            max_uri_size: 16 * 1024,
            max_body_size: None,
            path: crate::target::PathRules::default(),
            http1: Http1::default(),
        }
    }
}
