#!/usr/bin/env python3
"""Shapes that are not presets, for the one-GPU benchmark's `shapes` section (bench/single_gpu/run.sh,
issue 40: train_gpt >= 1.05x whole-model torch.compile on shapes nobody tuned for).

A spec is NAME:key=value,... (NAME: letters, digits, - and _), keys
  d layers heads kv ffn vocab T   width, blocks, attention heads, key/value heads, MLP width, vocabulary, length
  B                               the batch in sequences (default 8, train_gpt's on one GPU)
  tied                            1: the head is the embedding table, 0: its own
  theta                           the rotary base
Every key left out is llama3-1b's (train_gpt --model llama3-1b then the flags; the PyTorch Llama from
bench/llama/torch_llama_train.py's PRESETS["llama3-1b"] with the same overrides), Llama 3's rotary
frequency scaling included on both sides.
  shapes.py flags SPEC     train_gpt's flags for the shape, on one line (--model llama3-1b ... --batch B)
  shapes.py words SPEC     the resolved shape in words (what the results' table shows)

single_gpu.py imports it: config() for its PyTorch side, table() for its combiner.
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PRESET = "llama3-1b"
# spec key -> (torch_llama Config's field, train_gpt's flag); B, tied are handled apart.
KEYS = {"d": ("d", "--hidden-size"), "layers": ("layers", "--layers"), "heads": ("heads", "--heads"),
        "kv": ("kv_heads", "--kv-heads"), "ffn": ("ffn", "--ffn"), "vocab": ("vocab", "--vocab"),
        "T": ("seq_len", "--seq-len"), "theta": ("theta", "--rope-theta")}
SYSTEMS = ("pytorch-eager", "pytorch-compile", "tessera-fused")
TARGET = ("pytorch-compile", 1.05)  # issue 40: tessera-fused's tokens/s >= 1.05x compiled PyTorch's


def preset():
    sys.path.insert(0, os.path.join(HERE, "..", "llama"))
    import torch_llama_train as tl  # imports torch (its PRESETS are next to the Llama it builds)
    return dict(tl.PRESETS[PRESET])


def parse(spec):
    """(name, {key: value}) of a spec as given; ValueError naming what is wrong."""
    name, sep, rest = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"shape '{spec}': expected NAME:key=value,... with NAME of letters, digits, - and _")
    given = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in set(KEYS) | {"B", "tied"}:
            raise ValueError(f"shape '{spec}': '{item}' is not key=value with a key of "
                             f"{', '.join(sorted(set(KEYS) | {'B', 'tied'}))}")
        try:
            v = float(value) if key == "theta" else int(value)
        except ValueError:
            raise ValueError(f"shape '{spec}': {key}={value} is not a number") from None
        if v <= 0 and key != "tied" or key == "tied" and v not in (0, 1):
            raise ValueError(f"shape '{spec}': {key}={value} (expected {'0 or 1' if key == 'tied' else '> 0'})")
        given[key] = v
    return name, given


def config(spec):
    """(name, torch_llama Config's keyword arguments, batch) with train_gpt's checks on the shape."""
    name, given = parse(spec)
    cfg = preset()
    for key, (field, _) in KEYS.items():
        if key in given:
            cfg[field] = given[key]
    if "tied" in given:
        cfg["tied"] = bool(given["tied"])
    d, h, kv = cfg["d"], cfg["heads"], cfg["kv_heads"]
    if d % h or h % kv or (d // h) % 2:
        raise ValueError(f"shape '{spec}': d {d}, heads {h}, kv heads {kv}: d must divide by heads, heads by kv "
                         f"heads, and the head dimension d / heads must be even (src/models/config.cpp's validate)")
    return name, cfg, given.get("B", 8)


def flags(spec):
    """train_gpt's arguments for the shape: the preset, every key given, the batch."""
    _, given = parse(spec)
    config(spec)  # refuse a shape train_gpt would refuse
    out = ["--model", PRESET]
    for key, (_, flag) in KEYS.items():
        if key in given:
            out += [flag, repr(given[key]) if key == "theta" else str(given[key])]
    if "tied" in given:
        out.append("--tie-embeddings" if given["tied"] else "--untie-embeddings")
    return out + ["--batch", str(given.get("B", 8))]


def words(spec):
    _, c, b = config(spec)
    return (f"d {c['d']}, {c['layers']} layers, heads {c['heads']}/kv {c['kv_heads']} (hd {c['d'] // c['heads']}), "
            f"ffn {c['ffn']}, vocab {c['vocab']}, T {c['seq_len']}, B {b}, {'tied' if c['tied'] else 'untied'}, "
            f"theta {c['theta']:g}")


def table(rows, log_dir):
    """The rows of the table "Shapes that are not presets": rows of logs shape-NAME.*.log (their "model"
    shape-NAME), the spec from LOG_DIR/shape-NAME.spec (run.sh) or a row's own, a row per system that did not
    run; and a target line per shape. Rows are compared only with rows of their shape (one run of run.sh writes
    all of a shape's logs). Returns (table rows, target lines)."""
    import results  # bench/results.py (single_gpu.py puts bench/ on the path)
    verdicts, table_rows = [], []
    for model in sorted({r["model"] for r in rows}):
        name = model[len("shape-"):]
        mine = sorted((r for r in rows if r["model"] == model),
                      key=lambda r: SYSTEMS.index(r["system"]) if r["system"] in SYSTEMS else len(SYSTEMS))
        path = os.path.join(log_dir, model + ".spec")
        spec = open(path).read().strip() if os.path.exists(path) else next((r["spec"] for r in mine if "spec" in r), "")
        try:
            text = words(spec)
        except ValueError as e:
            text = f"(spec unknown: {e})"
        ref = {r["system"]: r for r in mine if isinstance(r.get("step_ms"), (int, float))}
        results.derive(ref, versus=(TARGET[0],))
        for r in mine:
            r.update(shape=name, spec=spec)
            if r.get("oom"):
                r["status"] = "out of memory"
        ran = {r["system"] for r in mine}
        shown = mine + [dict(system=s, step_ms=f"no result (see {model}.{s}.log)") for s in SYSTEMS if s not in ran]
        for i, r in enumerate(shown):
            table_rows.append(dict(r, shape=f"{name}: {text}" if i == 0 else "",
                                   step_ms=r.get("step_ms", "out of memory" if r.get("oom") else "—")))
        fused, other = ref.get("tessera-fused"), ref.get(TARGET[0])
        if fused and other:
            got = fused["tokens_per_s"] / other["tokens_per_s"]
            verdicts.append(f"{name}: tessera-fused {got:.3f}x {TARGET[0]} (target >= {TARGET[1]}): "
                            f"{'holds' if got >= TARGET[1] else 'NOT MET'}")
        else:
            missing = [s for s in ("tessera-fused", TARGET[0]) if s not in ref]
            verdicts.append(f"{name}: tessera-fused vs {TARGET[0]} (target >= {TARGET[1]}): not judged, no step time "
                            f"of {' and '.join(missing)} (failed or out of memory; see the logs)")
    return table_rows, verdicts


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("flags", "words"):
        sys.exit("usage: shapes.py flags|words SPEC")
    try:
        print(" ".join(flags(sys.argv[2])) if sys.argv[1] == "flags" else words(sys.argv[2]))
    except ValueError as e:
        sys.exit(f"shapes.py: {e}")


if __name__ == "__main__":
    main()
