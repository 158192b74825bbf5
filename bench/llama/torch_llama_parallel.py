#!/usr/bin/env python3
"""PyTorch's side of the multi-GPU Llama benchmark (bench/llama/parallel.sh): the independent PyTorch Llama
(tests/models/torch_llama.py, the presets of torch_llama_train.py) under PyTorch's own parallelism, beside
train_gpt in the matching layout. Random tokens (a CPU generator seeded 1234 + data-parallel rank), bf16
autocast over fp32 weights (FSDP: its mixed-precision policy instead), torch.optim.AdamW(fused=True)
(tensor parallel: foreach=False, as bench/torch_anchor.py), 3 warm-up steps then the median of STEPS.

  torchrun --standalone --nproc_per_node=N torch_llama_parallel.py MODE
MODE (B: env, sequences per step):
  single  one GPU, B sequences                     ddp    DistributedDataParallel, B per GPU
  fsdp    FSDP2 fully_shard per block and the root (bf16 params, fp32 reduce), B per GPU
  tp      DTensor tensor parallel (column: wq wk wv w1 w3, row: wo w2), B shared by the group; the
          blocks view their local heads (heads / N, kv_heads / N) through a copy of the config
  tp_sp   tp plus sequence parallel: the norms on sequence shards (SequenceParallel), each norm's output
          gathered once (in bf16) for its column-parallel linears, wo and w2 reduce-scattered to sequence
          shards; the embedding's output split, the final norm's input gathered (logits replicated)
  pp      torch.distributed.pipelining, PipelineStage + Schedule1F1B, B split into MB (16) micro-batches;
          stage 0 holds the embedding, the last stage the final norm and head: UNTIED (noted in the row)
Env: MODEL (llama3-1b, llama3-8b, llama70b-slice; llama-tiny for a smoke run), B (4), T (the preset's seq_len),
LAYERS (the preset's), STEPS (10), MB (16), ACCUM (1: single, ddp and fsdp run B sequences per GPU ACCUM
times a step, gradients reduced in the last backward, FSDP2 keeping the parameters gathered between them); COMPILE=1: each block under torch.compile (torchtitan's per-block
compile; the anchor of issue 40): before the parallel wrapper, except under tp and tp_sp, where each block is
compiled after parallelize_module has sharded it (torchtitan's order: TP, then compile); ASYNC_TP=1 (tp_sp with
COMPILE=1): async TP, torchtitan's recipe (torch._inductor.config._micro_pipeline_tp, symmetric memory enabled
for the TP group where this torch still asks for it): inductor turns each all-gather -> matmul and
matmul -> reduce-scatter into chunked ops whose chunks move beside the GEMMs (issue 53's anchor), FP8=1 (the
blocks' linears in FP8 over torch._scaled_mm, tensorwise: bench/fp8/torch_float8.py; issue 37's anchor), RECOMPUTE
none|selective|full (none: selective recomputes attention's core, as train_gpt's --recompute selective; full
checkpoints each block), CLIP (1.0, train_gpt's default; 0: none:
clip_grad_norm_ with foreach over the model's parameters, DTensors included; pp: each stage's own), PROFILE
(a path: after the timed steps, 2 more steps under torch.profiler, CPU and CUDA activities, no stacks, written
as a Chrome trace there by rank 0 and with ".rank<r>" before the extension by rank r, as train_gpt --profile).
Prints rank 0's "RESULT {json}" in bench/results.py's keys (mode, world, batch = sequences per step over all
GPUs, step_ms, tokens_per_s, mfu_vs_989, peak_mem_GiB = the fullest rank's) and the memory phases of train_gpt
--breakdown's step records (GiB, the fullest rank's, the largest over the timed steps):
mem_step_start_gib and mem_before_backward_gib (allocated at the step's start and right before backward),
mem_peak_forward_gib, mem_peak_backward_gib and mem_peak_optimizer_gib (the peak allocated within forward and
the loss, within backward, within clipping, the optimizer step and zero_grad); pp, whose schedule runs forward
and backward together: mem_peak_schedule_gib instead of the forward and backward ones. peak_mem_GiB is the
largest phase peak of all steps, warm-ups included (as before the phases were measured). Without CUDA it runs
on the CPU over Gloo in fp32 (torch 1.13 there: single and ddp only), a smoke test of the script.
"""
import contextlib
import copy
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama_train import PRESETS, flops_per_token  # noqa: E402  (puts tests/models on the path)
from torch_llama import Config, Llama, loss_fn  # noqa: E402

MODES = ("single", "ddp", "fsdp", "tp", "tp_sp", "pp")
SEED, WARM, PEAK_FLOPS, PROFILE_STEPS = 1234, 3, 989e12, 2
PP_NOTE = "embedding and head untied: the pipeline holds them on different stages"


def build(cfg, dev):
    """The Llama made on `dev`, seeded alike on every rank: PyTorch's default initialisation, the table
    N(0, 0.02) (a sane first loss with the tied head)."""
    torch.manual_seed(SEED)
    with dev if dev.type == "cuda" else contextlib.nullcontext():  # torch >= 2: parameters made on the GPU
        model = Llama(cfg)
    with torch.no_grad():
        model.emb.weight.normal_(0.0, 0.02)
    return model.to(dev)


class MemoryPhases:
    """The caching allocator's counters at a step's phase boundaries (bytes): each phase's value the largest over
    the steady steps (`steady` set: after the warm-ups), the peak of every phase of every step besides. Host-side
    reads of the allocator's own bookkeeping (what it has handed out when the host issues an op): no device
    synchronisation, so recording them leaves a timed step's device work alone."""

    def __init__(self, dev):
        self.dev, self.bytes, self.peak, self.steady = dev, {}, 0, False

    def _keep(self, key, value):
        if self.steady:
            self.bytes[key] = max(self.bytes.get(key, 0), value)

    def start(self):  # the step's first phase begins: its peak counts from here
        torch.cuda.reset_peak_memory_stats(self.dev)
        self._keep("mem_step_start_gib", torch.cuda.memory_allocated(self.dev))

    def now(self, key):
        self._keep(key, torch.cuda.memory_allocated(self.dev))

    def end_phase(self, key):  # the peak since the last boundary; the next phase's counts from here
        peak = torch.cuda.max_memory_allocated(self.dev)
        self.peak = max(self.peak, peak)
        self._keep(key, peak)
        torch.cuda.reset_peak_memory_stats(self.dev)

    def fullest(self, keys):
        """{key: GiB} of the fullest rank for each key, "peak" the largest phase peak of all steps (collective:
        every rank calls it with the same keys)."""
        t = torch.tensor([self.bytes.get(k, 0) / 2**30 for k in keys] + [self.peak / 2**30], device=self.dev,
                         dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return dict(zip(list(keys) + ["peak"], t.tolist()))


class Checkpointed(torch.nn.Module):
    """A block recomputed in backward (RECOMPUTE=full)."""

    def __init__(self, blk):
        super().__init__()
        self.blk = blk

    def forward(self, x, cos, sin):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.blk, x, cos, sin, use_reentrant=False)


def prepare_blocks(model, recompute, compile_blocks):
    """Recompute and per-block compile, applied to `model.blocks` in place (before any parallel wrapper, as
    torchtitan orders them: activation checkpointing, then compile, then FSDP)."""
    for i, blk in enumerate(model.blocks):
        blk.recompute_core = recompute == "selective"
        if recompute == "full":
            blk = Checkpointed(blk)
        if compile_blocks:
            blk = torch.compile(blk)
        model.blocks[i] = blk
    return model


def clip_grads(params, max_norm):
    """Gradient-norm clipping as torchtitan does it: the total norm over all gradients (foreach; DTensor
    gradients of FSDP2 and TP give a DTensor norm, made whole), then every gradient scaled by it. DTensor and
    plain gradients (DTensor TP leaves the embedding and norms plain) are normed apart and combined: foreach
    ops refuse a mixed list. torch 1.x: clip_grad_norm_."""
    params = [p for p in params if p.grad is not None]
    if not hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    groups = [[p for p in params if hasattr(p.grad, "full_tensor")],
              [p for p in params if not hasattr(p.grad, "full_tensor")]]
    norms = []
    for g in groups:
        if g:
            n = torch.nn.utils.get_total_norm([p.grad for p in g], foreach=True)
            norms.append(n.full_tensor() if hasattr(n, "full_tensor") else n)
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    for g in groups:
        if g:
            torch.nn.utils.clip_grads_with_norm_(g, max_norm, total, foreach=True)
    return total


def tensor_parallel(model, world, sp):
    """Shards every block over all ranks (one mesh dimension); sp: sequence parallel besides."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel, parallelize_module)
    cfg = model.cfg
    assert cfg.heads % world == 0 and cfg.kv_heads % world == 0, \
        f"tp {world}: heads {cfg.heads} and kv_heads {cfg.kv_heads} must divide by it"
    mesh = init_device_mesh("cuda", (world,))
    local = copy.copy(cfg)  # Block.forward views q, k, v (and o) by cfg.heads / cfg.kv_heads: the local counts
    local.heads, local.kv_heads = cfg.heads // world, cfg.kv_heads // world
    row = dict(output_layouts=Shard(1), use_local_output=False) if sp else {}

    def gather(_module, _inputs, out):  # a norm's sequence-sharded output -> replicated, once for its linears
        return out.to(torch.bfloat16).redistribute(placements=[Replicate()])

    for blk in model.blocks:
        blk.cfg = local
        plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel(**row),
                "w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel(**row)}
        if sp:
            plan.update(attn_norm=SequenceParallel(), mlp_norm=SequenceParallel())
        parallelize_module(blk, mesh, plan)
        if sp:
            blk.attn_norm.register_forward_hook(gather)
            blk.mlp_norm.register_forward_hook(gather)
    if sp:  # the embedding's output split by sequence into the blocks, the final norm's input gathered
        parallelize_module(model, mesh, {
            "emb": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                       use_local_output=False),
            "norm": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True)})
    return model, mesh


def count_async_tp_patterns():
    """{pattern: count}, filled as inductor's micro-pipeline TP pass fuses an all-gather -> matmul or a matmul ->
    reduce-scatter (its fuse functions wrapped to count their calls), so a run says whether async TP took hold;
    None where this torch has no such pass."""
    try:
        from torch._inductor.fx_passes import micro_pipeline_tp as mpt
    except ImportError:
        return None
    matched = {"all_gather_matmul": 0, "matmul_reduce_scatter": 0}

    def counted(fn, key):
        def wrapper(*args, **kwargs):
            matched[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name, key in (("fuse_all_gather_matmul", "all_gather_matmul"),
                      ("fuse_matmul_reduce_scatter", "matmul_reduce_scatter")):
        if hasattr(mpt, name):
            setattr(mpt, name, counted(getattr(mpt, name), key))
    return matched


class Stage(torch.nn.Module):
    """Blocks [lo, hi) of `full` (an untied Llama), with its embedding on the first stage and its final norm
    and head on the last: tokens -> hidden states -> ... -> logits."""

    def __init__(self, full, lo, hi, first, last):
        super().__init__()
        self.emb = full.emb if first else None
        self.blocks = torch.nn.ModuleList(full.blocks[lo:hi])
        self.norm = full.norm if last else None
        self.head = full.head if last else None
        self.register_buffer("cos", full.cos, persistent=False)
        self.register_buffer("sin", full.sin, persistent=False)

    def forward(self, x):
        if self.emb is not None:
            x = self.emb(x)
        t = x.shape[1]
        for blk in self.blocks:
            x = blk(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x)) if self.head is not None else x


def rank_path(path, rank):
    """`path` on rank 0, else with ".rank<r>" before its extension (as train_gpt's --profile names them)."""
    if rank == 0:
        return path
    base, ext = os.path.splitext(path)
    return f"{base}.rank{rank}{ext}"


def trace(train_step, sync, path, cuda):
    """PROFILE_STEPS more steps under torch.profiler (CPU ops and, on GPUs, CUDA kernels; no stacks or shapes),
    the device synchronised before and after, written to `path` as a Chrome trace (bench/profile/summarize.py)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    sync()
    with torch.profiler.profile(activities=acts, record_shapes=False, with_stack=False) as prof:
        for _ in range(PROFILE_STEPS):
            train_step(None)
        sync()
    prof.export_chrome_trace(path)
    print(f"[torch_llama_parallel] {PROFILE_STEPS} steps traced to {path}", flush=True)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in MODES:
        sys.exit(f"usage: torch_llama_parallel.py {'|'.join(MODES)} (got '{mode}')")
    if mode not in ("single", "ddp") and int(torch.__version__.split(".")[0]) < 2:
        sys.exit(f"torch_llama_parallel.py: mode {mode} needs torch >= 2 (FSDP2, DTensor, pipelining); "
                 f"this is torch {torch.__version__}")
    name = os.environ.get("MODEL", "llama3-1b")
    if name not in PRESETS:
        sys.exit(f"torch_llama_parallel.py: MODEL={name} is not one of {sorted(PRESETS)}")
    cfg = Config(**PRESETS[name])
    cfg.seq_len = int(os.environ.get("T", cfg.seq_len))
    cfg.layers = int(os.environ.get("LAYERS", cfg.layers))
    B, steps, mb = int(os.environ.get("B", 4)), int(os.environ.get("STEPS", 10)), int(os.environ.get("MB", 16))
    accum = int(os.environ.get("ACCUM", 1))
    compile_blocks = os.environ.get("COMPILE", "0") == "1"
    recompute = os.environ.get("RECOMPUTE", "none")
    clip = float(os.environ.get("CLIP", "1.0"))
    if recompute not in ("none", "selective", "full"):
        sys.exit(f"torch_llama_parallel.py: RECOMPUTE={recompute} is not none, selective or full")
    if recompute == "selective" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        sys.exit(f"torch_llama_parallel.py: RECOMPUTE=selective recomputes scaled_dot_product_attention, which torch "
                 f"{torch.__version__} lacks")
    if compile_blocks and not hasattr(torch, "compile"):
        sys.exit(f"torch_llama_parallel.py: COMPILE=1 needs torch >= 2 (this is torch {torch.__version__})")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    if mode == "single" and world != 1:
        sys.exit(f"torch_llama_parallel.py: mode single runs on 1 rank, not {world}")
    data_parallel = mode in ("single", "ddp", "fsdp")
    if accum > 1 and not data_parallel:
        sys.exit(f"torch_llama_parallel.py: ACCUM={accum} needs mode single, ddp or fsdp (pp has MB)")
    if mode in ("tp", "tp_sp") and recompute == "full":
        sys.exit("torch_llama_parallel.py: DTensor TP runs without RECOMPUTE=full here (its plan names the blocks' "
                 "own linears)")
    async_tp = os.environ.get("ASYNC_TP", "0") == "1"
    if async_tp and not (mode == "tp_sp" and compile_blocks and cuda):
        sys.exit("torch_llama_parallel.py: ASYNC_TP=1 needs mode tp_sp, COMPILE=1 and GPUs (inductor's micro-pipeline "
                 "TP rewrites the compiled blocks' sequence-parallel collectives)")

    fp8 = os.environ.get("FP8", "0") == "1"

    def make(c, d, compile_now=compile_blocks):  # the model with FP8, RECOMPUTE and COMPILE applied to its blocks
        model = build(c, d)
        if fp8:  # the blocks' linears over torch._scaled_mm (bench/fp8/torch_float8.py)
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fp8"))
            from torch_float8 import swap_linears
            for blk in model.blocks:
                swap_linears(blk)
        return prepare_blocks(model, recompute, compile_now)

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    notes = None
    if mode in ("single", "ddp"):
        model = make(cfg, dev)
        if mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    elif mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        model = make(cfg, dev)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            fully_shard(blk, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = contextlib.nullcontext()  # the policy's bf16 parameters instead
    elif mode in ("tp", "tp_sp"):
        model, mesh = tensor_parallel(make(cfg, dev, compile_now=False), world, mode == "tp_sp")
        if async_tp:  # torchtitan's maybe_enable_async_tp
            from torch._inductor import config as inductor_config
            inductor_config._micro_pipeline_tp = True
            try:  # newer torch enables symmetric memory by itself (and may drop or deprecate this call)
                from torch.distributed._symmetric_memory import enable_symm_mem_for_group
                enable_symm_mem_for_group(mesh.get_group().group_name)
            except (ImportError, AttributeError):
                pass
            matched = count_async_tp_patterns()
        if compile_blocks:  # after the sharding, as torchtitan orders it
            for i, blk in enumerate(model.blocks):
                model.blocks[i] = torch.compile(blk)
    else:  # pp
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        assert cfg.layers % world == 0 and B % mb == 0 and mb >= world, \
            f"pp {world}: layers {cfg.layers} must divide by it, B {B} by MB {mb}, MB >= stages"
        untied = copy.copy(cfg)
        untied.tied = False
        per = cfg.layers // world
        model = Stage(make(untied, dev), rank * per, (rank + 1) * per, rank == 0, rank == world - 1)
        sched = Schedule1F1B(PipelineStage(model, rank, world, dev), n_microbatches=mb,
                             loss_fn=lambda out, tgt: loss_fn(out, tgt))
        notes = PP_NOTE
    tp = mode in ("tp", "tp_sp")
    if cuda:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not tp, foreach=False if tp else None)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step_ctx = contextlib.nullcontext
    if mode == "tp_sp":  # the norms' replicated weights get partial gradients, summed by the optimizer's ops
        from torch.distributed.tensor.experimental import implicit_replication as step_ctx
    g = torch.Generator().manual_seed(SEED + (rank if data_parallel else 0))
    x = torch.randint(0, cfg.vocab, (accum * B, cfg.seq_len), generator=g).to(dev)
    y = torch.randint(0, cfg.vocab, (accum * B, cfg.seq_len), generator=g).to(dev)

    def sync_grads(last):
        """ACCUM > 1: gradients reduced in the last micro-batch's backward only; FSDP2 keeps the parameters
        gathered between micro-batches (ZeRO-2's regime, as train_gpt --fsdp-keep-gathered)."""
        if mode == "fsdp":
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            return contextlib.nullcontext()
        return model.no_sync() if mode == "ddp" and not last else contextlib.nullcontext()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if rank == 0:
        print(f"[torch_llama_parallel] {mode} on {world} rank(s), {name}, B {B} x T {cfg.seq_len}"
              f"{f', {mb} micro-batches' if mode == 'pp' else ''}, {'bf16 on CUDA' if cuda else 'fp32 on the CPU'}",
              flush=True)
    mem = MemoryPhases(dev) if cuda else None
    mem_keys = ("mem_step_start_gib",) + (("mem_peak_schedule_gib",) if mode == "pp" else (
        "mem_before_backward_gib", "mem_peak_forward_gib", "mem_peak_backward_gib")) + ("mem_peak_optimizer_gib",)

    def train_step(mem):
        """One training step; its loss (pp: None). `mem`: a MemoryPhases that records the step's phases, or None."""
        loss = None
        if mem is not None:
            mem.start()
        if mode == "pp":
            with autocast:
                if world == 1:
                    sched.step(x, target=y)
                elif rank == 0:
                    sched.step(x)
                elif rank == world - 1:
                    sched.step(target=y)
                else:
                    sched.step()
            if mem is not None:
                mem.end_phase("mem_peak_schedule_gib")
        else:
            for k in range(accum):
                xs, ys = x[k * B:(k + 1) * B], y[k * B:(k + 1) * B]
                with autocast:
                    loss = loss_fn(model(xs), ys) / accum if accum > 1 else loss_fn(model(xs), ys)
                if mem is not None and k == 0:
                    mem.now("mem_before_backward_gib")
                    mem.end_phase("mem_peak_forward_gib")
                with sync_grads(k == accum - 1):
                    loss.backward()
            if mem is not None:
                mem.end_phase("mem_peak_backward_gib")
        with step_ctx():
            if clip > 0:
                clip_grads(model.parameters(), clip)
            opt.step()
        opt.zero_grad(set_to_none=True)
        if mem is not None:
            mem.end_phase("mem_peak_optimizer_gib")
        return loss

    times, loss = [], None
    for i in range(WARM + steps):
        if mem is not None:
            mem.steady = i >= WARM
        sync()
        t0 = time.perf_counter()
        loss = train_step(mem)
        sync()
        times.append(time.perf_counter() - t0)
    timed = sorted(times[WARM:])
    med = timed[len(timed) // 2]  # as results.py from-jsonl takes train_gpt's
    tokens = accum * B * cfg.seq_len * (world if data_parallel else 1)
    phases = mem.fullest(mem_keys) if cuda else {}  # the fullest rank's (pp: the last stage, with the logits)
    fpt = flops_per_token(cfg)
    res = dict(mode=mode, world=world, batch=accum * B * (world if data_parallel else 1), seq_len=cfg.seq_len,
               layers=cfg.layers,
               step_ms=round(med * 1e3, 2), tokens_per_s=round(tokens / med),  # MFU and memory: GPUs only
               mfu_vs_989=round(tokens / med * fpt / (world * PEAK_FLOPS), 4) if cuda else None,
               peak_mem_GiB=round(phases["peak"], 2) if cuda else None)
    res.update({k: round(phases[k], 2) if cuda else None for k in mem_keys})
    res.update(compiled=compile_blocks, recompute=recompute, clip=clip, fp8="tensorwise" if fp8 else "off")
    if tp:
        res["async_tp"] = async_tp
    if async_tp:  # the patterns inductor rewrote, summed over the compiled graphs (forward and backward)
        res["async_tp_patterns"] = matched
    if mode == "pp" or accum > 1:
        res["micro_batches"] = mb if mode == "pp" else accum
    if loss is not None:
        res["last_loss"] = round(loss.item(), 4)
    if notes:
        res["notes"] = notes
    if rank == 0:
        print("RESULT", json.dumps(res), flush=True)
    if os.environ.get("PROFILE"):
        trace(train_step, sync, rank_path(os.environ["PROFILE"], rank), cuda)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
