#!/usr/bin/python3
"""Off-the-shelf client test: Debian's python3-grpcio against rpc_test_server (k3_rpc).

Stubs come from `protoc --python_out` over proto/ (no grpc_tools; C-STACK.md §2, P2/P3):
methods are called through channel.unary_unary / unary_stream with the message classes'
SerializeToString / FromString. Checks: unary + metadata echo, INVALID_ARGUMENT naming the
field, streaming (1000 messages, in order), deadline -> DEADLINE_EXCEEDED, client cancel seen by
the server, unknown method -> UNIMPLEMENTED, health Check/Watch including the NOT_SERVING +
UNAVAILABLE transition on SIGTERM, and a clean server exit. Every wait is bounded.

Usage: interop.py --server PATH --gen DIR [--bench PATH]
"""
import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time

import grpc


def load_stubs(gen):
    sys.path.insert(0, gen)
    from k3pd.v1 import common_pb2, decode_pb2  # noqa: E402
    decode_pb2.StopConditions = common_pb2.StopConditions  # shared message, one name space here
    # grpc.health.v1 cannot be imported as a package: `grpc` is grpcio's own package.
    path = os.path.join(gen, "grpc", "health", "v1", "health_pb2.py")
    spec = importlib.util.spec_from_file_location("k3pd_health_pb2", path)
    health_pb2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(health_pb2)
    return decode_pb2, health_pb2


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok -", what, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--bench", help="rpc_bench binary: two-process C client figures")
    args = ap.parse_args()
    d, h = load_stubs(args.gen)

    srv = subprocess.Popen([args.server, "--max-seconds", "40"], stdout=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline()
        check(line.startswith("PORT "), "server printed its port")
        target = "127.0.0.1:%d" % int(line.split()[1])
        ch = grpc.insecure_channel(target)
        grpc.channel_ready_future(ch).result(timeout=10)

        reserve = ch.unary_unary("/k3pd.v1.Decode/Reserve",
                                 request_serializer=d.ReserveRequest.SerializeToString,
                                 response_deserializer=d.Reservation.FromString)
        attach = ch.unary_stream("/k3pd.v1.Decode/Attach",
                                 request_serializer=d.AttachRequest.SerializeToString,
                                 response_deserializer=d.AttachResponse.FromString)
        stats = ch.unary_unary("/k3pd.v1.Decode/Stats",
                               request_serializer=d.StatsRequest.SerializeToString,
                               response_deserializer=d.StatsResponse.FromString)
        hcheck = ch.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=h.HealthCheckRequest.SerializeToString,
                                response_deserializer=h.HealthCheckResponse.FromString)
        hwatch = ch.unary_stream("/grpc.health.v1.Health/Watch",
                                 request_serializer=h.HealthCheckRequest.SerializeToString,
                                 response_deserializer=h.HealthCheckResponse.FromString)

        # unary + metadata
        r = reserve(d.ReserveRequest(request_id="py-1", n_prompt_tokens=21, max_new_tokens=3,
                                     lease_ms=100), timeout=5)
        check(r.request_id == "py-1" and r.epoch == 42 and r.n_pages == 24, "unary round trip")
        r, call = reserve.with_call(d.ReserveRequest(request_id="py-2", n_prompt_tokens=1,
                                                     max_new_tokens=1, lease_ms=1),
                                    timeout=5, metadata=(("x-request-id", "trace-9"),))
        md = dict(call.initial_metadata())
        check(r.request_id == "trace-9" and md.get("x-request-id") == "trace-9",
              "x-request-id reaches the handler and is echoed")
        t0 = time.monotonic()
        for _ in range(200):
            reserve(d.ReserveRequest(request_id="lat", n_prompt_tokens=1, max_new_tokens=1,
                                     lease_ms=1), timeout=5)
        print("python unary: %.0f us/call" % ((time.monotonic() - t0) / 200 * 1e6))

        # INVALID_ARGUMENT naming the field
        try:
            reserve(d.ReserveRequest(request_id="bad", n_prompt_tokens=0, max_new_tokens=1,
                                     lease_ms=1), timeout=5)
            check(False, "invalid request rejected")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT
                  and e.details() == "n_prompt_tokens: must be >= 1",
                  "INVALID_ARGUMENT names the field")

        # streaming
        t0 = time.monotonic()
        msgs = list(attach(d.AttachRequest(request_id="s", stop=d.StopConditions(max_new_tokens=1000)),
                           timeout=10))
        dt = time.monotonic() - t0
        check(len(msgs) == 1000 and all(m.first_index == i and list(m.token_ids) == [i]
                                        for i, m in enumerate(msgs)),
              "stream of 1000 messages in order (%.0f msgs/s in python)" % (1000 / dt))

        # deadline
        t0 = time.monotonic()
        try:
            reserve(d.ReserveRequest(request_id="slow", n_prompt_tokens=1, max_new_tokens=1,
                                     lease_ms=1), timeout=0.2)
            check(False, "slow call times out")
        except grpc.RpcError as e:
            ms = (time.monotonic() - t0) * 1000
            check(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and 150 <= ms < 3000,
                  "DEADLINE_EXCEEDED after %.0f ms" % ms)

        # client cancel mid-stream: the server's handler observes it
        it = attach(d.AttachRequest(request_id="endless"), timeout=10)
        got = 0
        for m in it:
            got += 1
            if got == 25:
                it.cancel()
                break
        check(it.code() == grpc.StatusCode.CANCELLED, "client cancel -> CANCELLED")
        end = time.monotonic() + 5
        cancels = 0
        while time.monotonic() < end:
            cancels = stats(d.StatsRequest(), timeout=5).leases_expired
            if cancels >= 2:  # the deadline above + this cancel
                break
            time.sleep(0.02)
        check(cancels >= 2, "server handlers saw deadline + cancel (%d)" % cancels)

        # unknown method
        nope = ch.unary_unary("/k3pd.v1.Decode/Nope",
                              request_serializer=d.StatsRequest.SerializeToString,
                              response_deserializer=d.StatsResponse.FromString)
        try:
            nope(d.StatsRequest(), timeout=5)
            check(False, "unknown method rejected")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "unknown method -> UNIMPLEMENTED")

        if args.bench:
            b = subprocess.run([args.bench, target, "2000", "10000"], capture_output=True,
                               text=True, timeout=30)
            print(b.stdout, end="")
            check(b.returncode == 0, "C client (rpc_bench) unary + 10k stream against the server")

        # health
        SERVING = h.HealthCheckResponse.SERVING
        NOT_SERVING = h.HealthCheckResponse.NOT_SERVING
        check(hcheck(h.HealthCheckRequest(service=""), timeout=5).status == SERVING,
              "health Check '' SERVING")
        check(hcheck(h.HealthCheckRequest(service="k3pd.v1.Decode"), timeout=5).status == SERVING,
              "health Check k3pd.v1.Decode SERVING")
        try:
            hcheck(h.HealthCheckRequest(service="nope.Svc"), timeout=5)
            check(False, "unknown service")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND, "health Check unknown -> NOT_FOUND")
        watch = hwatch(h.HealthCheckRequest(service=""), timeout=15)
        first = next(watch)
        check(first.status == SERVING, "health Watch starts SERVING")
        srv.send_signal(signal.SIGTERM)  # graceful shutdown: NOT_SERVING, then the stream ends
        seen = []
        try:
            for m in watch:
                seen.append(m.status)
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE, "Watch ends UNAVAILABLE on shutdown")
        check(seen == [NOT_SERVING], "Watch saw NOT_SERVING on drain (%s)" % seen)
        rc = srv.wait(timeout=10)
        check(rc == 0, "server exited cleanly (rc %d)" % rc)
        ch.close()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(timeout=5)
    print("interop: all checks passed")


if __name__ == "__main__":
    main()
