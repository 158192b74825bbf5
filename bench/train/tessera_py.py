# tessera through its Python extension on the anchors' GPT-735M (bench/torch_anchor.py's model and
# method): the path a PyTorch user takes. Mode ddp: tessera.DistributedDataParallel (gradients as
# bucket views), bf16 autocast forward, fp32 parameters, torch's fused AdamW. Mode fsdp:
# tessera.FullyShardedDataParallel with a unit per block (bf16 params, fp32 reduce, 512 MiB
# prefetch budget, as FSDP2's MixedPrecisionPolicy in the anchor) and tessera.ShardedAdamW.
# Batch B per GPU, 3 warm-ups then the median of STEPS, torch.cuda.synchronize() around each.
#   torchrun --nproc_per_node=2 bench/train/tessera_py.py ddp|fsdp
# Needs the built module on PYTHONPATH (python/ and the build's python/ directory).
# Rank 0 prints: RESULT {json} with the anchor's keys plus system.
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_anchor import B, GPT, SEED, STEPS, T, WARM, first_batch, flops_per_token, n_params  # noqa: E402

import tessera  # noqa: E402


def main():
    mode = sys.argv[1]
    assert mode in ("ddp", "fsdp"), f"mode must be ddp or fsdp, got {mode}"
    ctx = tessera.init()
    rank, world = ctx.rank, ctx.world_size
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    model = GPT(seed=SEED).to(dev)  # tessera's initial weights
    if mode == "ddp":
        model = tessera.DistributedDataParallel(model, ctx.world, gradient_as_bucket_view=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16)
        zero = model.zero_grad
    else:
        model = tessera.FullyShardedDataParallel(model, ctx.world, units=list(model.blocks),
                                                 param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                 prefetch_budget_mb=512)
        opt = tessera.ShardedAdamW(model, lr=1e-4)
        autocast = torch.autocast("cuda", enabled=False)
        zero = opt.zero_grad
    x, y = first_batch(dev, SEED + rank)  # tessera's batches
    times = []
    torch.cuda.reset_peak_memory_stats(dev)
    for _ in range(WARM + STEPS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            out = model(x)
            loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        zero()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = sorted(times[WARM:])[STEPS // 2]
    tps = B * T * world / med
    res = dict(system=f"tessera-py-{mode}", mode=mode, world=world, params_M=round(n_params() / 1e6, 1),
               step_ms=round(med * 1e3, 2), tokens_per_s=round(tps),
               mfu_vs_989=round(tps * flops_per_token() / (world * 989e12), 3),
               peak_mem_GiB=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2), last_loss=round(loss.item(), 4))
    if rank == 0:
        print("RESULT", json.dumps(res), flush=True)
    ctx.world.barrier()


if __name__ == "__main__":
    main()
