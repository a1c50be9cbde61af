//! Throughput of the usage reader, the part of a token limit that sees
//! every byte of a response, and of the request-side field readers. Run
//! with `cargo bench --bench usage`.
//!
//! - `sse/*`: an OpenAI-style stream of about 4 MB (`chat.completion.chunk`
//!   events of one word each, `"usage": null`, the usage in the last
//!   chunk, then `[DONE]`), fed one event per chunk as a model server
//!   writes them and in 16 KiB chunks as they arrive under load; an
//!   Anthropic stream the same way; beside them, each event parsed by
//!   `serde_json` (the alternative design: a buffered event per parse).
//! - `json/*`: non-streamed bodies of about 4 MB fed in 16 KiB chunks: an
//!   embeddings list (numbers) and a chat completion whose text is long
//!   (strings); beside them, the whole body parsed by `serde_json`.
//! - `request/*`: `max_tokens` and `model` read from a 4 KB chat request.
//!
//! The figures are bytes per second of one core; the stream through the
//! gateway costs what proxying costs plus this.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::limit::usage::{Framing, JsonPath, UsageReader, UsageSpec, json_str, json_u64};

const MB4: usize = 4 << 20;

fn openai_stream() -> Vec<String> {
    let mut events = Vec::new();
    let mut size = 0;
    let mut i = 0u64;
    while size < MB4 {
        let e = format!(
            "data: {{\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1732780000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"
        );
        size += e.len();
        events.push(e);
        i += 1;
    }
    events.push("data: {\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1732780000,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":40000,\"total_tokens\":40009}}\n\n".to_owned());
    events.push("data: [DONE]\n\n".to_owned());
    events
}

fn anthropic_stream() -> Vec<String> {
    let mut events = vec!["event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n".to_owned()];
    let mut size = 0;
    let mut i = 0u64;
    while size < MB4 {
        let e = format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\" word{i}\"}}}}\n\n"
        );
        size += e.len();
        events.push(e);
        i += 1;
    }
    events.push(format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{i}}}}}\n\n"));
    events.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_owned());
    events
}

fn embeddings_body() -> Vec<u8> {
    let mut s = String::from("{\"object\":\"list\",\"data\":[");
    let mut k = 0u64;
    while s.len() < MB4 {
        if k > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"object\":\"embedding\",\"index\":{k},\"embedding\":["
        ));
        for j in 0..256u64 {
            if j > 0 {
                s.push(',');
            }
            let x = ((k * 7919 + j * 104729) % 2000) as f64 / 1000.0 - 1.0;
            s.push_str(&format!("{x:.9}"));
        }
        s.push_str("]}");
        k += 1;
    }
    s.push_str("],\"model\":\"text-embedding-3-small\",\"usage\":{\"prompt_tokens\":8000,\"total_tokens\":8000}}");
    s.into_bytes()
}

fn long_text_body() -> Vec<u8> {
    let text: String = (0..MB4 / 8)
        .map(|i| format!("w{:05} ", i % 99999))
        .collect::<String>()
        .replace("w0", "\\\"q");
    format!("{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"{text}\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":900000,\"total_tokens\":900009}}}}").into_bytes()
}

fn read(spec: &Arc<UsageSpec>, framing: Framing, chunks: &[&[u8]]) -> u64 {
    let mut r = UsageReader::new(Arc::clone(spec), framing, None);
    for c in chunks {
        r.feed(c);
    }
    r.finish().unwrap_or(0)
}

fn sse(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse");
    for (name, spec, events) in [
        ("openai", UsageSpec::openai(), openai_stream()),
        ("anthropic", UsageSpec::anthropic(), anthropic_stream()),
    ] {
        let spec = Arc::new(spec);
        let whole: Vec<u8> = events.concat().into_bytes();
        g.throughput(Throughput::Bytes(whole.len() as u64));
        let per_event: Vec<&[u8]> = events.iter().map(|e| e.as_bytes()).collect();
        assert!(read(&spec, Framing::Sse, &per_event) > 0);
        g.bench_function(format!("{name}/per_event"), |b| {
            b.iter(|| black_box(read(&spec, Framing::Sse, &per_event)));
        });
        let chunks: Vec<&[u8]> = whole.chunks(16 * 1024).collect();
        g.bench_function(format!("{name}/16k_chunks"), |b| {
            b.iter(|| black_box(read(&spec, Framing::Sse, &chunks)));
        });
        g.bench_function(format!("{name}/serde_json_per_event"), |b| {
            b.iter(|| {
                let mut n = 0;
                for e in &events {
                    let data = e
                        .lines()
                        .filter_map(|l| l.strip_prefix("data: "))
                        .next()
                        .unwrap_or("");
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(data) {
                        n += usize::from(v.get("usage").is_some());
                    }
                }
                black_box(n)
            });
        });
    }
    g.finish();
}

fn json(c: &mut Criterion) {
    let mut g = c.benchmark_group("json");
    g.sample_size(20);
    let spec = Arc::new(UsageSpec::openai());
    for (name, body) in [
        ("embeddings", embeddings_body()),
        ("long_text", long_text_body()),
    ] {
        g.throughput(Throughput::Bytes(body.len() as u64));
        let chunks: Vec<&[u8]> = body.chunks(16 * 1024).collect();
        assert!(read(&spec, Framing::Json, &chunks) > 0, "{name}");
        g.bench_function(format!("{name}/16k_chunks"), |b| {
            b.iter(|| black_box(read(&spec, Framing::Json, &chunks)));
        });
        g.bench_function(format!("{name}/serde_json_whole"), |b| {
            b.iter(|| black_box(serde_json::from_slice::<serde_json::Value>(&body).is_ok()));
        });
    }
    g.finish();
}

fn request(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    let filler = "Summarise the following text in three sentences. ".repeat(70);
    let body = format!(
        "{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"system\",\"content\":\"You are terse.\"}},{{\"role\":\"user\",\"content\":\"{filler}\"}}],\"temperature\":0.2,\"stream\":true,\"stream_options\":{{\"include_usage\":true}},\"max_tokens\":512}}"
    );
    assert!((3500..4500).contains(&body.len()), "{}", body.len());
    let (max, model) = (
        JsonPath::parse("max_tokens").expect("valid"),
        JsonPath::parse("model").expect("valid"),
    );
    assert_eq!(json_u64(body.as_bytes(), &max), Some(512));
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("max_tokens_and_model_4k", |b| {
        b.iter(|| {
            black_box(json_u64(body.as_bytes(), &max));
            black_box(json_str(body.as_bytes(), &model));
        });
    });
    g.finish();
}

criterion_group!(benches, sse, json, request);
criterion_main!(benches);
