"""A gRPC server for tests/grpc.rs: service demo.Echo on 127.0.0.1, on a
free port it prints as its first line, until its stdin closes.

No .proto file: generic handlers with no serializers, so every message is
raw bytes. `--tls CERT KEY` serves over TLS (ALPN h2) instead of h2c.

Methods:
  Say    unary: echoes the message; initial metadata `x-echo` repeats the
         caller's `x-client-meta`, trailers `x-trailer: done` and a binary
         `x-bin-bin`.
  Count  server streaming: the message is a number N; answers "0".."N-1",
         trailer `x-count: N`.
  Chat   bidirectional: answers "echo:<m>" to each message as it comes,
         trailer `x-messages: <count>`.
  Slow   unary: sleeps the number of seconds the message says, then "late".
  Fail   unary: NOT_FOUND "no such thing", trailer `x-why: testing`.
"""

import sys
import time
from concurrent import futures

import grpc


def say(request, context):
    meta = dict(context.invocation_metadata())
    context.send_initial_metadata((("x-echo", meta.get("x-client-meta", "")),))
    context.set_trailing_metadata((("x-trailer", "done"), ("x-bin-bin", b"\x00\x01\xfe")))
    return request


def count(request, context):
    n = int(request.decode())
    for i in range(n):
        yield str(i).encode()
    context.set_trailing_metadata((("x-count", str(n)),))


def chat(requests, context):
    n = 0
    for message in requests:
        n += 1
        yield b"echo:" + message
    context.set_trailing_metadata((("x-messages", str(n)),))


def slow(request, context):
    time.sleep(float(request.decode()))
    return b"late"


def fail(request, context):
    context.set_trailing_metadata((("x-why", "testing"),))
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    handler = grpc.method_handlers_generic_handler(
        "demo.Echo",
        {
            "Say": grpc.unary_unary_rpc_method_handler(say),
            "Count": grpc.unary_stream_rpc_method_handler(count),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Slow": grpc.unary_unary_rpc_method_handler(slow),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    if len(sys.argv) == 4 and sys.argv[1] == "--tls":
        with open(sys.argv[2], "rb") as f:
            cert = f.read()
        with open(sys.argv[3], "rb") as f:
            key = f.read()
        creds = grpc.ssl_server_credentials([(key, cert)])
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
