//! The usage reader on real-shaped bodies and streams, bad input, and any
//! split of a body into chunks.

use std::io::Write;
use std::sync::Arc;

use flate2::Compression;
use flate2::write::{GzEncoder, ZlibEncoder};
use proptest::prelude::*;

use super::*;

fn read_in(spec: UsageSpec, framing: Framing, enc: Option<&str>, body: &[u8]) -> Result<u64, Kept> {
    let mut r = UsageReader::new(Arc::new(spec), framing, enc.map(str::as_bytes));
    r.feed(body);
    r.finish()
}

fn read(spec: UsageSpec, framing: Framing, body: &[u8]) -> Result<u64, Kept> {
    read_in(spec, framing, None, body)
}

fn json(body: &str) -> Result<u64, Kept> {
    read(UsageSpec::openai(), Framing::Json, body.as_bytes())
}

fn sse(spec: UsageSpec, events: &[&str]) -> String {
    let _ = spec;
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// An OpenAI-style stream of `n` chunks of content, with the usage chunk
/// last when `usage` is given, as `stream_options.include_usage` makes it.
fn openai_stream(n: usize, usage: Option<u64>) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-AbC\",\"object\":\"chat.completion.chunk\",\"created\":1732780000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
    }
    if let Some(total) = usage {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-AbC\",\"object\":\"chat.completion.chunk\",\"created\":1732780000,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":{},\"total_tokens\":{total}}}}}\n\n",
            total - 9
        ));
    }
    s.push_str("data: [DONE]\n\n");
    s
}

/// An Anthropic Messages stream: `message_start` with the input tokens,
/// content deltas, then `message_delta`s with cumulative output tokens.
fn anthropic_stream(input: u64, outputs: &[u64]) -> String {
    let mut s = format!(
        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{input},\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}}}}\n\n\
         event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n\
         event: ping\ndata: {{\"type\": \"ping\"}}\n\n"
    );
    for (i, out) in outputs.iter().enumerate() {
        s.push_str(&format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"part {i}\"}}}}\n\n\
             event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":null,\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{out}}}}}\n\n"
        ));
    }
    s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s
}

#[test]
fn openai_json_body() {
    let body = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"completion_tokens_details":{"reasoning_tokens":0}}}"#;
    assert_eq!(json(body), Ok(21));
}

#[test]
fn openai_stream_with_usage_and_without() {
    let spec = UsageSpec::openai();
    assert_eq!(
        read(
            spec.clone(),
            Framing::Sse,
            openai_stream(50, Some(77)).as_bytes()
        ),
        Ok(77)
    );
    assert_eq!(
        read(spec, Framing::Sse, openai_stream(50, None).as_bytes()),
        Err(Kept::NoUsage)
    );
}

#[test]
fn openai_responses_api_completed_event() {
    let body = sse(
        UsageSpec::openai(),
        &[
            r#"{"type":"response.created","response":{"id":"resp_1","status":"in_progress","usage":null}}"#,
            r#"{"type":"response.output_text.delta","delta":"Hi"}"#,
            r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}}"#,
        ],
    );
    assert_eq!(
        read(UsageSpec::openai(), Framing::Sse, body.as_bytes()),
        Ok(12)
    );
}

#[test]
fn anthropic_json_body_and_stream() {
    let body = r#"{"id":"msg_01","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"claude-sonnet-4-5","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":13}}"#;
    assert_eq!(
        read(UsageSpec::anthropic(), Framing::Json, body.as_bytes()),
        Ok(38)
    );
    let stream = anthropic_stream(25, &[5, 9, 15]);
    assert_eq!(
        read(UsageSpec::anthropic(), Framing::Sse, stream.as_bytes()),
        Ok(40)
    );
}

#[test]
fn anthropic_delta_with_input_tokens_replaces_the_start() {
    let mut stream = anthropic_stream(25, &[3]);
    stream.push_str(
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":30,\"output_tokens\":20}}\n\n",
    );
    assert_eq!(
        read(UsageSpec::anthropic(), Framing::Sse, stream.as_bytes()),
        Ok(50)
    );
}

#[test]
fn so_far_follows_the_stream() {
    let mut r = UsageReader::new(Arc::new(UsageSpec::anthropic()), Framing::Sse, None);
    assert_eq!(r.so_far(), None);
    let stream = anthropic_stream(25, &[5, 9]);
    let cut = stream.find("event: content_block_start").unwrap_or(0);
    r.feed(&stream.as_bytes()[..cut]);
    assert_eq!(r.so_far(), Some(26));
    let last = stream.rfind("event: message_delta").unwrap_or(0);
    r.feed(&stream.as_bytes()[cut..last + 30]);
    assert_eq!(r.so_far(), Some(30));
    r.feed(&stream.as_bytes()[last + 30..]);
    assert_eq!(r.so_far(), Some(34));
    assert_eq!(r.finish(), Ok(34));

    let mut r = UsageReader::new(Arc::new(UsageSpec::openai()), Framing::Json, None);
    r.feed(br#"{"usage":{"total_tokens":4}"#);
    assert_eq!(r.so_far(), None);
    r.feed(b"}  ");
    assert_eq!(r.so_far(), Some(4));
}

#[test]
fn sse_lines_end_three_ways_and_data_takes_one_space() {
    let spec = || UsageSpec::openai();
    let cases: &[&[u8]] = &[
        b"data: {\"usage\":{\"total_tokens\":5}}\r\n\r\n",
        b"data:{\"usage\":{\"total_tokens\":5}}\r\r",
        b"data:  {\"usage\":{\"total_tokens\":5}}\n\n",
        b"\xEF\xBB\xBFdata: {\"usage\":{\"total_tokens\":5}}\n\n",
        b": keep-alive\n\nevent: x\nid: 1\ndata: {\"usage\":\ndata: {\"total_tokens\":5}}\n\n",
        b"retry: 10\ndata\ndata: {\"usage\":{\"total_tokens\":5}}\n\ndata: [DONE]\n\n",
    ];
    for body in cases {
        assert_eq!(
            read(spec(), Framing::Sse, body),
            Ok(5),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    let ignored: &[&[u8]] = &[
        // No blank line after the last event: not dispatched.
        b"data: {\"usage\":{\"total_tokens\":5}}\n",
        // Fields that are not `data`.
        b"datum: {\"usage\":{\"total_tokens\":5}}\n\n",
        b" data: {\"usage\":{\"total_tokens\":5}}\n\n",
        b"\xEF\xBBdata: {\"usage\":{\"total_tokens\":5}}\n\n",
    ];
    for body in ignored {
        assert_eq!(
            read(spec(), Framing::Sse, body),
            Err(Kept::NoUsage),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn an_event_past_the_buffer_is_read_as_it_streams() {
    let filler = "x".repeat(3 * EVENT_BUFFER);
    let body = format!(
        "data: {{\"text\":\"{filler}\",\ndata: \"usage\":{{\"total_tokens\":8}}}}\n\ndata: {{\"big\":\"{filler}\"}}\n\n"
    );
    assert_eq!(
        read(UsageSpec::openai(), Framing::Sse, body.as_bytes()),
        Ok(8)
    );
}

#[test]
fn non_json_events_are_normal_but_a_broken_usage_event_says_so() {
    let body =
        "data: [DONE]\n\ndata: hello\n\ndata: {\"usage\":{\"total_tokens\":3}}\n\ndata: {oops\n\n";
    assert_eq!(
        read(UsageSpec::openai(), Framing::Sse, body.as_bytes()),
        Ok(3)
    );
    let body = "data: {\"usage\":{\"total_tokens\":3}\n\n";
    assert_eq!(
        read(UsageSpec::openai(), Framing::Sse, body.as_bytes()),
        Err(Kept::NotJson)
    );
}

#[test]
fn numbers_that_are_not_counts() {
    let max = i64::MAX;
    assert_eq!(
        json(&format!(r#"{{"usage":{{"total_tokens":{max}}}}}"#)),
        Ok(max as u64)
    );
    assert_eq!(json(r#"{"usage":{"total_tokens":0}}"#), Ok(0));
    for bad in [
        r#"{"usage":{"total_tokens":"12"}}"#,
        r#"{"usage":{"total_tokens":-1}}"#,
        r#"{"usage":{"total_tokens":-0}}"#,
        r#"{"usage":{"total_tokens":1.0}}"#,
        r#"{"usage":{"total_tokens":1e3}}"#,
        r#"{"usage":{"total_tokens":9223372036854775808}}"#,
        r#"{"usage":{"total_tokens":99999999999999999999999}}"#,
        r#"{"usage":{"total_tokens":true}}"#,
        r#"{"usage":{"total_tokens":{"n":1}}}"#,
        r#"{"usage":{"total_tokens":[1]}}"#,
        r#"{"usage":{"total_tokens":1,"total_tokens":2}}"#,
        r#"{"usage":{"total_tokens":1},"response":{"usage":{"total_tokens":1}}}"#,
    ] {
        assert_eq!(json(bad), Err(Kept::BadNumber), "{bad}");
    }
    for not_json in [
        r#"{"usage":{"total_tokens":NaN}}"#,
        r#"{"usage":{"total_tokens":01}}"#,
        r#"{"usage":{"total_tokens":1.}}"#,
        r#"{"usage":{"total_tokens":5}} x"#,
        r#"{"usage":{"total_tokens":5}"#,
        r#"{"usage":{"total_tokens":5},}"#,
        r#"{"a":"\x"}"#,
        "",
    ] {
        assert_eq!(json(not_json), Err(Kept::NotJson), "{not_json}");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(json(&deep), Err(Kept::NotJson));
    let deep_ok = format!(
        "{{\"usage\":{{\"total_tokens\":2}},\"x\":{}{}}}",
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_eq!(json(&deep_ok), Ok(2));
    // Null is no value; a value in an array is not at a path.
    assert_eq!(
        json(r#"{"usage":{"total_tokens":null}}"#),
        Err(Kept::NoUsage)
    );
    assert_eq!(json(r#"{"usage":null}"#), Err(Kept::NoUsage));
    assert_eq!(
        json(r#"[{"usage":{"total_tokens":3}}]"#),
        Err(Kept::NoUsage)
    );
    // Keys are compared as written.
    assert_eq!(
        json(r#"{"usage":{"total\u005ftokens":3}}"#),
        Err(Kept::NoUsage)
    );
    assert_eq!(
        json(" \r\n{\"usage\" : { \"total_tokens\" : 7 } }\n"),
        Ok(7)
    );
}

#[test]
fn a_sum_spec_adds_every_delta() {
    let spec = UsageSpec::parse("usage.delta | d + fixed", Stream::Sum).expect("valid");
    let body =
        "data: {\"usage\":{\"delta\":3}}\n\ndata: {\"d\":4,\"fixed\":1}\n\ndata: {\"fixed\":1}\n\n";
    assert_eq!(read(spec.clone(), Framing::Sse, body.as_bytes()), Ok(9));
    let over = format!(
        "data: {{\"d\":{}}}\n\ndata: {{\"d\":1,\"fixed\":0}}\n\n",
        i64::MAX
    );
    assert_eq!(
        read(spec, Framing::Sse, over.as_bytes()),
        Err(Kept::BadNumber)
    );
}

#[test]
fn compressed_bodies_are_read_decoded() {
    let body = openai_stream(20, Some(31));
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(body.as_bytes()).expect("in memory");
    let gz = gz.finish().expect("in memory");
    let mut zl = ZlibEncoder::new(Vec::new(), Compression::default());
    zl.write_all(body.as_bytes()).expect("in memory");
    let zl = zl.finish().expect("in memory");
    let spec = UsageSpec::openai;
    assert_eq!(read_in(spec(), Framing::Sse, Some("gzip"), &gz), Ok(31));
    assert_eq!(read_in(spec(), Framing::Sse, Some(" X-GZIP "), &gz), Ok(31));
    assert_eq!(read_in(spec(), Framing::Sse, Some("deflate"), &zl), Ok(31));
    assert_eq!(
        read_in(spec(), Framing::Sse, Some("identity"), body.as_bytes()),
        Ok(31)
    );
    assert_eq!(
        read_in(spec(), Framing::Sse, Some("br"), &gz),
        Err(Kept::Encoded)
    );
    assert_eq!(
        read_in(spec(), Framing::Sse, Some("gzip, gzip"), &gz),
        Err(Kept::Encoded)
    );
    assert_eq!(
        read_in(spec(), Framing::Sse, Some("gzip"), body.as_bytes()),
        Err(Kept::Encoded)
    );
    assert_eq!(
        read_in(spec(), Framing::Sse, Some("gzip"), &gz[..gz.len() - 4]),
        Err(Kept::Encoded)
    );
    // Chunk by chunk, `so_far` sees what was decoded.
    let mut r = UsageReader::new(Arc::new(spec()), Framing::Sse, Some(b"gzip"));
    for c in gz.chunks(7) {
        r.feed(c);
    }
    assert_eq!(r.so_far(), Some(31));
    assert_eq!(r.finish(), Ok(31));
}

#[test]
fn a_compressed_body_decodes_to_the_cap_at_most() {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    let zeros = vec![b' '; 1 << 20];
    gz.write_all(b"{\"usage\":{\"total_tokens\":1}}")
        .expect("in memory");
    for _ in 0..=(MAX_DECODED >> 20) {
        gz.write_all(&zeros).expect("in memory");
    }
    let gz = gz.finish().expect("in memory");
    assert_eq!(
        read_in(UsageSpec::openai(), Framing::Json, Some("gzip"), &gz),
        Err(Kept::TooLarge)
    );
}

#[test]
fn framing_by_content_type() {
    for (ct, f) in [
        ("application/json", Some(Framing::Json)),
        ("Application/JSON; charset=utf-8", Some(Framing::Json)),
        ("application/problem+json", Some(Framing::Json)),
        ("application/vnd.api+JSON", Some(Framing::Json)),
        ("text/event-stream", Some(Framing::Sse)),
        (" Text/Event-Stream ;charset=utf-8", Some(Framing::Sse)),
        ("text/plain", None),
        ("application/jsonl", None),
        ("+json", None),
        ("", None),
    ] {
        assert_eq!(Framing::of(ct), f, "{ct}");
    }
}

#[test]
fn specs_parse_and_show() {
    let spec = UsageSpec::parse(
        " usage.input_tokens | message.usage.input_tokens+usage.output_tokens ",
        Stream::Last,
    )
    .expect("valid");
    assert_eq!(
        spec.to_string(),
        "usage.input_tokens | message.usage.input_tokens + usage.output_tokens"
    );
    assert_eq!(spec.terms().len(), 2);
    assert_eq!(
        UsageSpec::anthropic().to_string(),
        "usage.input_tokens | message.usage.input_tokens + usage.output_tokens | message.usage.output_tokens"
    );
    assert_eq!(UsageSpec::openai(), UsageSpec::openai());
    assert_ne!(UsageSpec::openai(), UsageSpec::anthropic());
    for bad in [
        "",
        "a..b",
        "a +",
        "a | ",
        "usage.total tokens",
        "a.b$",
        &"a.".repeat(20),
        &"x".repeat(65),
        &"a + ".repeat(9),
    ] {
        let err = UsageSpec::parse(bad, Stream::Last).expect_err(bad);
        assert!(!err.is_empty());
    }
}

#[test]
fn request_fields() {
    let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"max_tokens"}],"max_tokens":256,"meta":{"tier":"pro","n":-1},"stream":true}"#;
    let path = |p: &str| JsonPath::parse(p).expect("valid");
    assert_eq!(json_u64(body, &path("max_tokens")), Some(256));
    assert_eq!(json_str(body, &path("model")).as_deref(), Some("gpt-4o"));
    assert_eq!(json_str(body, &path("meta.tier")).as_deref(), Some("pro"));
    assert_eq!(json_u64(body, &path("meta.n")), None);
    assert_eq!(json_u64(body, &path("model")), None);
    assert_eq!(json_str(body, &path("max_tokens")), None);
    assert_eq!(json_str(body, &path("absent")), None);
    assert_eq!(
        json_u64(br#"{"max_tokens":1.5}"#, &path("max_tokens")),
        None
    );
    assert_eq!(
        json_u64(
            br#"{"max_tokens":9223372036854775808}"#,
            &path("max_tokens")
        ),
        None
    );
    assert_eq!(json_u64(br#"{"max_tokens":1}x"#, &path("max_tokens")), None);
    assert_eq!(
        json_u64(br#"{"max_tokens":1,"max_tokens":2}"#, &path("max_tokens")),
        Some(2)
    );
    assert_eq!(
        json_str(br#"{"mod\u0065l":"a\"b"}"#, &path("model")).as_deref(),
        Some("a\"b")
    );
    assert_eq!(json_u64(b"not json", &path("max_tokens")), None);
    let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
    assert_eq!(json_u64(deep.as_bytes(), &path("a")), None);
}

fn chunked(
    spec: &Arc<UsageSpec>,
    framing: Framing,
    body: &[u8],
    cuts: &[usize],
) -> (Option<u64>, Result<u64, Kept>) {
    let mut r = UsageReader::new(Arc::clone(spec), framing, None);
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    for c in cuts {
        r.feed(&body[at..c]);
        at = c;
    }
    r.feed(&body[at..]);
    (r.so_far(), r.finish())
}

fn any_split_reads_alike(spec: UsageSpec, framing: Framing, body: &[u8], cuts: &[usize]) {
    let spec = Arc::new(spec);
    let whole = chunked(&spec, framing, body, &[]);
    assert_eq!(chunked(&spec, framing, body, cuts), whole);
}

#[test]
fn every_single_split_reads_alike() {
    let body = anthropic_stream(11, &[2, 3]).replace('\n', "\r\n");
    let spec = Arc::new(UsageSpec::anthropic());
    let whole = chunked(&spec, Framing::Sse, body.as_bytes(), &[]);
    assert_eq!(whole.1, Ok(14));
    for cut in 0..=body.len() {
        assert_eq!(
            chunked(&spec, Framing::Sse, body.as_bytes(), &[cut]),
            whole,
            "cut at {cut}"
        );
    }
}

proptest! {
    #[test]
    fn openai_streams_read_alike_in_any_chunks(n in 0usize..20, total in 9u64..1_000_000, cuts in prop::collection::vec(any::<usize>(), 0..40)) {
        let body = openai_stream(n, Some(total));
        let spec = Arc::new(UsageSpec::openai());
        prop_assert_eq!(chunked(&spec, Framing::Sse, body.as_bytes(), &cuts), (Some(total), Ok(total)));
    }

    #[test]
    fn anthropic_streams_read_alike_in_any_chunks(input in 0u64..100_000, outs in prop::collection::vec(0u64..100_000, 1..6), cuts in prop::collection::vec(any::<usize>(), 0..40)) {
        let body = anthropic_stream(input, &outs).replace('\n', "\r");
        let spec = Arc::new(UsageSpec::anthropic());
        let want = input + outs[outs.len() - 1];
        prop_assert_eq!(chunked(&spec, Framing::Sse, body.as_bytes(), &cuts), (Some(want), Ok(want)));
    }

    #[test]
    fn any_bytes_read_alike_in_any_chunks(body in prop::collection::vec(prop::sample::select(b"data: {}[]\"\\,:0123456789-.eE \r\nusage_total_tokensnulltruex".to_vec()), 0..300), cuts in prop::collection::vec(any::<usize>(), 0..20)) {
        any_split_reads_alike(UsageSpec::openai(), Framing::Sse, &body, &cuts);
        any_split_reads_alike(UsageSpec::openai(), Framing::Json, &body, &cuts);
    }

    #[test]
    fn the_scanner_agrees_with_serde_json(v in arb_json()) {
        let body = serde_json::to_vec(&v).expect("serialises");
        let spec = UsageSpec::parse("a.b", Stream::Last).expect("valid");
        let want = v.get("a").and_then(|a| a.get("b"));
        let got = read(spec, Framing::Json, &body);
        match want {
            None | Some(serde_json::Value::Null) => prop_assert_eq!(got, Err(Kept::NoUsage)),
            Some(w) => match w.as_u64().filter(|n| *n <= i64::MAX as u64) {
                Some(n) => prop_assert_eq!(got, Ok(n)),
                None => prop_assert_eq!(got, Err(Kept::BadNumber)),
            },
        }
        let pretty = serde_json::to_vec_pretty(&v).expect("serialises");
        prop_assert_eq!(read(UsageSpec::parse("a.b", Stream::Last).expect("valid"), Framing::Json, &pretty), got);
    }
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        "[a-z\"\\\\é ]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]),
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
