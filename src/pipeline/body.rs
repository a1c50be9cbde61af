//! Where the pipeline reads a request's JSON body for its limits: on a
//! route whose limits read body fields (a `json:FIELD` key, a `reserve:
//! { json: FIELD }`), between routing and the decision, the body is peeked
//! ([`crate::proxy::peek`]: up to [`BODY_CAP`], under the gateway-wide
//! [`super::gateway::BODY_BUDGET`], forwarded byte for byte after), and
//! the fields the route reads are
//! taken out once, into the [`BodyFields`] the decision phase finds on the
//! request. The tower layer reads its requests' bodies here too
//! ([`read_within`], with a budget of its own). A body that is not read (too large, the budget spent, not
//! JSON) leaves every field absent: keys fall back as for any missing
//! source, reservations take their `default`. A route whose limits read
//! no field never comes here.

use std::time::Duration;

use http::Request;

use super::gateway::Gateway;
use crate::config::Action;
use crate::identity::BodyFields;
use crate::limit::usage::{json_str, json_u64};
use crate::proxy::{ClientBody, PeekBudget, Peekable, peek};
use crate::routing::{BodyReads, CompiledRoute};

/// The most bytes of one request body read for its fields; a larger body
/// is forwarded unread (its fields absent).
pub const BODY_CAP: usize = 1024 * 1024;

/// How long a client that stalls mid-body is waited for when the route
/// answers locally (an upstream route waits its response timeout).
const LOCAL_WAIT: Duration = Duration::from_secs(30);

/// `req` with its body's fields for `route`'s limits as an extension,
/// its body forwarded unchanged.
pub(super) async fn read(
    gw: &Gateway,
    route: &CompiledRoute,
    req: Request<ClientBody>,
) -> Request<ClientBody> {
    read_within(&gw.body_budget, route, req).await
}

/// [`read`] with the bytes held at once taken from `budget`.
pub async fn read_within<B: Peekable>(
    budget: &PeekBudget,
    route: &CompiledRoute,
    req: Request<B>,
) -> Request<B> {
    let wait = match &route.route.action {
        Action::Upstream(up) => up.timeout,
        Action::Respond(_) => LOCAL_WAIT,
    };
    let (mut req, body) = peek(req, BODY_CAP, budget, wait).await;
    let fields = body
        .map(|b| fields_of(&route.body_reads, &b))
        .unwrap_or_default();
    req.extensions_mut().insert(fields);
    req
}

/// The fields `reads` names, as `body` holds them.
pub fn fields_of(reads: &BodyReads, body: &[u8]) -> BodyFields {
    BodyFields {
        text: reads
            .text
            .iter()
            .filter_map(|f| {
                let v = json_str(body, &f.path)?;
                Some((f.name.clone(), v.into_bytes().into_boxed_slice()))
            })
            .collect(),
        counts: reads
            .counts
            .iter()
            .filter_map(|f| Some((f.name.clone(), json_u64(body, &f.path)?)))
            .collect(),
    }
}
