//! The usage reader on arbitrary bodies: a JSON body or an event stream,
//! plain or gzip-compressed, read by each preset and by a summing spec,
//! fed in one chunk, in chunks of sizes the input picks, and (plain
//! bodies) byte by byte. It never panics, all three feedings give the same answer and the
//! same `so_far`, and a cost is at most 2^63 − 1. The request-side field
//! readers run on the same bytes.
#![no_main]

use std::io::Write;
use std::sync::Arc;

use flate2::Compression;
use flate2::write::GzEncoder;
use libfuzzer_sys::fuzz_target;
use tollgate::limit::usage::{
    Framing, JsonPath, Kept, Stream, UsageReader, UsageSpec, json_str, json_u64,
};

fn spec(which: u8) -> UsageSpec {
    match which % 3 {
        0 => UsageSpec::openai(),
        1 => UsageSpec::anthropic(),
        _ => UsageSpec::parse("a.b | c + d", Stream::Sum).expect("a valid spec"),
    }
}

fn run(
    spec: &Arc<UsageSpec>,
    framing: Framing,
    gzip: bool,
    body: &[u8],
    sizes: &[usize],
) -> (Option<u64>, Result<u64, Kept>) {
    let encoding = gzip.then_some(&b"gzip"[..]);
    let mut r = UsageReader::new(Arc::clone(spec), framing, encoding);
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        r.feed(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    (r.so_far(), r.finish())
}

fuzz_target!(|data: &[u8]| {
    let [control, s1, s2, s3, body @ ..] = data else {
        return;
    };
    let framing = if control & 1 == 0 {
        Framing::Json
    } else {
        Framing::Sse
    };
    let gzip = control & 2 != 0;
    let spec = Arc::new(spec(control >> 2));
    let owned;
    let body = if gzip {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(body).expect("compressed in memory");
        owned = e.finish().expect("compressed in memory");
        &owned[..]
    } else {
        body
    };
    let whole = run(&spec, framing, gzip, body, &[usize::MAX]);
    let sizes = [usize::from(*s1), usize::from(*s2), usize::from(*s3)];
    assert_eq!(whole, run(&spec, framing, gzip, body, &sizes));
    // Byte by byte, where the decoder's per-chunk flush would make a
    // compressed body the slow case of the target.
    if !gzip {
        assert_eq!(whole, run(&spec, framing, gzip, body, &[1]));
    }
    if let Ok(cost) = whole.1 {
        assert!(cost <= i64::MAX as u64);
    }
    if let Some(cost) = whole.0 {
        assert!(cost <= i64::MAX as u64);
    }
    let path = JsonPath::parse("a.b").expect("a valid path");
    let _ = json_u64(body, &path);
    let _ = json_str(body, &path);
});
