#!/usr/bin/env python3
"""PyTorch's side of the context-parallel benchmark (bench/cp/run.sh): the independent PyTorch Llama
(tests/models/torch_llama.py) under torch.distributed.tensor.experimental.context_parallel with FSDP2, beside
train_gpt --cp in the same layout.

How PyTorch's CP is driven (torch 2.6-2.11, the legacy context manager torchtitan used): each step enters
context_parallel(mesh["cp"], buffers=[tokens, targets, rotary cos, rotary sin], buffer_seq_dims=[1, 1, 0, 0]),
which reorders every buffer along its sequence dimension with the head-tail load balancer (rank r keeps chunks r
and 2 cp - 1 - r, as tessera's parallel/context/chunks.h) and keeps this rank's share in place, then patches
F.scaled_dot_product_attention so that the blocks' SDPA(q, k, v, is_causal=True) (no mask; grouped-query K and
V repeated to the query heads first, as torch_llama.py does) runs as ring attention over cp with K and V
all-gathered (set_rotate_method("allgather"), tessera's choice). Backward runs inside the context (recompute
included), the rotary tables are restored on exit. FSDP2 fully_shard per block and the root over all dp x cp
ranks (bf16 parameters, fp32 reduction: torchtitan's dp_shard x cp), AdamW(fused=True), clipping at 1.0. Each
rank's loss is the mean over its T / cp tokens; every rank holds as many, so FSDP's average of the gradients
over dp x cp is the gradient of the global mean, and the loss printed is the mean over all ranks.
SDPA is restricted to FlashAttention-2 and the memory-efficient kernel (tessera's kernels) unless SDPA says
otherwise.

  torchrun --standalone --nproc_per_node=N bench/cp/torch_cp.py
Env: MODEL (llama3-1b, llama3-8b; llama-tiny for a smoke run), T (sequence length), CP (cp size; DP = N / CP, one
sequence per data-parallel replica), RECOMPUTE (none|selective|full: bench/llama's meaning), WARM (3) warm-up
steps then STEPS (5) timed ones, SDPA (flash,efficient; a comma list of flash|efficient|cudnn|math, or default:
PyTorch's own choice).
Output: rank 0 prints "STEP {json}" after every step (its time, the loss averaged over ranks, the fullest rank's
peak so far: a run cut short still leaves its steps) and "RESULT {json}" at the end (bench/results.py's keys;
bench/results.py cp adds MFU). Memory as train_gpt --breakdown's phases: the peak allocated within forward and
the loss, within backward, within clipping and the optimizer step, each the fullest rank's largest over the
timed steps; peak_mem_GiB the largest phase peak of all steps (construction excluded on both sides). A failure
prints one line per rank, "torch_cp.py: FAILED on rank R at PHASE: Type: message" (with the allocator's state
for an out-of-memory error), before the traceback; rank 0 prints "[torch_cp] at PHASE (+S s)" as it enters each
phase, and SIGTERM (run.sh's timeout) dumps where each rank's main thread was before the default action ends it.
"""
import contextlib
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
import traceback

T_START = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "llama"))
from torch_llama_parallel import build, clip_grads, prepare_blocks  # noqa: E402
from torch_llama_train import PRESETS  # noqa: E402  (puts tests/models on the path)
from torch_llama import Config, loss_fn  # noqa: E402

SEED = 1234
PHASES = ("mem_peak_forward_gib", "mem_peak_backward_gib", "mem_peak_optimizer_gib")


class State:
    """Where the run is, for the one-line failure report."""
    rank = int(os.environ.get("RANK", -1))
    phase = "start-up"
    dev = None


def enter(phase):
    State.phase = phase
    if State.rank == 0:
        print(f"[torch_cp] at {phase} (+{time.perf_counter() - T_START:.1f} s)", flush=True)


def gib(b):
    return b / 2**30


def memory_text(dev):
    if dev is None or not torch.cuda.is_available():
        return ""
    try:
        _, total = torch.cuda.mem_get_info(dev)
        return (f" [allocated {gib(torch.cuda.memory_allocated(dev)):.2f} GiB, peak "
                f"{gib(torch.cuda.max_memory_allocated(dev)):.2f} GiB, reserved {gib(torch.cuda.memory_reserved(dev)):.2f}"
                f" GiB of {gib(total):.2f} GiB]")
    except Exception:  # noqa: BLE001  (the report must not fail)
        return ""


def one_line(e):
    text = " ".join(str(e).split("\n")[:1]).strip() or repr(e)
    return (text[:400] + "...") if len(text) > 400 else text


def fail(e):
    oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
    print(f"torch_cp.py: FAILED on rank {State.rank} at {State.phase}: {type(e).__name__}: {one_line(e)}"
          f"{memory_text(State.dev) if oom else ''}", flush=True)


CP_MODULES = ("torch.distributed.tensor.experimental._context_parallel._attention",  # torch >= 2.9
              "torch.distributed.tensor.experimental.context_parallel._attention",
              "torch.distributed.tensor.experimental._attention")  # before 2.9; later a re-export


def cp_api():
    """context_parallel, the rotate-method setter and the options, from the module that implements them, not the
    package's re-export (which some builds wrap in an alias that is not callable)."""
    tried = []
    for name in CP_MODULES:
        try:
            m = importlib.import_module(name)
            fn, setter, options = m.context_parallel, m.set_rotate_method, m._cp_options
        except (ImportError, AttributeError) as e:
            tried.append(f"{name}: {type(e).__name__}: {e}")
            continue
        if callable(fn):
            return fn, setter, options
        tried.append(f"{name}: context_parallel is a {type(fn).__name__}")
    raise ImportError(f"torch {torch.__version__}: no usable context_parallel ({'; '.join(tried)})")


def sdpa_context(choice):
    """A context limiting SDPA to the named backends (re-entered every step; its flags are global, so the
    recomputation in backward, on autograd's thread, sees them too)."""
    if choice == "default":
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    bad = [n for n in choice.split(",") if n not in names]
    if bad:
        sys.exit(f"torch_cp.py: SDPA={choice}: {bad} not among {sorted(names)} (or 'default')")
    backends = [names[n] for n in choice.split(",")]
    return lambda: sdpa_kernel(backends)


def main():
    name = os.environ.get("MODEL", "llama3-1b")
    if name not in PRESETS:
        sys.exit(f"torch_cp.py: MODEL={name} is not one of {sorted(PRESETS)}")
    cfg = Config(**PRESETS[name])
    cfg.seq_len = int(os.environ.get("T", cfg.seq_len))
    warm, steps = int(os.environ.get("WARM", 3)), int(os.environ.get("STEPS", 5))
    recompute = os.environ.get("RECOMPUTE", "none")
    if recompute not in ("none", "selective", "full"):
        sys.exit(f"torch_cp.py: RECOMPUTE={recompute} is not none, selective or full")
    if warm < 0 or steps < 1:
        sys.exit(f"torch_cp.py: WARM={warm} must be >= 0 and STEPS={steps} >= 1")
    if not torch.cuda.is_available() or int(torch.__version__.split(".")[0]) < 2:
        sys.exit(f"torch_cp.py: needs CUDA and torch >= 2 (context_parallel, FSDP2); this is torch {torch.__version__}")
    sdpa = sdpa_context(os.environ.get("SDPA", "flash,efficient"))
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)  # before the process group, so NCCL knows each rank's device
    State.dev = dev
    enter("init_process_group")
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    State.rank = rank
    cp = int(os.environ.get("CP", world))
    if cp < 1 or world % cp or cfg.seq_len % (2 * cp):
        sys.exit(f"torch_cp.py: CP={cp} must divide the {world} ranks and 2 CP the sequence length {cfg.seq_len}")
    dp = world // cp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    enter("context_parallel import")
    context_parallel, set_rotate_method, cp_options = cp_api()
    set_rotate_method("allgather")
    cp_options.enable_load_balance = True  # the head-tail balancer (its default; said here)
    enter("device meshes")
    mesh = init_device_mesh("cuda", (dp, cp), mesh_dim_names=("dp", "cp"))
    shard_mesh = init_device_mesh("cuda", (world,))  # FSDP over dp x cp, as torchtitan's dp_shard_cp
    enter("model build")
    model = prepare_blocks(build(cfg, dev), recompute, False)
    enter("fully_shard")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=shard_mesh, mp_policy=mp)
    fully_shard(model, mesh=shard_mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    dp_rank = mesh["dp"].get_local_rank()
    g = torch.Generator().manual_seed(SEED + dp_rank)  # one sequence per replica, the same on its cp ranks
    x = torch.randint(0, cfg.vocab, (1, cfg.seq_len), generator=g).to(dev)
    y = torch.randint(0, cfg.vocab, (1, cfg.seq_len), generator=g).to(dev)
    startup_s = time.perf_counter() - T_START
    if rank == 0:
        print(f"[torch_cp] {name} T {cfg.seq_len} on {world} GPUs: dp {dp} x cp {cp}, recompute {recompute}, "
              f"{warm} warm-up + {steps} timed steps, SDPA {os.environ.get('SDPA', 'flash,efficient')}, torch "
              f"{torch.__version__}; ready after {startup_s:.1f} s, allocated "
              f"{gib(torch.cuda.memory_allocated(dev)):.2f} GiB", flush=True)
    times, losses, phase_peaks, all_peak = [], [], {k: 0 for k in PHASES}, 0
    for i in range(warm + steps):
        timed = i >= warm
        enter(f"step {i + 1} forward")
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        xs, ys = x.clone(), y.clone()  # sharded in place; the rotary tables are restored on exit
        peaks = {}
        with sdpa(), context_parallel(mesh["cp"], buffers=[xs, ys, model.cos, model.sin],
                                      buffer_seq_dims=[1, 1, 0, 0], no_restore_buffers={xs, ys}):
            loss = loss_fn(model(xs), ys)
            peaks[PHASES[0]] = torch.cuda.max_memory_allocated(dev)  # the allocator's host-side count: no sync
            torch.cuda.reset_peak_memory_stats(dev)
            enter(f"step {i + 1} backward")
            loss.backward()
            peaks[PHASES[1]] = torch.cuda.max_memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        enter(f"step {i + 1} optimizer")
        clip_grads(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        peaks[PHASES[2]] = torch.cuda.max_memory_allocated(dev)
        times.append(dt)
        # Outside the timed region: the loss over all ranks, the fullest rank's phase peaks.
        enter(f"step {i + 1} report")
        stats = torch.tensor([loss.detach().float().item()] + [gib(peaks[k]) for k in PHASES], device=dev,
                             dtype=torch.float64)
        mean_loss = stats[:1].clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        step_peaks = dict(zip(PHASES, stats[1:].tolist()))
        all_peak = max(all_peak, max(step_peaks.values()))
        if timed:
            for k in PHASES:
                phase_peaks[k] = max(phase_peaks[k], step_peaks[k])
        losses.append(mean_loss.item() / world)
        if rank == 0:
            print("STEP", json.dumps(dict(step=i + 1, timed=timed, step_ms=round(dt * 1e3, 2), loss=round(losses[-1], 4),
                                          peak_mem_GiB=round(max(step_peaks.values()), 2))), flush=True)
    enter("result")
    timed_ms = sorted(times[warm:])
    med = timed_ms[len(timed_ms) // 2]  # the upper median, as results.py from-jsonl takes train_gpt's
    res = dict(mode=f"fsdp{dp}xcp{cp}", world=world, batch=dp, seq_len=cfg.seq_len, step_ms=round(med * 1e3, 2),
               tokens_per_s=round(dp * cfg.seq_len / med), peak_mem_GiB=round(all_peak, 2), recompute=recompute,
               last_loss=round(losses[-1], 4), warm=warm, steps=steps, sdpa=os.environ.get("SDPA", "flash,efficient"),
               startup_s=round(startup_s, 1), torch=torch.__version__,
               step_ms_all=[round(t * 1e3, 2) for t in times[warm:]], **{k: round(v, 2) for k, v in phase_peaks.items()})
    if rank == 0:
        print("RESULT", json.dumps(res), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    # Where a rank was when run.sh's timeout ended it: a C-level handler (it runs even while the main thread waits
    # in CUDA or NCCL), then SIGTERM's default action, so a stuck rank still dies and frees its GPU.
    faulthandler.register(signal.SIGTERM, all_threads=False, chain=True)
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001  (one line for the table, then the traceback)
        fail(e)
        if State.rank <= 0:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
