#!/usr/bin/env python3
"""PyTorch's side of the context-parallel benchmark (bench/cp/run.sh): the independent PyTorch Llama
(tests/models/torch_llama.py) under torch.distributed.tensor.experimental.context_parallel with FSDP2, beside
train_gpt --cp in the same layout. Attention is F.scaled_dot_product_attention(is_causal=True) (the call
context_parallel replaces), K and V all-gathered (set_rotate_method("allgather"), as tessera does), load
balancing on (each rank holds chunks r and 2 cp - 1 - r, as tessera's). FSDP2 fully_shard per block and the
root over all DP x CP ranks (bf16 parameters, fp32 reduction: torchtitan's dp_shard x cp mesh), the rotary
tables sharded with the tokens, AdamW(fused=True), gradient clipping at 1.0, 3 warm-ups then the median of STEPS.

  torchrun --standalone --nproc_per_node=N bench/cp/torch_cp.py
Env: MODEL (llama3-1b, llama3-8b; llama-tiny for a smoke run), T (sequence length), CP (N: cp size; DP =
N / CP, one sequence per data-parallel replica), RECOMPUTE (none|selective|full: bench/llama's meaning),
STEPS (5). Prints rank 0's "RESULT {json}" (bench/results.py's keys; bench/cp/results.py adds MFU).
"""
import contextlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
from torch_llama_parallel import build, clip_grads, prepare_blocks  # noqa: E402
from torch_llama_train import PRESETS  # noqa: E402  (puts tests/models on the path)
from torch_llama import Config, loss_fn  # noqa: E402

SEED, WARM = 1234, 3


def cp_api():
    """context_parallel and the rotate-method setter, wherever this torch keeps them (2.6-2.11)."""
    from torch.distributed.tensor.experimental import context_parallel
    try:
        from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
    except ImportError:
        from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options, set_rotate_method
    return context_parallel, set_rotate_method, _cp_options


def main():
    name = os.environ.get("MODEL", "llama3-1b")
    if name not in PRESETS:
        sys.exit(f"torch_cp.py: MODEL={name} is not one of {sorted(PRESETS)}")
    cfg = Config(**PRESETS[name])
    cfg.seq_len = int(os.environ.get("T", cfg.seq_len))
    steps, recompute = int(os.environ.get("STEPS", 5)), os.environ.get("RECOMPUTE", "none")
    if recompute not in ("none", "selective", "full"):
        sys.exit(f"torch_cp.py: RECOMPUTE={recompute} is not none, selective or full")
    if not torch.cuda.is_available() or int(torch.__version__.split(".")[0]) < 2:
        sys.exit(f"torch_cp.py: needs CUDA and torch >= 2 (context_parallel, FSDP2); this is torch {torch.__version__}")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    cp = int(os.environ.get("CP", world))
    if world % cp or cfg.seq_len % (2 * cp):
        sys.exit(f"torch_cp.py: CP={cp} must divide the {world} ranks and 2 CP the sequence length {cfg.seq_len}")
    dp = world // cp
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    context_parallel, set_rotate_method, cp_options = cp_api()
    set_rotate_method("allgather")
    cp_options.enable_load_balance = True
    mesh = init_device_mesh("cuda", (dp, cp), mesh_dim_names=("dp", "cp"))
    shard_mesh = init_device_mesh("cuda", (world,))  # FSDP over dp x cp, as torchtitan's dp_shard_cp
    model = prepare_blocks(build(cfg, dev), recompute, False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=shard_mesh, mp_policy=mp)
    fully_shard(model, mesh=shard_mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    dp_rank = mesh["dp"].get_local_rank()
    g = torch.Generator().manual_seed(SEED + dp_rank)  # one sequence per replica, the same on its cp ranks
    x = torch.randint(0, cfg.vocab, (1, cfg.seq_len), generator=g).to(dev)
    y = torch.randint(0, cfg.vocab, (1, cfg.seq_len), generator=g).to(dev)
    if rank == 0:
        print(f"[torch_cp] {name} T {cfg.seq_len} on {world} GPUs: dp {dp} x cp {cp}, recompute {recompute}",
              flush=True)
    torch.cuda.reset_peak_memory_stats(dev)
    times, loss = [], None
    for _ in range(WARM + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        xs, ys = x.clone(), y.clone()  # sharded in place; the rotary tables are restored on exit
        with context_parallel(mesh["cp"], buffers=[xs, ys, model.cos, model.sin], buffer_seq_dims=[1, 1, 0, 0],
                              no_restore_buffers={xs, ys}):
            loss = loss_fn(model(xs), ys)
            loss.backward()
        clip_grads(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    timed = sorted(times[WARM:])
    med = timed[len(timed) // 2]
    peak = torch.tensor([torch.cuda.max_memory_allocated(dev) / 2**30], device=dev)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    res = dict(mode=f"fsdp{dp}xcp{cp}", world=world, batch=dp, seq_len=cfg.seq_len, step_ms=round(med * 1e3, 2),
               tokens_per_s=round(dp * cfg.seq_len / med), peak_mem_GiB=round(peak.item(), 2), recompute=recompute,
               last_loss=round(loss.item(), 4), step_ms_all=[round(t * 1e3, 2) for t in times[WARM:]])
    if rank == 0:
        print("RESULT", json.dumps(res), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
