#!/usr/bin/env python3
"""A CRI client built on grpcio (gRPC C-core) for criguard's tests and benchmarks.

Messages travel as raw bytes (no generated code): grpcio passes bytes through
when a method has no serializer.

Usage:
  cripy.py client [--authority A] TARGET
      JSON lines on stdin, answers on stdout (the protocol of crigo client):
      {"id", "method", "req": base64, "md": [[k, v]...], "timeout_ms", "stream"}
      -> {"id", "msg"} per streamed message, then
         {"id", "done": true, "code", "message", "msgs", "header", "trailer", "micros"}
  cripy.py bench [--n N] [--warmup W] [--authority A] --method M --req BASE64 TARGET...
      N calls per target, targets alternated call by call; prints
      "TARGET_INDEX NANOSECONDS" lines.

TARGET is what grpc.insecure_channel takes, e.g. unix:/run/x.sock (C-core then
sends a percent-encoded :authority); --authority sets grpc.default_authority.
"""

import argparse
import base64
import json
import sys
import threading
import time

import grpc

MAX_MSG = 16 << 20  # the kubelet's CRI message limit


def channel(target, authority=None):
    opts = [
        ("grpc.max_receive_message_length", MAX_MSG),
        ("grpc.max_send_message_length", MAX_MSG),
    ]
    if authority is not None:
        opts.append(("grpc.default_authority", authority))
    return grpc.insecure_channel(target, options=opts)


def pairs(md):
    out = []
    for k, v in md or ():
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        out.append([k, v])
    return sorted(out)


class Out:
    """Writes JSON lines from concurrent calls, one at a time."""

    def __init__(self):
        self.lock = threading.Lock()

    def write(self, obj):
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self.lock:
            sys.stdout.write(line)
            sys.stdout.flush()


def b64(b):
    return base64.b64encode(b).decode()


def answer(cid, call, msgs, start):
    return {
        "id": cid,
        "done": True,
        "code": call.code().value[0],
        "message": call.details() or "",
        "msgs": [b64(m) for m in msgs],
        "header": pairs(call.initial_metadata()),
        "trailer": pairs(call.trailing_metadata()),
        "micros": (time.perf_counter_ns() - start) // 1000,
    }


def refused(cid, e):
    """The answer for a call grpcio would not start."""
    return {"id": cid, "done": True, "code": grpc.StatusCode.INTERNAL.value[0],
            "message": f"{type(e).__name__}: {e}", "msgs": [], "header": [],
            "trailer": [], "micros": 0}


def run_client(args):
    ch = channel(args.target, args.authority)
    out = Out()
    pending = threading.Semaphore(0)
    started = 0
    for line in sys.stdin:
        c = json.loads(line)
        cid = c["id"]
        req = base64.b64decode(c.get("req") or "")
        md = [tuple(kv) for kv in c.get("md") or []]
        timeout = c.get("timeout_ms") or 0
        timeout = timeout / 1000 if timeout > 0 else None
        start = time.perf_counter_ns()
        started += 1
        if c.get("stream"):
            threading.Thread(
                target=stream, args=(ch, c["method"], req, md, timeout, cid, out, start, pending)
            ).start()
            continue
        try:
            fut = ch.unary_unary(c["method"]).future(req, timeout=timeout, metadata=md)
        except Exception as e:  # e.g. metadata grpcio refuses to send
            out.write(refused(cid, e))
            pending.release()
            continue

        def done(f, cid=cid, start=start):
            try:
                msgs = [] if f.exception() is not None else [f.result()]
                out.write(answer(cid, f, msgs, start))
            except Exception as e:  # never leave the test waiting
                out.write(refused(cid, e))
            pending.release()

        fut.add_done_callback(done)
    for _ in range(started):
        pending.acquire()


def stream(ch, method, req, md, timeout, cid, out, start, pending):
    try:
        it = ch.unary_stream(method)(req, timeout=timeout, metadata=md)
    except Exception as e:
        out.write(refused(cid, e))
        pending.release()
        return
    msgs = []
    try:
        for m in it:
            msgs.append(m)
            out.write({"id": cid, "msg": b64(m)})
    except grpc.RpcError:
        pass  # the status is read from the call below
    out.write(answer(cid, it, msgs, start))
    pending.release()


def run_bench(args):
    req = base64.b64decode(args.req)
    calls = [channel(t, args.authority).unary_unary(args.method) for t in args.targets]
    for _ in range(args.warmup):
        for c in calls:
            c(req)
    times = []
    n = len(calls)
    for i in range(args.n):
        for k in range(n):
            t = (i + k) % n
            start = time.perf_counter_ns()
            calls[t](req)
            times.append((t, time.perf_counter_ns() - start))
    sys.stdout.write("".join(f"{t} {ns}\n" for t, ns in times))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("client")
    c.add_argument("--authority")
    c.add_argument("target")
    b = sub.add_parser("bench")
    b.add_argument("--n", type=int, default=1000)
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--method", required=True)
    b.add_argument("--req", required=True)
    b.add_argument("--authority")
    b.add_argument("targets", nargs="+")
    args = p.parse_args()
    (run_client if args.cmd == "client" else run_bench)(args)


if __name__ == "__main__":
    main()
