#!/usr/bin/env python3
"""Where a traced step's compute stream waits: idle gaps of the busiest stream of a Kineto trace
(TESSERA_PROFILE), split into gaps spent waiting while a communication kernel runs (NCCL's, or the
timed fake communicator's spin kernel) and other gaps (the host not keeping up, event waits on
nothing), how much of the idle time waited for the host to launch the next kernel, with the
largest gaps and the CPU op the next compute kernel was launched from.
  bench/profile/gaps.py trace.json[.gz] [--top N]
"""
import argparse, bisect, gzip, json, re, sys

COMM = re.compile(r"nccl|spinKernel", re.I)


def load(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["traceEvents"]


def merge(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(a, b):  # total overlap of two merged interval lists
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            tot += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tot


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    ev = load(a.trace)
    kernels = [e for e in ev if e.get("cat") == "kernel" and "dur" in e]
    gpu_mem = [e for e in ev if e.get("cat") in ("gpu_memcpy", "gpu_memset") and "dur" in e]
    by_stream = {}
    for e in kernels + gpu_mem:
        by_stream.setdefault(e["args"].get("stream"), []).append(e)
    comm = [e for e in kernels if COMM.search(e["name"])]
    comm_streams = {e["args"].get("stream") for e in comm}
    if not comm:
        print(f"trace {a.trace}: no communication kernels")
    compute_stream = max((s for s in by_stream if s not in comm_streams or len(by_stream) == 1),
                         key=lambda s: sum(e["dur"] for e in by_stream[s]))
    comp = sorted(by_stream[compute_stream], key=lambda e: e["ts"])
    t0, t1 = comp[0]["ts"], max(e["ts"] + e["dur"] for e in comp)
    busy = merge([(e["ts"], e["ts"] + e["dur"]) for e in comp])
    comm_iv = merge([(e["ts"], e["ts"] + e["dur"]) for e in comm])
    # CPU ops, for naming the launch site of the kernel after a gap (by correlation id).
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    cpu_ops = sorted([e for e in ev if e.get("cat") == "cpu_op" and "dur" in e], key=lambda e: e["ts"])
    starts = [e["ts"] for e in cpu_ops]

    def launcher(k):
        r = runtime.get(k["args"].get("correlation"))
        if not r:
            return "?"
        best = None
        i = bisect.bisect_right(starts, r["ts"])
        for e in reversed(cpu_ops[max(0, i - 400):i]):
            if e["ts"] <= r["ts"] <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
                best = e
        return best["name"] if best else "?"

    # Host-bound idle: the kernel after a gap was launched (its runtime call ended) after the
    # gap began, so the GPU waited for the host; otherwise it was queued already and the GPU
    # waited on something else (an event, a stream wait, the launch latency between kernels).
    host_bound = 0.0
    for k0, k1 in zip(comp, comp[1:]):
        g = k1["ts"] - (k0["ts"] + k0["dur"])
        r = runtime.get(k1["args"].get("correlation"))
        if g > 0 and r and r["ts"] + r["dur"] > k0["ts"] + k0["dur"]:
            host_bound += g
    gaps = []
    for (s0, e0), (s1, e1) in zip(busy, busy[1:]):
        g = s1 - e0
        if g <= 0:
            continue
        c = overlap([[e0, s1]], comm_iv)
        nxt = next(k for k in comp if k["ts"] >= s1)
        gaps.append((g, c, e0, nxt))
    span = t1 - t0
    idle = sum(g for g, _, _, _ in gaps)
    idle_comm = sum(c for _, c, _, _ in gaps)
    comm_total = sum(e - s for s, e in comm_iv)
    print(f"trace {a.trace}: compute stream {compute_stream}, comm streams {sorted(comm_streams, key=str)}")
    print(f"span {span/1e3:.2f} ms, compute busy {(span-idle)/1e3:.2f} ms, idle {idle/1e3:.2f} ms "
          f"(while communication ran: {idle_comm/1e3:.2f} ms, otherwise {(idle-idle_comm)/1e3:.2f} ms)")
    print(f"idle waiting for the host's launch {host_bound/1e3:.2f} ms (kernels {len(comp)}; under the profiler, "
          f"which slows the host: TESSERA_PROFILE_CPU=0 slows it less)")
    print(f"communication kernels {len(comm)}, {comm_total/1e3:.2f} ms busy, of which beside compute "
          f"{overlap(comm_iv, busy)/1e3:.2f} ms")
    agg = {}
    for g, c, _, nxt in gaps:
        k = (nxt["name"][:50], launcher(nxt))
        t = agg.setdefault(k, [0, 0.0, 0.0])
        t[0] += 1
        t[1] += g
        t[2] += c
    print("idle before each kind of kernel (ms): count, idle, of it beside communication, kernel <- launching op")
    for (name, op), (n, g, c) in sorted(agg.items(), key=lambda x: (-x[1][2], -x[1][1]))[:a.top]:
        print(f"  {n:5d} {g/1e3:7.2f} {c/1e3:7.2f}  {name} <- {op}")
    print(f"largest gaps (us): gap, of it beside communication, at ms, next kernel <- launching op")
    for g, c, at, nxt in sorted(gaps, key=lambda x: -x[0])[:a.top]:
        print(f"  {g:8.1f} {c:8.1f}  {(at-t0)/1e3:8.3f}  {nxt['name'][:60]} <- {launcher(nxt)}")


if __name__ == "__main__":
    sys.exit(main())
