"""The one row schema of bench/results/<suite>.json. Every row carries every name of FIELDS (null where it does
not apply to the row's kind); complete() fills them from the run and the writer's defaults, problems() checks.
  kind            train | optimizer | collective | data | memory | loss
  system          who ran it: tessera-..., pytorch-..., nanogpt-...
  model, layout   the model (a train_gpt preset or a shape) and the parallel layout: "single", "fsdp 4",
                  "tp 2 + sp", "pp 4, 16 micro-batches", "fsdp 2 x cp 2", ...
  gpus, seq_len, global_batch   GPUs of the layout; tokens per sequence; sequences per step, all replicas
  precision       "bf16" (autocast over fp32 master weights), "fp32", "bf16 + fp8 tensorwise", ...
  tokens_per_s, tokens_per_s_per_gpu   training tokens per second (kind train)
  mfu, flop_convention   model FLOPs per second over the GPUs' peak, and how those FLOPs are counted
  peak_mem_gib    the caching allocator's peak of allocated memory on the fullest rank (GiB)
  machine, date, command   the run's: its GPUs ("4 x NVIDIA H200") or CPU, when (UTC), what ran
A row may carry more (step_ms, scaling, vs_pytorch, ...): the runner's own keys, kept as they came."""
import re

FIELDS = ("kind", "system", "model", "layout", "gpus", "seq_len", "global_batch", "precision", "tokens_per_s",
          "tokens_per_s_per_gpu", "mfu", "flop_convention", "peak_mem_gib", "machine", "date", "command")
KINDS = ("train", "optimizer", "collective", "data", "memory", "loss")
RUN_FIELDS = ("run", "title", "date", "machine", "command", "rows")
PEAK_FLOPS = 989e12  # dense bf16 per GPU, the H100/H200 datasheet's: every suite's MFU is over this
_PEAK = "over gpus x 989 TFLOP/s (dense bf16)"
FLOP_CONVENTIONS = {
    "llama": "6 x (L x block parameters + V x d) + 12 x L x d x T per token, forward and backward; causal "
             "attention not halved; " + _PEAK,
    "gpt": "6 x N (every parameter, the embedding table included) + 12 x L x d x T per token, forward and "
           "backward; causal attention not halved; " + _PEAK,
}
# The Llama presets' shapes (src/models/config.cpp): MFU for a row that lacks it (flops_per_token).
LLAMA_SHAPES = {"llama3-1b": dict(d=2048, layers=16, heads=32, kv_heads=8, ffn=8192, vocab=128256),
                "llama3-8b": dict(d=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256),
                "llama-tiny": dict(d=64, layers=4, heads=4, kv_heads=2, ffn=192, vocab=4096)}
# Older RESULT keys (bench/torch_anchor.py's are the anchors') -> this schema's.
RENAMED = {"world": "gpus", "mfu_vs_989": "mfu", "peak_mem_GiB": "peak_mem_gib"}
# A file name that names hardware: a card, a vendor, a GPU count, the CPU.
HARDWARE_NAME = re.compile(r"(?i)[abh]\d{3}|gb\d{3}|mi\d{3}|nvidia|amd|intel|cpu|\d+[\s_-]*x?[\s_-]*gpus?|gpus?\d")
# A rented machine's kind as a device lender names it ("nvidia-<card>-x<N>"): never in results or docs.
RENTED_KIND = re.compile(r"(?i)nvidia-[a-z]+\d+(-x\d+)?\b")


def arch(model):
    return "gpt" if re.match(r"(?i)(gpt|735m)", str(model or "")) else "llama"


def flops_per_token(model, seq_len, causal=False, layers=None):
    """src/models flopsPerToken for a Llama preset (None for other models), with `layers` blocks where given
    (a slice); causal: attention's 6 L d T."""
    c = LLAMA_SHAPES.get(model)
    if not c or not seq_len:
        return None
    n = layers or c["layers"]
    hd = c["d"] // c["heads"]
    block = 2 * c["d"] ** 2 + 2 * c["d"] * c["kv_heads"] * hd + 3 * c["d"] * c["ffn"] + 2 * c["d"]
    return 6.0 * (n * block + c["vocab"] * c["d"]) + (6.0 if causal else 12.0) * n * c["d"] * seq_len


def layout_of(r):
    """The row's layout in words: its own "layout", else from train_gpt's mode "DPxPPxTP[xCP] dp_mode", else
    from the words of its system and mode (pytorch-tp-sp, tessera-pp-1F1B-mb16, ...) and its GPUs."""
    if r.get("layout"):
        return r["layout"]
    mode = str(r.get("mode") or "")
    words = set(re.split(r"[-_+ ]", str(r.get("system", "")).lower() + " " + mode.lower()))
    m = re.match(r"(\d+)x(\d+)x(\d+)(?:x(\d+))?(?: (\w+))?$", mode)
    if m:
        dp, pp, tp, cp = (int(x or 1) for x in m.group(1, 2, 3, 4))
        parts = [f"{m.group(5) or 'ddp'} {dp}" * (dp > 1), f"pp {pp}" * (pp > 1), f"tp {tp}" * (tp > 1),
                 f"cp {cp}" * (cp > 1)]
        text = " x ".join(p for p in parts if p) or "single"
    else:
        n = r.get("gpus") or 1
        kind = next((k for k in ("fsdp", "ddp", "tp", "pp", "cp") if k in words), None)
        text = f"{kind} {n}" if kind and n > 1 else "single"
    if (r.get("sequence_parallel") or "sp" in words) and " tp " in f" {text} ":
        text += " + sp"
    mb = r.get("micro_batches") or next((int(w[2:]) for w in words if re.fullmatch(r"mb\d+", w)), 1)
    if mb and mb > 1:
        text += f", {mb} micro-batches"
    if r.get("fake_world"):
        text += " (rank 0 alone on one GPU)"
    elif "emulated" in words:
        text += " (predicted on one GPU)"
    return text


def _global_batch(r):
    tps, ms, t = r.get("tokens_per_s"), r.get("step_ms"), r.get("seq_len")
    if isinstance(tps, (int, float)) and isinstance(ms, (int, float)) and t:
        seqs = tps * ms / 1e3 / t
        if seqs >= 0.5 and abs(seqs - round(seqs)) <= 0.05 * seqs:
            return int(round(seqs))
    return r.get("batch") if r.get("gpus") == 1 else None


def complete(row, run, defaults):
    """The row with every name of FIELDS: the run's machine, date and command; `defaults` (kind, model, layout,
    seq_len, precision, gpus) where the row has none; the rest derived (global batch from tokens per step,
    tokens per GPU, MFU of a Llama preset, the FLOP convention of a row with MFU)."""
    r = {RENAMED.get(k, k): v for k, v in row.items()}
    for k in ("kind", "model", "seq_len", "precision", "gpus"):
        if r.get(k) is None:
            r[k] = defaults.get(k, "train" if k == "kind" else None)
    fp8 = r.get("fp8") if r.get("fp8") not in (None, "off") else "fp8" in str(r.get("system")).split("-")
    if fp8 and r.get("precision") and "fp8" not in r["precision"]:  # a row in FP8: its recipe when known
        recipe = fp8 if isinstance(fp8, str) else defaults.get("fp8") or ""
        r["precision"] = f"{r['precision']} + fp8 {recipe}".strip()
    if r["kind"] == "data" and "tokens_per_s" in r:  # a reader's rate, not training: kept apart
        r["read_tokens_per_s"] = r.pop("tokens_per_s")
    if not r.get("layout"):
        r["layout"] = defaults.get("layout") or (layout_of(r) if r["kind"] in ("train", "loss") else None)
    if r.get("global_batch") is None:
        r["global_batch"] = (_global_batch(r) if r["kind"] == "train" else None) or defaults.get("global_batch")
    tps, gpus = r.get("tokens_per_s"), r.get("gpus")
    r["tokens_per_s"] = tps
    r["tokens_per_s_per_gpu"] = round(tps / gpus) if isinstance(tps, (int, float)) and gpus else None
    if r.get("mfu") is None and r["kind"] == "train" and isinstance(tps, (int, float)) and gpus:
        f = flops_per_token(r.get("model"), r.get("seq_len"))
        r["mfu"] = round(tps * f / (gpus * PEAK_FLOPS), 3) if f else None
    r.setdefault("mfu", None)
    r["flop_convention"] = FLOP_CONVENTIONS[arch(r.get("model"))] if r["mfu"] is not None else None
    r.setdefault("peak_mem_gib", None)
    for k in ("machine", "date", "command"):
        r[k] = run[k]
    head = {k: r[k] for k in FIELDS}
    return dict(head, **{k: v for k, v in r.items() if k not in head})


def row_problems(r, where):
    out = [f"{where}: no {k}" for k in FIELDS if k not in r]
    if out:
        return out
    if r["kind"] not in KINDS:
        out.append(f"{where}: kind {r['kind']!r} is not one of {', '.join(KINDS)}")
    for k in ("system", "machine", "date", "command"):
        if not r[k]:
            out.append(f"{where}: {k} is empty")
    if r["kind"] == "train" and not (r.get("status") or r.get("oom")):
        out += [f"{where}: a train row without {k}" for k in ("model", "layout", "gpus", "seq_len", "global_batch",
                                                               "precision", "tokens_per_s") if r[k] is None]
    if r["mfu"] is not None and not r["flop_convention"]:
        out.append(f"{where}: mfu without its flop_convention")
    return out


def problems(doc):
    """What is wrong with a suite document: a run without its members, a row without the schema's fields."""
    out = []
    for i, run in enumerate(doc.get("runs", [])):
        where = f"{doc.get('suite')} run {run.get('run', i)!r}"
        out += [f"{where}: no {k}" for k in RUN_FIELDS if not run.get(k) and k != "rows"]
        for j, r in enumerate(run.get("rows", [])):
            out += row_problems(r, f"{where} row {j} ({r.get('system')})")
    return out
