//! What the three log-format targets share: one parser per format, as
//! `tollgate simulate` builds it, and the checks a parsed line must pass.

use http::{HeaderName, HeaderValue};
use tollgate::simulate::InputFormat;
use tollgate::simulate::input::{Parsed, Parser, detect};
use tollgate::target::{PathRules, canonical};

/// Parses `data` as one line of `format`, with the combined format's extra
/// fields mapped to an `X-Forwarded-For`, a skipped field and an API key.
///
/// Beyond "never panics": format detection takes any first line, and a line
/// read as a request is one the gateway's own first phase can take — its
/// target either canonical or refused with a reason, never a panic.
pub fn check(format: InputFormat, data: &[u8]) {
    let _ = detect(data);
    let fields = [
        HeaderName::from_static("x-forwarded-for"),
        HeaderName::from_static("-"),
        HeaderName::from_static("x-api-key"),
    ];
    let parser = Parser::new(
        format,
        &fields,
        Some(HeaderValue::from_static("api.test")),
        HeaderName::from_static("x-api-key"),
        HeaderName::from_static("x-user"),
    );
    match parser.parse(data) {
        Ok(Parsed::Request(line)) => {
            let req = &line.req;
            let _ = canonical(req.uri(), req.version(), req.headers(), &PathRules::default());
        }
        Ok(Parsed::Skip) => {}
        Err(reason) => assert!(!reason.is_empty(), "a bad line is told why"),
    }
}
