"""The suites of bench/results and what docs/performance.md says about each: its title, what it measures, the
columns its tables show there (by row kind), or "tables": show the run's own tables instead of its rows. A
suite not listed here cannot be written (results.py check). `scripts/bench SUITE` reproduces a suite."""

INTRO = """\
Every number here comes from `bench/results/<suite>.json`, written by `bench/results.py` from a benchmark run
that measured tessera and its PyTorch counterpart on the same model, data and GPUs in one run. Each run records
its command, machine and date; compare rows only within one run (clocks, drivers and neighbours move between
runs). `bench/results/<suite>.md` has every column and the run's notes; git history keeps earlier runs.

How we measure:
- **Timing.** Warm-up steps, then the median (upper median for an even count) of the timed steps.
- **Precision.** bf16 autocast over fp32 master weights with fused AdamW on both sides, unless a row says else.
- **MFU** is model FLOPs per second over the GPUs' dense bf16 peak (989 TFLOP/s per GPU for H100 and H200);
  each row names its FLOP convention (`flop_convention`: `src/models` `flopsPerToken`, attention counted over
  every (query, key) pair, as torchtitan and nanoGPT count it).
- **Peak memory** is the CUDA caching allocator's peak of allocated memory on the fullest rank.
- **Scaling** is tokens/s on G GPUs over G x the same system's one-GPU tokens/s in the same run.

Reproduce a suite on a GPU machine with `scripts/bench SUITE` (it builds what the suite needs); it replaces
the suite's run of the same name on the same machine. Then `bench/results.py docs` regenerates this page.
"""

_TRAIN = ["system", "layout", "gpus", "global_batch", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "peak_mem_gib"]
SUITES = {
    "single_gpu": dict(
        title="One GPU beside PyTorch eager and torch.compile",
        about="GPT-735M and llama3-1b trained by PyTorch eager, PyTorch `torch.compile` and `train_gpt` with its "
              "fused kernels off and on; the optimizer phase alone (tessera's AdamW against "
              "`torch.optim.AdamW(fused=True)`). `bench/single_gpu/run.sh BUILD LOGS shapes` adds Llama shapes "
              "that are not presets.",
        columns={"train": ["system", "model", "global_batch", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
                           "vs_pytorch_eager", "vs_pytorch_compile"],
                 "optimizer": ["system", "model", "step_ms", "vs_pytorch_fused"]}),
    "llama_curves": dict(
        title="llama3-1b on the Brown corpus: loss curves beside PyTorch",
        about="`train_gpt` and an independent PyTorch Llama (eager and compiled) from the same initial weights on "
              "the same Brown-corpus batches: throughput, the gap between the loss curves, activation recompute.",
        columns={"train": ["system", "global_batch", "step_ms", "tokens_per_s", "mfu", "peak_mem_gib",
                           "vs_pytorch_eager", "vs_pytorch_compile"]}),
    "scale": dict(
        title="Llama on several GPUs beside PyTorch's parallelism",
        about="`train_gpt` in each layout (DDP, FSDP, TP with and without sequence parallel, 1F1B and zero-bubble "
              "pipelines, 3D) beside the PyTorch Llama under DDP, FSDP2, DTensor TP and "
              "`torch.distributed.pipelining`, eager and with each block under `torch.compile` (torchtitan's "
              "recipe). Each system is scaled against its own one-GPU row of the same run.",
        columns={"train": _TRAIN + ["scaling", "vs_pytorch", "vs_compiled"]}),
    "tp": dict(
        title="Tensor parallelism on 70B-wide layers beside PyTorch's async TP",
        about="A slice of Llama-3-70B's widths (d 8192, ffn 28672, 64 heads, 8 kv heads, seq 4096, a few blocks, an "
              "untied 32000-token vocabulary) trained by `train_gpt` on one GPU and in TP + SP (bf16 and FP8), beside "
              "the PyTorch Llama under DTensor TP + SP with each block compiled, without and with async TP "
              "(inductor's micro-pipeline TP); each system scaled against its own one-GPU row. And the transfer "
              "collective matmul needs, probed: peer copies by the copy engines against NCCL beside a GEMM of that "
              "width.",
        columns={"train": _TRAIN + ["step_ms", "scaling", "vs_compiled", "vs_pytorch_asynctp"],
                 "collective": ["system", "payload_mib", "span_ms", "gemm_ms", "comm_ms", "hidden", "gemm_slowdown"]}),
    "variants": dict(
        title="train_gpt's variants of one layout",
        about="`train_gpt` alone on llama3-1b: data-parallel variants (gradients reduced in bf16, NCCL's CTAs, "
              "protocol and stream priority, gradients zeroed, the tied table's gradient) and other layouts, each "
              "scaled against the one-GPU run of the same call.",
        columns={"train": ["system", "layout", "gpus", "tokens_per_s", "mfu", "peak_mem_gib", "scaling"]}),
    "gpt735m": dict(
        title="GPT-735M per parallelism beside PyTorch",
        about="The anchors' GPT-735M trained by PyTorch (DDP, DTensor TP, pipelining, FSDP2) and by tessera "
              "(its benchmark drivers, `train_gpt` and the Python package), each parallelism beside both systems' "
              "one-GPU runs. `bench/targets.py` holds the ddp, tp, pp and fsdp runs to the issues' targets.",
        columns={"train": ["system", "layout", "gpus", "global_batch", "tokens_per_s", "mfu", "peak_mem_gib",
                           "scaling", "vs_pytorch"]}),
    "probes": dict(
        title="Parallel machinery probed on one GPU",
        about="Probes, not parallel runs: one process as rank 0 of 2 without communication "
              "(`TESSERA_FAKE_WORLD=2`), the same with communication emulated by a timed model, a 2-stage pipeline "
              "predicted from unit costs, and a one-stage pipeline. Never compare them with real multi-GPU rows.",
        columns={"train": ["system", "layout", "global_batch", "tokens_per_s", "mfu", "peak_mem_gib", "scaling",
                           "overhead_ms"]}),
    "fp8": dict(
        title="FP8 beside bf16 and PyTorch's FP8",
        about="`train_gpt --fp8` against `train_gpt` in bf16 and against compiled PyTorch with Float8 linears over "
              "`torch._scaled_mm`, in the same run; and the loss with and without FP8 on the Brown corpus (the same "
              "seed and data).",
        columns={"train": ["system", "layout", "seq_len", "precision", "tokens_per_s", "mfu", "peak_mem_gib",
                           "vs_compiled"],
                 "loss": ["system", "precision", "steps", "largest_gap", "final_loss_off", "final_loss",
                          "final_valid_gap"]}),
    "cp": dict(
        title="Context parallelism beside PyTorch's context_parallel",
        about="`train_gpt --cp` beside PyTorch's `context_parallel` with FSDP2 on the same model, sequence length, "
              "batch (one sequence per data-parallel replica) and recompute.",
        columns={"train": ["system", "model", "layout", "seq_len", "tokens_per_s", "mfu", "mfu_causal",
                           "peak_mem_gib", "vs_pytorch", "recompute"]}),
    "collectives": dict(
        title="NCCL collectives beside torch.distributed",
        about="tessera's NCCL communicator against `torch.distributed` (NCCL) in interleaved rounds, bf16: bus "
              "bandwidth per op and size.", tables=True),
    "data": dict(
        title="Data loading",
        about="The host's side (CPU): tessera's sampler and loader thread beside a torch `DataLoader`, "
              "Megatron's memmap dataset and nanoGPT's `get_batch` on the same files; and the training step on "
              "real data against synthetic tokens on one GPU.",
        tables=True, columns={"train": ["system", "layout", "tokens_per_s", "step_ms", "mfu", "scaling"]}),
    "checkpoint": dict(
        title="Checkpoints on the training step",
        about="`train_gpt` saving every few steps: no checkpoint, synchronous saves, asynchronous saves (what each "
              "save costs the training).",
        columns={"train": ["system", "step_ms", "first_save_cost_ms", "later_save_cost_ms", "save_cost_in_steps",
                           "tokens_per_s", "peak_mem_gib"]}),
    "moe": dict(
        title="Mixture of experts and expert parallelism beside a torchtitan-style PyTorch MoE",
        about="OLMoE-1B-7B- and Qwen3-30B-A3B-shaped MoEs (64 experts top 8; 128 experts top 8, cut to the blocks "
              "that fit; seq 4096) trained by `train_gpt --ep N` (FSDP and DDP) "
              "beside a torchtitan-style PyTorch MoE (`torch._grouped_mm` experts, `all_to_all_single` expert "
              "parallel, FSDP2, compiled blocks) with real and forced-balanced routing; MFU on active parameters, "
              "expert-load spread; a loss check of `--ep 2` against one rank first. A `-fp8` row ran `--fp8 tensorwise` "
              "(attention's linears), `-fp8-experts` also `--fp8-experts` (the routed experts' forward GEMMs in "
              "rowwise E4M3).",
        columns={"train": ["system", "layout", "gpus", "routing", "precision", "tokens_per_s", "tokens_per_s_per_gpu", "step_ms",
                           "mfu", "peak_mem_gib", "load_max_over_mean", "vs_pytorch", "mem_vs_pytorch"]}),
    "hf_memory": dict(
        title="Hugging Face import and export: host memory",
        about="`tessera-convert import-hf` / `export-hf` and `train_gpt --init-from-hf` on a llama3-8b-shaped "
              "checkpoint: each process's own memory (RssAnon), mapped file pages (RssFile) and GPU memory.",
        columns={"memory": ["system", "seconds", "rss_anon_max_gb", "rss_anon_sum_gb", "rss_file_max_gb",
                            "gpu_mib"]}),
}


def title(suite):
    return SUITES.get(suite, {}).get("title", suite)
