#!/usr/bin/env python3
"""Issue 54's PyTorch anchor: a torchtitan-style mixture-of-experts Llama (written for this benchmark), trained
beside train_gpt on the same shape, batch and GPUs (bench/moe/run.sh).

The model: token embedding, L blocks of [RMSNorm -> attention (GQA, RoPE with rotate-half, optional q/k RMSNorm
in float32 over the whole q and k projections as OLMoE or over each head before RoPE as Qwen3, heads of
--head-dim where given, SDPA causal) -> residual; RMSNorm -> MoE -> residual],
final RMSNorm, an untied head, cross-entropy in float32.
The MoE: a bias-free router in float32 (softmax over all experts, top-k, the chosen probabilities renormalised only
with --norm-topk on), routed SwiGLU experts held as 3D weights w1, w3 [El, f, d] and w2 [El, d, f] and run as three
`torch._grouped_mm` calls in bf16 over the rows grouped by expert (group ends: an int32 cumulative sum of the
counts, on the device), no shared expert, dropless. Expert parallel over ep ranks (ep = world by default): the
counts per expert are exchanged first (`all_to_all_single`), read on the host once per layer (the split sizes),
the tokens permuted by expert travel by `all_to_all_single` (an autograd function whose backward is the reverse
exchange), are regrouped by local expert, run, sent back and combined, weighted by their router probabilities
(summed in float32). --routing balanced forces uniform loads: token i of a rank goes to experts (i*k + j) mod E,
j < k, weighted by the router's probabilities of those experts (the router still runs and gets gradients).

Parallelism and precision as torchtitan: FSDP2 `fully_shard` with MixedPrecisionPolicy(bf16 parameters, fp32
gradient reduction) on each block and the root over all ranks; each layer's experts their own FSDP unit over the
ranks that hold the same experts (world / ep of them: with ep = world a one-rank mesh, the experts local) and the
router its own unit kept in float32; fp32 master weights, fused AdamW (betas 0.9, 0.95, weight decay 0.01),
gradient-norm clipping at 1.0 over every shard (one all-reduce, no host wait). The experts' gradients are scaled by
1 / ep after backward: their FSDP unit averages over world / ep ranks, and the exchange already summed the ep
ranks' tokens into them, so every parameter ends with the mean over all ranks (as DDP / FSDP over the world).
torch.compile per block (torchtitan compiles each block): here the parts of each block with static shapes, the
attention sub-layer (norm, attention, residual) and the router (norm, gate, softmax, top-k), plus the SwiGLU
product (dynamic shapes); the dispatch (counts, host read, exchanges, permutations) and the grouped GEMMs stay
eager, as dynamo would break the graph at the host read anyway. --compile 0: all eager.

Data: random tokens (a CPU generator seeded 1234 + rank), one fixed batch of --batch sequences per rank.
Timing: each step synchronised before and after (perf_counter); --warmup steps then the median (upper median) of
--steps steps, for each routing asked (--routing real|balanced|both: both runs real then balanced in one process,
the second after 2 more warm-ups). Peak memory: the caching allocator's max allocated over each routing's steps (warm-ups included), the fullest rank.
MFU on active parameters, train_gpt's convention (src/models/config.cpp flopsPerToken): 6 x (L x active block
parameters + V x d) + 12 x L x d x T per token over gpus x 989 TFLOP/s; active block parameters = attention (+ q/k
norms) + 2 d (norms) + router E x d + k experts x 3 d f.
Prints rank 0's "RESULT {json}" per routing (bench/results.py's keys) with load_max_over_mean: per timed step the
worst layer's max / mean expert load, loads summed over all ranks (train_gpt's moe_load_max_over_mean), its median.

  torchrun --standalone --nproc-per-node N bench/moe/anchor.py [--layers 16 ...] --routing both --system NAME
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PEAK_FLOPS, SEED = 989e12, 1234


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=0, help="a head's width (0: d / heads)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--expert-ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank per step")
    ap.add_argument("--ep", type=int, default=0, help="expert-parallel ranks (0: the world)")
    ap.add_argument("--norm-topk", choices=("on", "off"), default="off")
    ap.add_argument("--qk-norm", choices=("none", "whole", "per-head"), default="none",
                    help="q/k RMSNorm: over the whole projections (OLMoE) or over each head (Qwen3)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--routing", choices=("real", "balanced", "both"), default="both")
    ap.add_argument("--compile", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--system", default="pytorch", help="the rows' system name; balanced rows get -balanced")
    return ap.parse_args()


# ---------------------------------------------------------------------------------------------------- the model


import anchor_model  # noqa: E402  (beside this script)
from anchor_model import Model, flops_per_token, init_weights  # noqa: E402


def main():
    a = parse()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    ep = a.ep or world
    if world % ep or a.experts % ep:
        sys.exit(f"anchor.py: ep {ep} must divide the world {world} and the experts {a.experts}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
    mesh2 = init_device_mesh("cuda", (world // ep, ep), mesh_dim_names=("edp", "ep"))
    ep_group, edp_mesh = mesh2.get_group("ep"), mesh2["edp"]
    ep_rank = dist.get_rank(ep_group)

    if a.compile:
        anchor_model.ROUTE = torch.compile(anchor_model._route)
        anchor_model.SWIGLU = torch.compile(anchor_model._swiglu, dynamic=True)
    with torch.device(dev):
        model = Model(a, ep, ep_rank, ep_group)
    init_weights(model, SEED, ep_rank)
    if a.compile:
        for blk in model.blocks:
            blk.attn.compile()
    # Inputs left as they come (cast_forward_inputs off below the root): activations are bf16 already, and
    # RoPE's cos / sin tables stay float32.
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for blk in model.blocks:
        fully_shard(blk.moe.experts, mesh=edp_mesh, mp_policy=bf16)
        fully_shard(blk.moe.router, mesh=mesh, mp_policy=fp32)
        fully_shard(blk, mesh=mesh, mp_policy=bf16)
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                 reduce_dtype=torch.float32))

    expert_params = [p for n, p in model.named_parameters() if ".experts." in n]
    dense_params = [p for n, p in model.named_parameters() if ".experts." not in n]
    opts = [torch.optim.AdamW(ps, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01, fused=True)
            for ps in (dense_params, expert_params)]
    local = lambda p: getattr(p.grad, "_local_tensor", p.grad)  # noqa: E731  (FSDP2's gradients are DTensors)
    max_norm = torch.tensor(a.clip, device=dev)

    g = torch.Generator().manual_seed(SEED + rank)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g).to(dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq_len), generator=g).to(dev)

    def step():
        loss = model(tokens, targets)
        loss.backward()
        with torch.no_grad():
            eg = [local(p) for p in expert_params if p.grad is not None]
            dg = [local(p) for p in dense_params if p.grad is not None]
            if ep > 1:
                torch._foreach_mul_(eg, 1.0 / ep)
            if a.clip > 0:  # every shard is disjoint over the world: one sum of squares, one all-reduce
                sq = torch.stack([n.float() for n in torch._foreach_norm(eg + dg)]).pow(2).sum()
                dist.all_reduce(sq)
                coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
                torch._foreach_mul_(eg + dg, coef)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return loss

    fpt = flops_per_token(a)
    tokens_per_step = a.batch * a.seq_len * world
    moes = [blk.moe for blk in model.blocks]
    if rank == 0:
        print(f"[anchor] world {world}, ep {ep}, {a.layers} layers, d {a.d}, {a.experts} experts top {a.topk} of "
              f"{a.expert_ffn}, qk-norm {a.qk_norm}, T {a.seq_len}, {a.batch} seq/rank, compile {a.compile}; "
              f"{flops_per_token(a) / 1e9:.3f} GFLOP/token (active)", flush=True)
    routings = ["real", "balanced"] if a.routing == "both" else [a.routing]
    for ri, routing in enumerate(routings):
        for m in moes:
            m.balanced = routing == "balanced"
        warm = a.warmup if ri == 0 else 2
        torch.cuda.reset_peak_memory_stats(dev)
        times, spreads, loss = [], [], None
        for i in range(warm + a.steps):
            timed = i >= warm
            for m in moes:
                m.record, m.loads = timed, []
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if timed:
                times.append(dt)
                loads = torch.stack([m.loads[0] for m in moes]).float()  # [L, E] this rank's
                dist.all_reduce(loads)
                spreads.append((loads.max(1).values / loads.mean(1).clamp_min(1e-9)).max().item())
            if rank == 0:
                print(f"[anchor] {routing} step {i + 1}/{warm + a.steps}: {dt * 1e3:.1f} ms, loss "
                      f"{loss.item():.4f}", flush=True)
        srt = sorted(times)
        med = srt[len(srt) // 2]
        peak = torch.tensor(torch.cuda.max_memory_allocated(dev) / 2**30, device=dev, dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        sp = sorted(spreads)
        system = a.system + ("-balanced" if routing == "balanced" else "")
        res = dict(system=system, gpus=world, ep=ep, routing=routing, batch=a.batch * world, seq_len=a.seq_len,
                   step_ms=round(med * 1e3, 2), tokens_per_s=round(tokens_per_step / med),
                   mfu=round(tokens_per_step / med * fpt / (world * PEAK_FLOPS), 4),
                   peak_mem_gib=round(peak.item(), 2), load_max_over_mean=round(sp[len(sp) // 2], 3),
                   flops_per_token=fpt, last_loss=round(loss.item(), 4), compiled=bool(a.compile),
                   qk_norm=a.qk_norm, layers=a.layers, step_ms_all=[round(t * 1e3, 2) for t in times])
        if rank == 0:
            print("RESULT", json.dumps(res), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
