"""Hugging Face Llama directories for the Python Llama (:mod:`tessera.llama`), through the C++
mapping (src/hf/llama.h) and safetensors reader (tessera._C.hf: memory-mapped, so each rank
reads only the slices its shards need; no Python safetensors package).

::

    cfg = tessera.hf.config("Llama-3.2-1B", seq_len=1024)     # a LlamaConfig from config.json
    stage = tessera.llama.LlamaStage(cfg, mesh, stage=s, pp=pp)  # any dp x pp x tp layout
    tessera.hf.load(stage, "Llama-3.2-1B", mesh)               # this rank's shards from the files
    ...                                                         # fine-tune
    tessera.hf.save(stage, "out-hf", mesh, dtype="bf16")       # collective: rank 0 writes

``model_or_chunks`` is what this rank trains, as :mod:`tessera.checkpoint` takes it: a
:class:`tessera.llama.LlamaStage`, a :class:`tessera.DistributedDataParallel` or
:class:`tessera.FullyShardedDataParallel` of one, a :class:`tessera.Pipeline`, or a list of them.
Names: the stages' unsharded names (:func:`tessera.llama.unsharded_name`) map to transformers'
(``model.layers.N.self_attn.q_proj.weight``, ...); the rotary layouts are the same (rotate-half).
Errors (a config tessera cannot express, a missing or misshapen tensor, a model of another shape
than the directory's) are :class:`tessera.Error` naming the field, tensor or file.
"""
import json
import os

import torch

from . import _C
from .checkpoint import _dedup, _default_world, _parts, _slots
from .llama import LlamaConfig, LlamaStage, unsharded_name
from .parallel import DistributedDataParallel, FullyShardedDataParallel

_hf = _C.hf
_FIELDS = ("d", "layers", "heads", "kv_heads", "ffn", "vocab", "rope_theta", "rope_scaling", "tied", "norm_eps")


def config(hf_dir, **overrides):
    """The :class:`tessera.llama.LlamaConfig` of ``hf_dir``'s config.json (seq_len: its
    max_position_embeddings unless overridden). Local."""
    fields = _hf.llama_config(os.fspath(hf_dir))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return LlamaConfig(**fields)


def _stages(model):
    out = []
    for _, m in _parts(model):
        if isinstance(m, (DistributedDataParallel, FullyShardedDataParallel)):
            m = m.module
        if isinstance(m, LlamaStage):
            out.append(m)
    if not out:
        raise _C.Error("tessera.hf: the model holds no tessera.llama.LlamaStage")
    return out


def _check_config(cfg, hf_dir):
    theirs = _hf.llama_config(os.fspath(hf_dir))
    for f in _FIELDS:
        if getattr(cfg, f) != theirs[f]:
            raise _C.Error(f"tessera.hf: {hf_dir}: field {f} is {theirs[f]!r} in its config.json, {getattr(cfg, f)!r} "
                           "in this model (build it from tessera.hf.config)")


def load(model_or_chunks, hf_dir, mesh=None):
    """Fills this rank's parameters (its tp shards of its stages; FSDP: its flat shards) from the
    HF Llama at ``hf_dir``. Local: every rank reads only its slices. ``mesh`` is accepted for
    symmetry with :func:`save` (the layout is the model's)."""
    hf_dir = os.fspath(hf_dir)
    for st in _stages(model_or_chunks):
        _check_config(st.cfg, hf_dir)
    slots, fsdps = _slots(model_or_chunks, gather_fsdp=False)
    pieces = [(unsharded_name(s.name), list(s.shape), list(s.offset), s.value) for s in slots]
    with torch.no_grad():
        _hf.fill_llama(hf_dir, pieces)
        for _, _, full in fsdps:
            full.keep_shards()


def save(model_or_chunks, hf_dir, mesh=None, *, dtype="bf16", base_config=None):
    """Collective over the world (``mesh.world``, else tessera.init's): the model gathered to rank 0
    a tensor at a time and written as config.json + safetensors (+ index) + generation_config.json
    that transformers' ``LlamaForCausalLM.from_pretrained`` loads. ``dtype``: "bf16" (default) or
    "fp32". ``base_config``: an HF directory (or config.json) whose other fields to keep, e.g. the
    one the model was loaded from. FSDP units are gathered as :func:`tessera.checkpoint.save` does."""
    world = mesh.world if mesh is not None else _default_world()
    cfg = _stages(model_or_chunks)[0].cfg
    slots, _ = _slots(model_or_chunks, gather_fsdp=True)
    pieces = _dedup([(unsharded_name(s.name), list(s.shape), list(s.offset), s.value.detach()) for s in slots])
    fields = {f: getattr(cfg, f) for f in _FIELDS}
    fields["seq_len"] = cfg.seq_len
    base, source = "", ""
    if base_config is not None:
        path = os.fspath(base_config)
        source = path if os.path.isdir(path) else os.path.dirname(path)
        with open(os.path.join(path, "config.json") if os.path.isdir(path) else path) as f:
            base = json.dumps(json.load(f))
    _hf.export_llama(world, fields, pieces, os.fspath(hf_dir), dtype, base, source)


__all__ = ["config", "load", "save"]
