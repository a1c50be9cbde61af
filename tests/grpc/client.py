"""A gRPC client for tests/grpc.rs: one call through TARGET (host:port,
cleartext HTTP/2), printed as one JSON object.

    client.py TARGET CALL [OPTIONS_JSON]

CALL is `unary` (/demo.Echo/Say, or OPTIONS' "method"), `server_stream`
(Count 3), `bidi` (Chat, lock-step: each message is sent only after the
answer to the one before has arrived, so it passes only if both directions
stream), `slow` (Slow, OPTIONS' "seconds") or `fail` (Fail).
OPTIONS: "metadata" {k: v}, "timeout" (seconds, default 10), "retry"
(a retry policy on RESOURCE_EXHAUSTED, 3 attempts, 10 ms backoff, so a
retry waits longer only when the server's pushback says so), "calls" (for
`unary`: that many calls one after the other on one channel; the output is
the last one's).

Output: {"code", "details", "initial", "trailing", "responses", "codes"};
the values of `-bin` metadata are base64; "codes" lists every call's code.
"""

import base64
import json
import queue
import sys

import grpc


def metadata(md):
    out = {}
    for key, value in md or ():
        if key.endswith("-bin"):
            value = base64.b64encode(value).decode()
        out[key] = value
    return out


def main():
    target, kind = sys.argv[1], sys.argv[2]
    opts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    options = []
    if opts.get("retry"):
        config = {
            "methodConfig": [
                {
                    "name": [{"service": "demo.Echo"}],
                    "retryPolicy": {
                        "maxAttempts": 3,
                        "initialBackoff": "0.01s",
                        "maxBackoff": "0.01s",
                        "backoffMultiplier": 1,
                        "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                    },
                }
            ]
        }
        options += [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
    channel = grpc.insecure_channel(target, options=options)
    meta = tuple(opts.get("metadata", {}).items())
    timeout = opts.get("timeout", 10)
    responses = []
    codes = []
    try:
        if kind == "unary":
            method = opts.get("method", "/demo.Echo/Say")
            for _ in range(opts.get("calls", 1) - 1):
                try:
                    _, earlier = channel.unary_unary(method).with_call(
                        b"hello", metadata=meta, timeout=timeout
                    )
                except grpc.RpcError as e:
                    earlier = e
                codes.append(earlier.code().name)
            response, call = channel.unary_unary(method).with_call(
                b"hello", metadata=meta, timeout=timeout
            )
            responses.append(response)
        elif kind == "server_stream":
            call = channel.unary_stream("/demo.Echo/Count")(b"3", metadata=meta, timeout=timeout)
            for r in call:
                responses.append(r)
        elif kind == "bidi":
            outbox = queue.Queue()
            outbox.put(b"m0")

            def requests():
                while True:
                    m = outbox.get()
                    if m is None:
                        return
                    yield m

            call = channel.stream_stream("/demo.Echo/Chat")(
                requests(), metadata=meta, timeout=timeout
            )
            for r in call:
                responses.append(r)
                outbox.put(b"m%d" % len(responses) if len(responses) < 3 else None)
        elif kind == "slow":
            seconds = str(opts.get("seconds", 1)).encode()
            response, call = channel.unary_unary("/demo.Echo/Slow").with_call(
                seconds, metadata=meta, timeout=timeout
            )
            responses.append(response)
        elif kind == "fail":
            response, call = channel.unary_unary("/demo.Echo/Fail").with_call(
                b"x", metadata=meta, timeout=timeout
            )
            responses.append(response)
        else:
            raise SystemExit("unknown call " + kind)
    except grpc.RpcError as e:
        call = e
    codes.append(call.code().name)
    print(
        json.dumps(
            {
                "code": call.code().name,
                "details": call.details(),
                "initial": metadata(call.initial_metadata()),
                "trailing": metadata(call.trailing_metadata()),
                "responses": [r.decode() for r in responses],
                "codes": codes,
            }
        )
    )


if __name__ == "__main__":
    main()
