# PyTorch's side of the DDP benchmark: the anchor's GPT-735M and method (modes single and ddp of
# ../shared/anchors/torch_anchor.py, whose model is imported from bench/torch_anchor.py, its copy:
# ../shared does not travel to the GPU machine). bf16 autocast forward with fp32 parameters, fused AdamW, random tokens, batch B
# per GPU, 3 warm-ups then the median of STEPS steps, torch.cuda.synchronize() around each.
#   torchrun --nproc_per_node=1 torch_ddp.py single
#   torchrun --nproc_per_node=2 torch_ddp.py ddp      (DistributedDataParallel, 25 MiB buckets)
# In ddp mode it then times the gradients' all-reduce alone (PyTorch's bucket sizes when DDP's
# logging data gives them, else 1 MiB first + 25 MiB buckets over the parameters in reverse),
# all launched back to back and then waited: "allreduce_ms".
# Rank 0 prints: RESULT {json} (the anchor's keys plus system, allreduce_ms, buckets).
import os, sys, time, json
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

# The anchor's model, sizes and FLOP count (bench/torch_anchor.py, a copy of the anchors' script).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_anchor import B, D, GPT, L, SEED, STEPS, T, V, WARM, first_batch, flops_per_token, n_params  # noqa: E402


def bucket_numels(model, ddp):
    """Element counts of DDP's gradient buckets, and where they came from."""
    try:
        sizes = ddp._get_ddp_logging_data().get("bucket_sizes")
        if sizes:
            vals = [int(s) for s in str(sizes).replace(" ", "").split(",") if s]
            if vals and sum(vals) >= 4 * sum(p.numel() for p in model.parameters()) * 0.99:
                return [v // 4 for v in vals], "ddp logging data"
    except Exception:
        pass
    caps, out, cur = [1 << 20, 25 << 20], [], 0
    for p in reversed(list(model.parameters())):
        cur += p.numel()
        if cur * 4 >= caps[min(len(out), 1)]:
            out.append(cur); cur = 0
    if cur:
        out.append(cur)
    return out, "rule: 1 MiB first, 25 MiB after, reverse order"


def timed(fn, dev, warm, steps):
    times = []
    for i in range(warm + steps):
        torch.cuda.synchronize(dev); t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(dev)
        if i >= warm:
            times.append(time.perf_counter() - t0)
    return times


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("single", "ddp"):
        sys.exit("usage: torch_ddp.py single|ddp")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])); torch.cuda.set_device(dev)
    model = GPT(seed=SEED).to(dev)  # tessera's initial weights
    ddp = None
    if mode == "ddp":
        ddp = model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = first_batch(dev, SEED + rank)  # tessera's batches
    torch.cuda.reset_peak_memory_stats(dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)

    times = timed(step, dev, WARM, STEPS)
    med = sorted(times)[STEPS // 2]
    peak = torch.cuda.max_memory_allocated(dev) / 2**30
    ar_ms, nb, src = 0.0, 0, ""
    if ddp is not None:
        numels, src = bucket_numels(ddp.module, ddp)
        bufs = [torch.zeros(n, device=dev, dtype=torch.float32) for n in numels]
        nb = len(bufs)

        def allreduce():
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
            for w in works:
                w.wait()
        ar_ms = sorted(timed(allreduce, dev, 3, 10))[5] * 1e3
    tps = B * T * world / med
    mfu = tps * flops_per_token() / (world * 989e12)
    res = dict(system=os.environ.get("BENCH_SYSTEM") or ("pytorch-single" if mode == "single" else "pytorch-ddp"), mode=mode, world=world,
               params_M=round(n_params() / 1e6, 1), step_ms=round(med * 1e3, 2), tokens_per_s=round(tps),
               mfu_vs_989=round(mfu, 3), peak_mem_GiB=round(peak, 2), allreduce_ms=round(ar_ms, 2),
               buckets=nb, bucket_source=src, zero_grad="set_to_none",
               step_ms_all=[round(t * 1e3, 2) for t in times])
    if rank == 0:
        print("RESULT", json.dumps(res), flush=True)
    dist.barrier(); dist.destroy_process_group()


if __name__ == "__main__":
    main()
