"""What a training row means beside the other rows of its run (derive()):
  scaling       tokens/s over (gpus x the tokens/s of the row's 1-GPU reference in the same run): the same
                system's single-GPU row ("<first word>-single" unless a --reference says otherwise)
  overhead_ms   (rows on more than one GPU) step_ms minus the reference's step_ms scaled to the row's tokens per
                GPU per step: exposed communication and any other cost of splitting
  hidden_comm_fraction  (rows with allreduce_ms) 1 - overhead_ms / allreduce_ms, clamped to [0, 1]
  scaled_against, scaling_vs_pytorch_single   the reference; the same scaling over pytorch-single's
  vs_<system>, vs_pytorch, vs_compiled        tokens/s over another row's, over PyTorch's row of the same layout
                                              (eager pytorch-<layout>, compiled pytorch-compiled-<layout>)
  vs_<twin>     tokens/s over the row <twin><layout> of another PyTorch variant (twins: prefixes such as
                "pytorch-asynctp-" -> vs_pytorch_asynctp), for the rows vs_pytorch compares
  mfu_causal    (Llama presets with an mfu) the mfu with causal attention's FLOPs (6 L d T, not 12): the
                convention of Megatron-Bridge's published TFLOP/s; the row's "layers" where it has them (a slice)"""
from . import schema


def per_gpu_tokens(r):
    return r["tokens_per_s"] * r["step_ms"] / 1e3 / r["gpus"]


def reference(row, rows, refs):
    """The 1-GPU row `row` is scaled against (None when that row did not run)."""
    system = row["system"]
    ref = next((target for prefix, target in refs if system.startswith(prefix)), system.split("-")[0] + "-single")
    # A variant whose linears sum their weight gradients in the GEMM against the same model code on one GPU.
    if row["gpus"] > 1 and "fused" in str(row.get("variant") or "").split("+") and ref + "-fused" in rows:
        ref += "-fused"
    return rows.get(ref)


def pytorch_twin(system, rows, prefixes, twin="pytorch-"):
    """PyTorch's row of the same layout: for a row named <prefix><layout>, <twin><layout> (pytorch-<layout>;
    pytorch-compiled-<layout> for the compiled anchor) or, the layout's last "-" parts dropped one by one,
    the longest such PyTorch row (tessera-train-tp-sp -> pytorch-tp)."""
    for prefix in prefixes:
        if system.startswith(prefix):
            parts = system[len(prefix):].split("-")
            for n in range(len(parts), 0, -1):
                twin_row = rows.get(twin + "-".join(parts[:n]))
                if twin_row:
                    return twin_row
    return None


def _scale(r, one):
    r["scaled_against"] = one["system"]
    r["scaling"] = round(r["tokens_per_s"] / (r["gpus"] * one["tokens_per_s"]), 3)
    if r["gpus"] > 1:
        ideal = one["step_ms"] * per_gpu_tokens(r) / per_gpu_tokens(one)
        r["overhead_ms"] = round(r["step_ms"] - ideal, 2)
        if r.get("allreduce_ms"):
            r["hidden_comm_fraction"] = round(min(1.0, max(0.0, 1 - r["overhead_ms"] / r["allreduce_ms"])), 3)


def derive(rows, refs=(), versus=(), layouts=(), twins=()):
    """Adds the module's members to `rows` ({system: row}); `refs`: (prefix, 1-GPU system) pairs; `versus`:
    systems every other row is compared with; `layouts`: prefixes whose rows get vs_pytorch and vs_compiled;
    `twins`: the prefixes of other PyTorch variants those rows are compared with, layout by layout."""
    refs = sorted(refs, key=lambda pt: -len(pt[0]))
    ps = rows.get("pytorch-single")
    for r in rows.values():
        if not isinstance(r.get("tokens_per_s"), (int, float)):
            continue
        full = schema.flops_per_token(r.get("model"), r.get("seq_len"), False, r.get("layers"))
        if full and isinstance(r.get("mfu"), (int, float)):
            causal = schema.flops_per_token(r.get("model"), r.get("seq_len"), True, r.get("layers"))
            r["mfu_causal"] = round(r["mfu"] * causal / full, 4)
        one = reference(r, rows, refs)
        if one:
            _scale(r, one)
        if ps:
            r["scaling_vs_pytorch_single"] = round(r["tokens_per_s"] / (r["gpus"] * ps["tokens_per_s"]), 3)
        for v in versus:
            if v in rows and v != r["system"] and rows[v].get("tokens_per_s"):
                r["vs_" + v.replace("-", "_")] = round(r["tokens_per_s"] / rows[v]["tokens_per_s"], 3)
        twin = pytorch_twin(r["system"], rows, layouts)
        if twin:
            r["vs_pytorch"] = round(r["tokens_per_s"] / twin["tokens_per_s"], 3)
        compiled = pytorch_twin(r["system"], rows, layouts, twin="pytorch-compiled-")
        if compiled:
            r["vs_compiled"] = round(r["tokens_per_s"] / compiled["tokens_per_s"], 3)
        for t in twins:
            other = pytorch_twin(r["system"], rows, layouts, twin=t)
            if other:
                r["vs_" + t.strip("-").replace("-", "_")] = round(r["tokens_per_s"] / other["tokens_per_s"], 3)
