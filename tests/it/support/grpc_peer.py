"""A real gRPC server and client (Python grpcio) for the proxy's tests. No .proto: the methods
take and return raw bytes, which is all gRPC needs on the wire.

    grpc_peer.py server [CERT KEY]   prints the port it serves on (cleartext HTTP/2, or TLS with
                                     CERT and KEY), then serves until its stdin closes (the test
                                     that started it ends)
    grpc_peer.py client TARGET [--ca FILE] CALL...
                                     CALL is METHOD:KEY (KEY sent as x-api-key metadata); prints
                                     one JSON line per call: method, key, code, details, metadata

Methods of orders.v1.Orders: Get (unary), List (server streaming: three replies), Upload (client
streaming: three requests), Chat (bidirectional: three each way) and Usage (unary, reporting the
tokens it used, its request's number, in the trailer x-usage-total-tokens, as LLM gateways do).
"""
import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "orders.v1.Orders"


def serve(tls):
    def get(request, context):
        return b"order:" + request

    def list_(request, context):
        for i in range(3):
            yield b"item%d" % i

    def upload(requests, context):
        return b"got %d" % sum(1 for _ in requests)

    def chat(requests, context):
        for r in requests:
            yield b"echo:" + r

    def slow_usage(request, context):
        # Five replies 100 ms apart, the usage in the trailers after them: a client that cancels
        # after the first has not seen it yet.
        context.set_trailing_metadata((("x-usage-total-tokens", "50"),))
        for i in range(5):
            time.sleep(0.1)
            yield b"part%d" % i

    def usage(request, context):
        context.set_trailing_metadata((("x-usage-total-tokens", request.decode()),))
        return b"used " + request

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Get": grpc.unary_unary_rpc_method_handler(get),
            "List": grpc.unary_stream_rpc_method_handler(list_),
            "Upload": grpc.stream_unary_rpc_method_handler(upload),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
            "Usage": grpc.unary_unary_rpc_method_handler(usage),
            "SlowUsage": grpc.unary_stream_rpc_method_handler(slow_usage),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    if tls:
        cert, key = (open(f, "rb").read() for f in tls)
        creds = grpc.ssl_server_credentials([(key, cert)])
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    # Ends with the test: its end closes our stdin.
    sys.stdin.read()
    server.stop(0)


def metadata(call_or_error):
    md = {}
    for getter in ("initial_metadata", "trailing_metadata"):
        try:
            for k, v in getattr(call_or_error, getter)() or ():
                md[k] = v if isinstance(v, str) else v.decode("latin-1")
        except Exception:
            pass
    return md


def call(channel, method, key):
    path = "/%s/%s" % (SERVICE, method)
    md = (("x-api-key", key),)
    three = lambda: iter([b"a", b"b", b"c"])
    try:
        if method in ("Get", "Usage"):
            reply, c = channel.unary_unary(path).with_call(b"42", metadata=md, timeout=10)
            replies = [reply]
        elif method == "SlowUsageCancel":
            # The first reply, then RST_STREAM(CANCEL): the trailers never reach this client.
            c = channel.unary_stream("/%s/SlowUsage" % SERVICE)(b"", metadata=md, timeout=10)
            replies = [next(c)]
            c.cancel()
            return {"code": "CANCELLED", "details": "", "replies": [r.decode() for r in replies], "metadata": {}}
        elif method == "List":
            c = channel.unary_stream(path)(b"", metadata=md, timeout=10)
            replies = list(c)
        elif method == "Upload":
            reply, c = channel.stream_unary(path).with_call(three(), metadata=md, timeout=10)
            replies = [reply]
        elif method == "Chat":
            c = channel.stream_stream(path)(three(), metadata=md, timeout=10)
            replies = list(c)
        else:
            raise SystemExit("unknown method " + method)
        return {
            "code": "OK",
            "details": "",
            "replies": [r.decode() for r in replies],
            "metadata": metadata(c),
        }
    except grpc.RpcError as e:
        return {
            "code": e.code().name,
            "details": e.details() or "",
            "replies": [],
            "metadata": metadata(e),
        }


def client(args):
    target = args[0]
    args = args[1:]
    if args[:1] == ["--ca"]:
        creds = grpc.ssl_channel_credentials(root_certificates=open(args[1], "rb").read())
        channel = grpc.secure_channel(target, creds)
        args = args[2:]
    else:
        channel = grpc.insecure_channel(target)
    for spec in args:
        method, key = spec.split(":", 1)
        out = call(channel, method, key)
        out.update({"method": method, "key": key})
        print(json.dumps(out), flush=True)
    channel.close()
    # grpcio's threads can deadlock the interpreter's exit now and then (the test then waits on a
    # process that printed all it had to): everything is said, so leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(sys.argv[2:4])
    else:
        client(sys.argv[2:])
