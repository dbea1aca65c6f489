#!/usr/bin/env python3
"""Python store put/get against the Go client, in the same run.

Starts a crescent-master (bin/, `make build`), then for each value size
and mode runs `crescent-bench store` (the Go client: one client, one
thread) and the same loop from Python through libcrescent.so (one client,
one thread, the same segment and staging sizes, the same ring of put keys
removed once per lap), and prints ops/s, GB/s and the ratio Python/Go,
then the CPU time per operation of each process (Python: the whole
process over the timed loop, its Go threads included; Go: the difference
of a full and a quarter-length run, so setup cancels) and their ratio
Go/Python: on a shared machine throughput swings with the neighbours,
CPU per operation much less.

Modes: "staged" is Put/Get of ordinary memory (Go heap slices; Python
bytes in, bytes out); "zero-copy" is PutFrom/GetInto on a registered
buffer (Python: an mmap given to register_buffer).

    python3 python/bench.py [--duration 2] [--rounds 3] [--sizes 1MiB,4KiB]
"""

import argparse
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "tests"))
os.environ.setdefault("CRESCENT_LIB", os.path.join(REPO, "build", "libcrescent.so"))

import crescent  # noqa: E402
from harness import Cluster  # noqa: E402

SEGMENT = 256 << 20
STAGING = 64 << 20


def size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[:-len(u)]) * m
    return int(s)


def _go_run(master, op, vs, zero_copy, duration):
    """(ops/s, ops, CPU seconds of the whole process) of one crescent-bench run."""
    p = subprocess.Popen([os.path.join(REPO, "bin", "crescent-bench"), "store", "--master", master, "--clients", "1",
                          "--threads", "1", "--operation", op, "--value_size", str(vs), "--duration", str(duration),
                          "--warmup", "0.5", "--baseline", "none", f"--zero_copy={str(zero_copy).lower()}",
                          "--segment_size", str(SEGMENT), "--local_buffer_size", str(STAGING), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=duration * 10 + 60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    # communicate reaped the child; its CPU is in RUSAGE_CHILDREN deltas,
    # so the caller brackets each run.
    if p.returncode != 0:
        raise RuntimeError(err)
    ops_s = json.loads(out)["ops_per_sec"]
    return ops_s, ops_s * duration


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def go_bench(master, op, vs, zero_copy, duration):
    """(ops/s, CPU seconds per op) of the Go client. The CPU is the
    difference of a full and a short run (setup and warm-up cancel)."""
    c0 = _children_cpu()
    short_ops_s, short_ops = _go_run(master, op, vs, zero_copy, duration / 4)
    c1 = _children_cpu()
    ops_s, ops = _go_run(master, op, vs, zero_copy, duration)
    c2 = _children_cpu()
    extra = ops - short_ops
    cpu = ((c2 - c1) - (c1 - c0)) / extra if extra > 0 else float("nan")
    return ops_s, cpu


def py_bench(master, op, vs, zero_copy, duration, tag):
    # A client per figure, as the Go bench has: a segment that outlived a
    # Go run would receive the Go client's values and evict ours.
    with crescent.Store(master, local_hostname="127.0.0.1", global_segment_size=SEGMENT,
                        local_buffer_size=STAGING) as s:
        return _py_bench(s, op, vs, zero_copy, duration, tag)


def _py_bench(s, op, vs, zero_copy, duration, tag):
    # Keys sized like the Go bench's: a ring of puts filling at most half
    # the segment, or a set of keys to read.
    n = max(4, min(1024, int(0.5 * SEGMENT / (vs + vs // 8 + 64))))
    keys = [f"pybench/{tag}/{op}/{vs}/{i}" for i in range(n)]
    buf = mmap.mmap(-1, 2 * vs)
    buf[:vs] = os.urandom(vs)
    value = bytes(buf[:vs])
    addr = s.register_buffer(buf) if zero_copy else None
    # As in the Go bench (one client: one segment), values live in this
    # client's own segment.
    rc = crescent.ReplicateConfig(preferred_segment=s.hostname)
    if op == "get":
        for k in keys:
            s.put(k, value, rc)

    def put(k):
        if zero_copy:
            s.put_from(k, addr, vs, rc)
        else:
            s.put(k, value, rc)

    def get(k):
        if zero_copy:
            s.get_into_ptr(k, addr + vs, vs)
        else:
            assert len(s.get(k)) == vs

    step = put if op == "put" else get
    ops, i, lap, cpu0 = 0, 0, False, 0.0
    start = time.perf_counter()
    warm = start + 0.5
    end = warm + duration
    counting = False
    while True:
        now = time.perf_counter()
        if not counting and now >= warm:
            counting, ops, t0, cpu0 = True, 0, now, _self_cpu()
        if now >= end:
            break
        if op == "put" and i == 0 and lap:
            s.remove_batch(keys)  # not forced: an admin operation; put keys have no lease
            lap = False
        step(keys[i])
        ops += 1
        i += 1
        if i == len(keys):
            i, lap = 0, True
    elapsed, cpu = time.perf_counter() - t0, _self_cpu() - cpu0
    s.remove_batch(keys)  # not forced: an admin operation; put keys have no lease
    if zero_copy:
        s.unregister_buffer(addr)
    return ops / elapsed, cpu / max(ops, 1)


def _self_cpu():
    # The whole process: Python and the library's Go threads.
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating Go/Python rounds; the median is printed")
    ap.add_argument("--sizes", default="1MiB,4KiB")
    ap.add_argument("--modes", default="staged,zero-copy")
    a = ap.parse_args()
    cl = Cluster(clients=0)
    try:
        print(f"master {cl.master}; one client, one thread each; median of {a.rounds} alternating rounds "
              f"of {a.duration:g} s")
        print(f"{'op':4} {'size':>8} {'mode':10} {'python ops/s':>13} {'GB/s':>7} {'go ops/s':>10} {'GB/s':>7} "
              f"{'py/go':>6} {'py us/op':>9} {'go us/op':>9} {'cpu go/py':>9}")
        for sz in a.sizes.split(","):
            vs = size(sz)
            for mode in a.modes.split(","):
                zc = mode == "zero-copy"
                for op in ("put", "get"):
                    gs, ps, gc, pc = [], [], [], []
                    for _ in range(a.rounds):  # alternate, so both see the same machine
                        r, c = go_bench(cl.master, op, vs, zc, a.duration)
                        gs.append(r)
                        gc.append(c)
                        r, c = py_bench(cl.master, op, vs, zc, a.duration, mode)
                        ps.append(r)
                        pc.append(c)
                    g, p = statistics.median(gs), statistics.median(ps)
                    gcpu, pcpu = statistics.median(gc) * 1e6, statistics.median(pc) * 1e6
                    print(f"{op:4} {sz:>8} {mode:10} {p:13.0f} {p * vs / 1e9:7.2f} {g:10.0f} {g * vs / 1e9:7.2f} "
                          f"{p / g:6.2f} {pcpu:9.1f} {gcpu:9.1f} {gcpu / pcpu:9.2f}", flush=True)
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
