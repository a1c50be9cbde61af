"""A fake model API for tests/limits/tokens.rs: OpenAI's chat completions
(POST /v1/chat/completions) and Anthropic's messages (POST /v1/messages),
answered whole or as Server-Sent Events, with the usage such servers report.

The usage is worked out from the request, so the test knows it without
asking: input tokens are the words of the messages, output tokens
`max_tokens // 2 + 1` (so a reservation of `max_tokens` is mostly refunded).
The model's name picks a behaviour:

- `slow`: 10 events 30 ms apart (a stream long enough to be in flight);
- `hang`: the first events, then nothing until the client goes away;
- `bad-usage`: usage reported as a string (the reservation must stand);
- `error`: a 500 with a JSON error and no usage;
- anything else: an ordinary answer.

Prints its port once it serves; stdlib only.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def words(messages):
    n = 0
    for m in messages or []:
        content = m.get("content", "")
        if isinstance(content, str):
            n += len(content.split())
    return max(n, 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.whole(400, {"error": {"message": "the body is not JSON"}})
        model = req.get("model", "m")
        if model == "error":
            return self.whole(500, {"error": {"message": "overloaded"}})
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or 50
        inp, out = words(req.get("messages")), max_tokens // 2 + 1
        if self.path.startswith("/v1/chat/completions"):
            self.openai(req, model, inp, out)
        elif self.path.startswith("/v1/messages"):
            self.anthropic(req, model, inp, out)
        else:
            self.whole(404, {"error": "no such path"})

    def whole(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, text):
        data = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def pace(self, model, i):
        if model == "slow":
            time.sleep(0.03)
        if model == "hang" and i == 2:
            # Wait for the client to go away: writes fail once it has.
            for _ in range(600):
                time.sleep(0.05)
                try:
                    self.chunk(": keep-alive\n\n")
                except OSError:
                    raise SystemExit
            raise SystemExit

    def openai(self, req, model, inp, out):
        usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
        if model == "bad-usage":
            usage["total_tokens"] = "many"
        base = {"id": "chatcmpl-1", "created": 1, "model": model}
        if not req.get("stream"):
            return self.whole(200, dict(base, object="chat.completion", choices=[
                {"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": "hello " * out}}], usage=usage))
        include = (req.get("stream_options") or {}).get("include_usage")
        self.start_stream()
        try:
            for i in range(10):
                self.pace(model, i)
                delta = {"index": 0, "delta": {"content": "hello "}, "finish_reason": None}
                ev = dict(base, object="chat.completion.chunk", choices=[delta])
                if include:
                    ev["usage"] = None
                self.chunk("data: %s\n\n" % json.dumps(ev))
            if include:
                ev = dict(base, object="chat.completion.chunk", choices=[], usage=usage)
                self.chunk("data: %s\n\n" % json.dumps(ev))
            self.chunk("data: [DONE]\n\n")
            self.end_stream()
        except (OSError, SystemExit):
            self.close_connection = True

    def anthropic(self, req, model, inp, out):
        if not req.get("stream"):
            return self.whole(200, {"id": "msg_1", "type": "message", "role": "assistant",
                                    "content": [{"type": "text", "text": "hello"}],
                                    "usage": {"input_tokens": inp, "output_tokens": out}})
        self.start_stream()

        def event(name, body):
            self.chunk("event: %s\ndata: %s\n\n" % (name, json.dumps(body)))

        try:
            event("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [],
                "usage": {"input_tokens": inp, "output_tokens": 1}}})
            for i in range(10):
                self.pace(model, i)
                event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": "hello "}})
                if i == 4:
                    event("message_delta", {"type": "message_delta", "delta": {},
                                            "usage": {"output_tokens": out // 2}})
            event("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "end_turn"},
                                    "usage": {"output_tokens": out}})
            event("message_stop", {"type": "message_stop"})
            self.end_stream()
        except (OSError, SystemExit):
            self.close_connection = True


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
