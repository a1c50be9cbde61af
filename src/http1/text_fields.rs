//! The header fields an answer's body carries for the native writer,
//! beside the head's `HeaderMap`, already as text: the gateway's own
//! ([`LateFields`]) and an upstream's as it wrote them ([`Passed`]).
//! Carried by the body rather than in the response's extensions, they
//! cost no extensions map and no lookup. What reads an answer's
//! fields from its map first reads the passed ones into it
//! ([`materialize`]).

use http::Response;
use http_body_util::{Empty, Full};

use super::fields::{Passed, read_into};
use super::write::LateFields;

/// A response body that may carry some of its answer's header fields
/// for the native writer, beside the head's `HeaderMap`: a body of the
/// gateway's own carries its [`LateFields`], an upstream's answer read by
/// the native client the fields it passes as written ([`Passed`]); any
/// other body, none.
pub trait TextFields {
    /// The gateway's fields this body carries, if any.
    fn late(&self) -> Option<&LateFields> {
        None
    }

    /// The upstream's fields this body carries, if any.
    fn passed(&self) -> Option<&Passed> {
        None
    }

    /// Takes the upstream's fields out, to read them into the map
    /// ([`materialize`]).
    fn take_passed(&mut self) -> Option<Box<Passed>> {
        None
    }
}

impl<D> TextFields for Full<D> {}

impl<D> TextFields for Empty<D> {}

/// Reads the [`Passed`] fields `res`'s body carries, if any, into its map
/// and takes them out of the body ([`read_into`]).
pub fn materialize<B: TextFields>(res: &mut Response<B>) {
    let Some(passed) = res.body_mut().take_passed() else {
        return;
    };
    read_into(res.headers_mut(), &passed);
}
