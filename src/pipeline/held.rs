//! What holds a request's concurrency slots once it is answered: the
//! response body's watch, which gives them back when the body
//! ends — complete, failed, or dropped because the client went away or a
//! task panicked — or, for an upgrade, the tunnel's task.

use http::{Response, StatusCode};

use crate::decision::slots::Slots;
use crate::proxy::Watch;

/// Slots held by a body: the body drops its watches as it tells them of
/// its end, and dropping the slots gives them back.
impl Watch for Slots {
    fn end(&mut self, _complete: bool) {}
}

/// A watch that gives `slots` back when the body it is set on ends.
pub(super) fn watch(slots: Slots) -> Box<dyn Watch> {
    Box::new(slots)
}

/// Whether the upstream switched protocols: the slots then go with the
/// tunnel, not with the (empty) body of the `101`.
pub(super) fn switching<B>(res: &Response<B>) -> bool {
    res.status() == StatusCode::SWITCHING_PROTOCOLS
}
