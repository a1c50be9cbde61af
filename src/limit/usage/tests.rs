//! The usage reader on real-shaped bodies and streams, bad input, and any
//! split of a body into chunks.

use std::sync::Arc;

use super::*;

fn read(spec: UsageSpec, framing: Framing, body: &[u8]) -> Result<u64, Kept> {
    let mut r = UsageReader::new(Arc::new(spec), framing, None);
    r.feed(body);
    r.finish()
}

#[test]
fn openai_json_body() {
    let body = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
    assert_eq!(read(UsageSpec::openai(), Framing::Json, body), Ok(21));
}
