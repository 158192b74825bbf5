#!/usr/bin/env python3
"""Issue 53's design question for collective matmul, measured: does a GPU-to-GPU copy moved by the copy engines
hide fully behind a large bf16 GEMM that fills every SM, where an NCCL collective beside the same GEMM (whose
kernels need SMs of their own) does not?

One process drives G GPUs (G = tp: 2, then 4 where the machine has them); each GPU runs the column-parallel GEMM of
a 70B-wide MLP, [M x K] x [K x FFN/tp] (M = K = 8192 tokens x d, FFN 28672), and receives the all-gather of
sequence parallelism: the other ranks' shards of the [M x K] bf16 input, (tp - 1)/tp x M x K x 2 bytes. The
transfer is made three ways:
  copy engine  dst.copy_(peer's src) between GPUs with peer access (ATen: cudaMemcpyAsync over UVA on the
               source GPU's current stream, no kernel, behind a two-way event barrier with the destination's
               current stream), one side stream per (source, destination) pair, so every pair's copy runs at once
  raw copy     the same bytes by cudaMemcpyAsync called directly (CuPy's runtime binding on torch's pointers and
               streams), pulled on a side stream of the destination GPU per peer: no barrier, no ATen
  nccl         torch.cuda.nccl.all_gather over the G GPUs (one communicator per GPU in this process: NCCL's
               kernels on a side stream per GPU)
Cases: gemm alone, each transfer alone, gemm + each transfer (the transfer issued first, then the GEMM on the
default streams). Each iteration is gated: a spin kernel on every GPU's default stream holds every stream until the
host has issued the whole case, so the device-side times hold no host issue time (Python issues slowly). CUDA events
on GPU 0, the median of REPS iterations after WARM: span_ms (from the gate to the later of the GEMM's end and GPU 0's
receipt), gemm_ms (the GEMM alone on its stream), comm_ms (from the gate to GPU 0's receipt).
hidden = (gemm alone + transfer alone - both) / transfer alone, over span_ms: 1 when the transfer costs the GEMM
nothing, 0 when they might as well run one after the other; gemm_slowdown = gemm_ms beside the transfer / alone.
Prints a table and, per case, "RESULT {json}"; --json PATH writes the rows for bench/results.py add (kind
collective). Env: REPS (20), WARM (3), TPS ("2 4"), M, K, FFN, SCALE (1: the payload times SCALE), SLEEP_CYCLES (the gate).
  python3 bench/tp/copy_overlap.py [--json rows.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

SLEEP_CYCLES = int(os.environ.get("SLEEP_CYCLES", 4_000_000))  # the gate's spin: about 2 ms at 1.98 GHz


def sync(devs):
    for d in devs:
        torch.cuda.synchronize(d)


def timed(fn, devs, reps, warm):
    """Median wall ms of fn() over reps (after warm), every GPU synchronised around each call; fn may return
    (events) pairs timed on the device, whose medians come back too."""
    for _ in range(warm):
        fn()
    sync(devs)
    walls, inner = [], {}
    for _ in range(reps):
        sync(devs)
        t0 = time.perf_counter()
        ev = fn()
        sync(devs)
        walls.append((time.perf_counter() - t0) * 1e3)
        for k, (a, b) in (ev or {}).items():
            inner.setdefault(k, []).append(a.elapsed_time(b))
    return statistics.median(walls), {k: statistics.median(v) for k, v in inner.items()}


def probe(tp, m, k, ffn, scale, reps, warm):
    devs = [torch.device("cuda", i) for i in range(tp)]
    n = ffn // tp
    shard = m // tp * scale  # rows each rank contributes to the all-gather
    torch.manual_seed(0)
    A = [torch.randn(m, k, device=d, dtype=torch.bfloat16) for d in devs]
    B = [torch.randn(k, n, device=d, dtype=torch.bfloat16) for d in devs]
    C = [torch.empty(m, n, device=d, dtype=torch.bfloat16) for d in devs]
    src = [torch.randn(shard, k, device=d, dtype=torch.bfloat16) for d in devs]
    gathered = [torch.empty(tp * shard, k, device=d, dtype=torch.bfloat16) for d in devs]
    peer = all(torch.cuda.can_device_access_peer(i, j) for i in range(tp) for j in range(tp) if i != j)
    # stream[j][i]: on GPU j (the source), carries the copy into GPU i; landing[i][j]: GPU i's side of it
    stream = [[torch.cuda.Stream(d) for _ in devs] for d in devs]
    landing = [[torch.cuda.Stream(d) for _ in devs] for d in devs]
    nccl_streams = [torch.cuda.Stream(d) for d in devs]
    marker = torch.cuda.Stream(devs[0])  # GPU 0's end-of-receipt event, off the GEMM's stream
    payload_mib = (tp - 1) * shard * k * 2 / 2**20  # bytes each GPU receives

    def gemm(ev):
        for i, d in enumerate(devs):
            with torch.cuda.device(d):
                if i == 0:
                    ev["gemm_ms"][0].record()
                torch.matmul(A[i], B[i], out=C[i])
                if i == 0:
                    ev["gemm_ms"][1].record()

    def copies(ev):  # ATen's cross-device copy_, issued on the source GPU's stream for that destination
        for i in range(tp):
            for j in range(tp):
                if i != j:
                    with torch.cuda.stream(stream[j][i]), torch.cuda.stream(landing[i][j]):
                        gathered[i][j * shard:(j + 1) * shard].copy_(src[j], non_blocking=True)
        for j in range(1, tp):  # GPU 0's receipt ends when its last incoming copy has landed
            marker.wait_stream(landing[0][j])
        ev["comm_ms"][1].record(marker)

    try:
        import cupy
    except ImportError:
        cupy = None

    def raw(ev):  # cudaMemcpyAsync pulled by each destination, no barrier: the copy engines alone
        nbytes = shard * k * 2
        for i in range(tp):
            with cupy.cuda.Device(i):
                for j in range(tp):
                    if i != j:
                        cupy.cuda.runtime.memcpyAsync(gathered[i][j * shard].data_ptr(), src[j].data_ptr(), nbytes, 4,
                                                      landing[i][j].cuda_stream)
        for j in range(1, tp):
            marker.wait_stream(landing[0][j])
        ev["comm_ms"][1].record(marker)

    def nccl(ev):
        torch.cuda.nccl.all_gather(src, gathered, streams=nccl_streams)
        ev["comm_ms"][1].record(nccl_streams[0])

    def case(comm, with_gemm):
        """One iteration, gated: a spin kernel on every GPU's default stream holds every stream of the case until
        the host has issued all of it, so the device-side times (CUDA events on GPU 0, from the gate) hold no
        host issue time: span_ms to the later of the GEMM's and the receipt's ends."""
        def fn():
            gates = []
            for i, d in enumerate(devs):
                with torch.cuda.device(d):
                    torch.cuda._sleep(SLEEP_CYCLES)
                    g = torch.cuda.Event(enable_timing=i == 0)
                    g.record()
                    gates.append(g)
                for s in stream[i] + landing[i] + [nccl_streams[i]] + ([marker] if i == 0 else []):
                    s.wait_event(g)
            with torch.cuda.device(devs[0]):
                ev = {k: (gates[0], torch.cuda.Event(enable_timing=True)) for k in ("span_ms", "comm_ms")}
                ev["gemm_ms"] = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if comm is not None:
                comm(ev)
            if with_gemm:
                gemm(ev)
            with torch.cuda.device(devs[0]):
                cur = torch.cuda.current_stream()
                for s in [marker, nccl_streams[0]]:
                    cur.wait_stream(s)
                ev["span_ms"][1].record()
            if comm is None:
                del ev["comm_ms"]
            if not with_gemm:
                del ev["gemm_ms"]
            return ev
        return fn

    if peer:  # peer access enabled (ATen enables it at a pair's first copy) before the raw copies
        with torch.cuda.device(devs[0]):
            copies({"comm_ms": (None, torch.cuda.Event())})
        sync(devs)
    transfers = ([("copy-engine", copies)] if peer else []) + ([("raw-copy-engine", raw)] if peer and cupy else []) + \
        [("nccl-all-gather", nccl)]
    cases = [("gemm", case(None, True))] + [(name, case(fn, False)) for name, fn in transfers] + \
        [("gemm+" + name, case(fn, True)) for name, fn in transfers]
    out = {}
    for name, fn in cases:
        try:
            wall, inner = timed(fn, devs, reps, warm)
        except Exception as e:  # noqa: BLE001  (one case failing must not lose the others)
            print(f"[copy_overlap] tp {tp} {name} failed: {type(e).__name__}: {e}", flush=True)
            continue
        out[name] = {k: round(v, 3) for k, v in inner.items()}
    # correctness of the transfers (the last iteration's): every GPU holds every other GPU's shard
    for i in range(tp):
        for j in range(tp):
            if i != j and not torch.equal(gathered[i][j * shard:(j + 1) * shard].cpu(), src[j].cpu()):
                print(f"[copy_overlap] tp {tp}: GPU {i}'s copy of GPU {j}'s shard differs", flush=True)
    rows = []
    flops = 2.0 * m * k * n
    for name, r in out.items():
        comm = name.split("+")[-1]
        row = dict(kind="collective", system=f"tp{tp}-{name}", op=name, gpus=tp, gemm=f"[{m} x {k}] x [{k} x {n}] bf16",
                   payload_mib=round(payload_mib, 1), peer_access=peer, **r)
        if name == "gemm":
            row["gemm_tflops"] = round(flops / (r["gemm_ms"] * 1e-3) / 1e12, 1)
        elif "+" not in name:
            row["gb_per_s_per_gpu"] = round(payload_mib * 2**20 / (r["comm_ms"] * 1e-3) / 1e9, 1)
        else:
            g, c = out.get("gemm", {}).get("span_ms"), out.get(comm, {}).get("span_ms")
            if g and c:
                row["alone_sum_ms"] = round(g + c, 3)
                row["hidden"] = round(min(1.0, max(0.0, (g + c - r["span_ms"]) / c)), 3)
                row["gemm_slowdown"] = round(r["gemm_ms"] / out["gemm"]["gemm_ms"], 3)
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        sys.exit("copy_overlap.py: needs 2 GPUs or more")
    env = os.environ.get
    m, k, ffn = int(env("M", 8192)), int(env("K", 8192)), int(env("FFN", 28672))
    reps, warm, scale = int(env("REPS", 20)), int(env("WARM", 3)), int(env("SCALE", 1))
    tps = [int(t) for t in env("TPS", "2 4").split() if int(t) <= torch.cuda.device_count()]
    print(f"[copy_overlap] {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, torch {torch.__version__}, "
          f"NCCL {torch.cuda.nccl.version()}, tp {tps}, {reps} reps", flush=True)
    rows = []
    for tp in tps:
        rows += probe(tp, m, k, ffn, scale, reps, warm)
    cols = ["system", "payload_mib", "span_ms", "gemm_ms", "comm_ms", "hidden", "gemm_slowdown", "gemm_tflops",
            "gb_per_s_per_gpu"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    for r in rows:
        print("RESULT", json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
