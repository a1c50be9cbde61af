//! Where the pipeline reads a request's JSON body for its limits: on a
//! route whose limits read body fields (a `json:FIELD` key, a `reserve:
//! { json: FIELD }`), between routing and the decision, the body is peeked
//! ([`crate::proxy::peek`]: up to its cap, under the gateway-wide budget,
//! forwarded byte for byte after), and the fields the route reads are
//! taken out once, into the [`BodyFields`] the decision phase finds on the
//! request. A body that is not read (too large, the budget spent, not
//! JSON) leaves every field absent: keys fall back as for any missing
//! source, reservations take their `default`. A route whose limits read
//! no field never comes here.

use http::Request;
use http_body_util::BodyExt;

use crate::identity::BodyFields;
use crate::limit::usage::{json_str, json_u64};
use crate::proxy::ClientBody;
use crate::routing::{BodyReads, CompiledRoute};

/// `req` with its body's fields for `route`'s limits as an extension,
/// its body unchanged.
pub(super) async fn read(route: &CompiledRoute, req: Request<ClientBody>) -> Request<ClientBody> {
    let (mut req, body) = peek(req).await;
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

/// The body's bytes when they can be read, with the request to forward.
async fn peek(req: Request<ClientBody>) -> (Request<ClientBody>, Option<bytes::Bytes>) {
    let (parts, body) = req.into_parts();
    match body {
        ClientBody::Whole(full) => {
            let bytes = match full.collect().await {
                Ok(c) => c.to_bytes(),
                Err(never) => match never {},
            };
            let req = Request::from_parts(parts, ClientBody::from(bytes.clone()));
            (req, Some(bytes))
        }
        incoming @ ClientBody::Incoming(_) => (Request::from_parts(parts, incoming), None),
    }
}
