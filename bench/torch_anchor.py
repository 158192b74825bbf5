# PyTorch's side of the tp/pp/fsdp benchmarks (bench/parallel.sh): a copy of
# ../shared/anchors/torch_anchor.py, the anchors' script (../shared does not travel to the GPU machine),
# plus two host-side memory readings (no synchronisation, no effect on the timing): the memory
# allocated right before the last step's backward and the peak up to then, for the FSDP comparison;
# TESSERA_FAKE_WORLD=N: one process plays rank 0 of N over PyTorch's "fake" process group (no
# communication; the probe of bench/common/fake_world.h, modes ddp fsdp tp), its line marked "fake_world";
# and the model tessera's drivers run (bench/common/bench_model.h: src/models' GPT): the same
# architecture, built from tessera's initial weights (GPT(seed=SEED)) and fed tessera's batches (drawn
# on the CPU, first_batch), so both systems start from the same loss (tests/bench/anchor_loss.py checks
# it on the CPU). Under torch < 2 (the CPU machine) attention runs op by op (causal_attention).
# Launch: torchrun --nproc_per_node=N torch_anchor.py MODE   (MODE: single ddp fsdp tp pp)
#         FAKE_WORLD=2 python3 torch_anchor.py MODE
import os, sys, time, json, math
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

D = int(os.environ.get("D", 2048)); L = int(os.environ.get("L", 12)); H = D // 128
V = int(os.environ.get("V", 32000)); T = int(os.environ.get("T", 1024)); B = int(os.environ.get("B", 8))
STEPS = int(os.environ.get("STEPS", 10)); WARM = 3
SEED = 1234  # tessera's model and data seed (bench/common/bench_model.h: kModelSeed, kDataSeed)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]  # torch < 2: the same softmax(q k^T / sqrt(hd)) v, masked causally
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(mask, float("-inf")).float(), dim=-1).to(q.dtype) @ v

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(D); s.qkv = nn.Linear(D, 3 * D); s.proj = nn.Linear(D, D)
        s.ln2 = nn.LayerNorm(D); s.fc1 = nn.Linear(D, 4 * D); s.fc2 = nn.Linear(4 * D, D)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, -1, 128).unbind(2)
        a = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + s.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))

class GPT(nn.Module):
    """seed: draw the weights as tessera's GPT does for that seed (src/models/lm.cpp): the embedding
    N(0, 1) from a generator seeded `seed`, block i (of the whole model: first_block + its index here)
    as nn.Linear draws it after torch.manual_seed(seed * 1000003 + 101 + i) (tessera's layers draw the
    unsharded weights that way), the head after torch.manual_seed(seed * 1000003 + 7). None: as the
    anchors' script (after its torch.manual_seed(0))."""
    def __init__(s, layers=L, emb=True, head=True, seed=None, first_block=0):
        super().__init__()
        s.emb = nn.Embedding(V, D) if emb else None
        if s.emb is not None and seed is not None:
            with torch.no_grad():
                s.emb.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
        blocks = []
        for i in range(layers):
            if seed is not None:
                torch.manual_seed(seed * 1000003 + 101 + first_block + i)
            blocks.append(Block())
        s.blocks = nn.ModuleList(blocks)
        s.lnf = nn.LayerNorm(D) if head else None
        if head and seed is not None:
            torch.manual_seed(seed * 1000003 + 7)
        s.head = nn.Linear(D, V, bias=False) if head else None
    def forward(s, x):
        if s.emb is not None: x = s.emb(x)
        for blk in s.blocks: x = blk(x)
        if s.head is not None: x = s.head(s.lnf(x))
        return x

def n_params():
    return L * (12 * D * D + 13 * D) + 2 * V * D + 2 * D

def flops_per_token():  # 6N for matmuls + causal attention (fwd 2*T*D per layer, x3 for fwd+bwd, /2 causal... use the PaLM 12*L*D*T convention)
    return 6 * n_params() + 12 * L * D * T

def first_batch(dev, seed=SEED):
    """Tokens and targets [B, T], drawn in that order on the CPU from a generator seeded `seed` (as
    tessera's drivers draw them: bench/common/bench_model.h randomBatch), moved to `dev`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (B, T), generator=g)
    y = torch.randint(0, V, (B, T), generator=g)
    return x.to(dev), y.to(dev)

def main():
    mode = sys.argv[1]
    fake = int(os.environ.get("TESSERA_FAKE_WORLD", 0) or 0)
    for old in ("FAKE_WORLD", "FAKE_COMM_TIMED"):
        assert old not in os.environ, "%s is now TESSERA_%s" % (old, old)
    if fake:
        assert mode in ("ddp", "fsdp", "tp") and fake >= 2, "TESSERA_FAKE_WORLD=%d: modes ddp fsdp tp, 2 ranks or more" % fake
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=fake)
    else:
        dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))); torch.cuda.set_device(dev)
    tokens_per_step = B * T * (world if mode in ("ddp", "ddp_bf16", "fsdp", "single") else 1)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    if mode in ("single", "ddp", "ddp_bf16"):
        model = GPT(seed=SEED).to(dev)
        if mode in ("ddp", "ddp_bf16"):
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
        if mode == "ddp_bf16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
            model.register_comm_hook(None, bf16_compress_hook)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        model = GPT(seed=SEED).to(dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks: fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = torch.autocast("cuda", enabled=False)
    elif mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel
        mesh = init_device_mesh("cuda", (world,))
        model = GPT(seed=SEED).to(dev)
        for blk in model.blocks:
            parallelize_module(blk, mesh, {"qkv": ColwiseParallel(), "proj": RowwiseParallel(),
                                           "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    elif mode == "pp":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        per = L // world
        stage_mod = GPT(layers=per, emb=(rank == 0), head=(rank == world - 1), seed=SEED, first_block=rank * per).to(dev)
        stage = PipelineStage(stage_mod, rank, world, dev)
        nmb = int(os.environ.get("MB", 8))
        loss_fn = lambda out, tgt: F.cross_entropy(out.flatten(0, 1).float(), tgt.flatten())
        sched = Schedule1F1B(stage, n_microbatches=nmb, loss_fn=loss_fn)
        model = stage_mod
        tokens_per_step = B * T * 1  # global batch B split into micro-batches
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(mode != "tp"), foreach=False if mode == "tp" else None)
    x, y = first_batch(dev, SEED + (rank if mode in ("ddp", "ddp_bf16", "fsdp") else 0))
    times = []
    torch.cuda.reset_peak_memory_stats(dev)
    for i in range(WARM + STEPS):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        if mode == "pp":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if world == 1: sched.step(x, target=y)  # one stage: first and last (a 1-GPU probe)
                elif rank == 0: sched.step(x)
                elif rank == world - 1: sched.step(target=y)
                else: sched.step()
        else:
            with autocast:
                out = model(x)
                loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
            mem_before_backward = torch.cuda.memory_allocated(dev); peak_forward = torch.cuda.max_memory_allocated(dev)
            loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
    med = sorted(times[WARM:])[STEPS // 2]
    tps = tokens_per_step / med
    mfu = tps * flops_per_token() / (world * 989e12)
    res = dict(mode=mode, world=world, params_M=round(n_params() / 1e6, 1), step_ms=round(med * 1e3, 2),
               tokens_per_s=round(tps), mfu_vs_989=round(mfu, 3),
               peak_mem_GiB=round(torch.cuda.max_memory_allocated(dev) / 2**30, 2))
    if fake: res.update(fake_world=fake)
    if mode != "pp":
        res.update(mem_before_backward_GiB=round(mem_before_backward / 2**30, 2),
                   peak_through_forward_GiB=round(peak_forward / 2**30, 2))
    if rank == 0: print("RESULT", json.dumps(res), flush=True)
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    main()
