"""A gRPC client on gRPC C-core (Debian python3-grpcio): an HTTP/2 stack
independent of grpc-go's. It reads phases from stdin as JSON,
[{"method": "/pkg.Svc/M", "requests": [base64, ...], "workers": N}, ...],
makes each phase's calls with N threads on one channel (one connection),
and prints one line per call, in order: "ok <base64 reply>" or
"err <status code name> <details>"."""

import base64
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc


def main():
    addr = sys.argv[1]
    phases = json.load(sys.stdin)
    limit = 64 << 20
    opts = [("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit)]
    with grpc.insecure_channel(addr, options=opts) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        for ph in phases:
            call = ch.unary_unary(ph["method"])

            def one(req):
                try:
                    rep = call(base64.b64decode(req), timeout=60)
                    return "ok " + base64.b64encode(rep).decode()
                except grpc.RpcError as e:
                    return "err %s %s" % (e.code().name, e.details())

            with ThreadPoolExecutor(max_workers=ph["workers"]) as ex:
                for line in ex.map(one, ph["requests"]):
                    print(line)
            print("phase")
            sys.stdout.flush()


main()
