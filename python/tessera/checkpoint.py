"""Sharded checkpoints from Python: tessera's C++ format (src/checkpoint), resharded on load.

::

    tessera.checkpoint.save("ckpt/step100", model, opt, step=100, scheduler=sched, data_state=sampler.state_dict())
    info = tessera.checkpoint.load("ckpt/step100", model, opt, scheduler=sched)   # any layout, any world
    sampler.load_state_dict(info["data_state"]); start = info["step"]

    sd = tessera.checkpoint.full_state_dict(model)     # collective: unsharded tensors on rank 0
    sd = tessera.checkpoint.load_full("ckpt/step100")  # one process, no tessera.init needed
    plain_model.load_state_dict(sd)                    # names as in the unsharded model

``model`` is what this rank trains: a ``torch.nn.Module``, a :class:`tessera.DistributedDataParallel`,
a :class:`tessera.FullyShardedDataParallel`, a :class:`tessera.Pipeline` (its stages), or a list
of those (pipeline stages), or a dict ``{name prefix: module}`` when a stage's parameter names
need a prefix to become the unsharded model's names (e.g. ``{"blocks.4.": stage_block}``).

Every tensor is saved under the unsharded model's parameter name, as the box this rank holds:
tensor-parallel shards (:mod:`tessera.nn` layers mark their parameters) are boxes of the full
weight, pipeline stages hold different names, data-parallel replicas the same box (written once),
and FSDP's flat shards are all-gathered over the shard group into the parameters' full values first
(with the C++ FSDP's gather, as train_gpt's checkpoints). Optimizer state is saved as
``optim.<key>.<name>`` in the same boxes (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ... and
scalars such as ``step``), so a checkpoint loads into any dp × pp × tp layout, with DDP or FSDP, any
world size (train_gpt's checkpoints use the same names for ``exp_avg``/``exp_avg_sq``). The
optimizer's hyperparameters per group, the LR scheduler's state, the step and ``data_state`` are
saved beside them (metadata ``extra``, JSON).

:func:`save` and :func:`full_state_dict` are collective over ``world`` (default: the world of
:func:`tessera.init`); :func:`load` only reads (every rank reads what it needs). Errors (a
missing tensor, a shape that does not fit, a box not covered, a corrupted file) are
:class:`tessera.Error` naming the tensor or file.
"""
import json
import os
import pickle

import torch

from . import _C
from .parallel import DistributedDataParallel, FullyShardedDataParallel, Pipeline, ShardedAdamW

_ck = _C.checkpoint

_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
           "Long": torch.int64, "Int": torch.int32, "Bool": torch.bool}


def shard_of(param, global_shape, offset):
    """Marks ``param`` as the box ``[offset, offset + param.shape)`` of a tensor of ``global_shape``
    (what :mod:`tessera.nn`'s tensor-parallel layers do for their weight shards)."""
    param._tessera_shard = (tuple(int(s) for s in global_shape), tuple(int(o) for o in offset))
    return param


def _box(t):
    return getattr(t, "_tessera_shard", None) or (tuple(t.shape), (0,) * t.dim())


class _Slot:
    """One tensor of the unsharded model as this rank holds it: ``value`` is the box (a view to
    save from and load into), ``param`` the optimizer's key for its state (or None)."""

    def __init__(self, name, value, shape, offset, param=None):
        self.name, self.value, self.shape, self.offset, self.param = name, value, shape, offset, param


def _default_world():
    from . import _default_context
    if _default_context is None:
        raise _C.Error("tessera.checkpoint: call tessera.init() first or pass world=")
    return _default_context.world


def _parts(model):
    """[(prefix, module)] of what this rank trains."""
    if isinstance(model, dict):
        return [(p, m) for p, m in model.items()]
    if isinstance(model, (list, tuple)):
        return [x for m in model for x in _parts(m)]
    if isinstance(model, Pipeline):
        return [("", s) for s in model.stages if isinstance(s, torch.nn.Module)]
    return [("", model)]


def _buffers(prefix, module):
    """Persistent buffers by name (as the module's state_dict has them)."""
    params = {n for n, _ in module.named_parameters()}
    sd = module.state_dict(keep_vars=True)
    return [(prefix + n, t) for n, t in sd.items() if n not in params and isinstance(t, torch.Tensor)]


# ---- FSDP: full flat buffers per unit (gathered over the shard group)

class _FlatFull:
    def __init__(self, fsdp, gather):
        f = fsdp._fsdp
        self.fsdp, self.r = fsdp, f.shard_rank
        self.layouts = [f.layout(u) for u in range(f.num_units)]
        self.values = [self._full(u, f.master_shard(u), gather) for u in range(f.num_units)]
        self.where = {e[0]: (u, e) for u, lay in enumerate(self.layouts) for e in lay["entries"]}

    def _full(self, u, shard, gather):
        if gather:  # the C++ gather of train_gpt's checkpoints (FullyShardedDataParallel::gatherFull)
            return self.fsdp._fsdp.gather_full(u, shard.contiguous())
        return torch.zeros(self.layouts[u]["padded_numel"], dtype=shard.dtype, device=shard.device)

    def view(self, flat, name):
        u, (_, shape, off, numel, _) = self.where[name]
        return flat[u][off:off + numel].view(shape)

    def state(self, opt, key, gather):
        """Full flat buffers of optimizer state ``key``: a torch optimizer's state of each flat
        view placed at the view's offset, or ShardedAdamW's shard state."""
        sd = opt._opt.state_dict() if isinstance(opt, ShardedAdamW) else None
        out = []
        for u, lay in enumerate(self.layouts):
            mine = torch.zeros(lay["shard_numel"], dtype=torch.float32, device=self.values[u].device)
            if sd is not None:
                s = sd[f"{self.fsdp._fsdp.unit_name(u)}.{key}"]
                mine[:s.numel()].copy_(s)
            for p in (self.fsdp.parameters() if sd is None else []):
                fv = p._tessera_flat
                s = opt.state.get(p, {}).get(key) if opt is not None else None
                if fv.unit == u and s is not None:
                    mine[fv.offset:fv.offset + p.numel()].copy_(s.reshape(-1))
            out.append(self._full(u, mine, gather))
        return out

    def load_sharded_adamw(self, opt, flats, step):
        """After a load: this rank's shard state (the trainable elements) into ShardedAdamW."""
        f = self.fsdp._fsdp
        sd = {"step": torch.tensor(step, dtype=torch.int64)}
        for u, lay in enumerate(self.layouts):
            n = lay["shard_numel"]
            mine = max(0, min(n, lay["trainable_numel"] - self.r * n))
            for k, flat in flats.items():
                sd[f"{f.unit_name(u)}.{k}"] = flat[u][self.r * n:self.r * n + mine].clone()
        opt._opt.load_state_dict(sd)

    def keep_shards(self):
        """After a load: this rank's shard of each full buffer back into FSDP's master shards."""
        f = self.fsdp._fsdp
        with torch.no_grad():
            for u, lay in enumerate(self.layouts):
                n = lay["shard_numel"]
                f.master_shard(u).copy_(self.values[u][self.r * n:(self.r + 1) * n])


def _slots(model, gather_fsdp):
    """(slots, fsdp parts [(prefix, FSDP, _FlatFull)])."""
    slots, fsdps = [], []
    for prefix, m in _parts(model):
        if isinstance(m, DistributedDataParallel):
            m = m.module
        if isinstance(m, FullyShardedDataParallel):
            full = _FlatFull(m, gather_fsdp)
            fsdps.append((prefix, m, full))
            for name, p in m.module.named_parameters():
                shape, off = _box(p)
                slots.append(_Slot(prefix + name, full.view(full.values, name), shape, off))
            slots += [_Slot(n, b.data, *_box(b)) for n, b in _buffers(prefix, m.module)]
            continue
        for name, p in m.named_parameters():
            shape, off = _box(p)
            slots.append(_Slot(prefix + name, p.data, shape, off, p))
        slots += [_Slot(n, b.data, *_box(b)) for n, b in _buffers(prefix, m)]
    return slots, fsdps


def _all_gather_object(comm, obj):
    """Every rank's ``obj`` (picklable), in rank order. Collective over ``comm``."""
    data = torch.tensor(list(pickle.dumps(obj)), dtype=torch.int32)  # one byte per element (no uint8 collectives)
    dev = torch.device("cpu") if comm.backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
    sizes = torch.zeros(comm.size, dtype=torch.int64, device=dev)
    comm.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=dev))
    most = int(sizes.max().item())
    buf = torch.zeros(most, dtype=torch.int32)
    buf[:data.numel()] = data
    out = torch.empty(comm.size * most, dtype=torch.int32, device=dev)
    comm.all_gather(out, buf.to(dev))
    out = out.cpu()
    return [pickle.loads(bytes(out[r * most:r * most + int(sizes[r])].tolist())) for r in range(comm.size)]


def _state_keys(opt, params, world):
    """Optimizer state keys (tensor or None values) any rank has, sorted; the same on every rank."""
    if isinstance(opt, ShardedAdamW):
        return ["exp_avg", "exp_avg_sq"]  # its step is the checkpoint's (as train_gpt's)
    keys = set()
    for p in params:
        for k, v in opt.state.get(p, {}).items():
            if v is not None and not isinstance(v, torch.Tensor):
                raise _C.Error(f"tessera.checkpoint: optimizer state '{k}' is a {type(v).__name__}; only tensors "
                               "(and None) can be saved")
            if v is not None:
                keys.add(k)
    return sorted(set().union(*_all_gather_object(world, sorted(keys))))


def _optimizer_pieces(opt, slots, fsdps, keys, gather):
    """[(name, shape, offset, tensor)] of the optimizer state, in the slots' boxes."""
    out = []
    for s in slots:
        st = opt.state.get(s.param, {}) if isinstance(opt, torch.optim.Optimizer) and s.param is not None else {}
        for k in keys:
            v = st.get(k)
            if v is None:
                continue
            if v.dim() == 0:
                out.append((f"optim.{k}.{s.name}", [], [], v))
            else:
                out.append((f"optim.{k}.{s.name}", list(s.shape), list(s.offset), v))
    for prefix, fsdp, full in fsdps:
        params = list(fsdp.parameters()) if isinstance(opt, torch.optim.Optimizer) else []
        for k in keys:
            if isinstance(opt, ShardedAdamW):
                per_elem = opt._fsdp is fsdp
            else:
                per_elem = opt is not None and any(opt.state.get(p, {}).get(k) is not None and opt.state[p][k].dim() > 0
                                                   for p in params)
            flat = full.state(opt, k, gather) if _agree(per_elem, fsdp) else None
            for name, p in fsdp.module.named_parameters():
                if flat is not None and p.requires_grad:
                    shape, off = _box(p)
                    out.append((f"optim.{k}.{prefix}{name}", list(shape), list(off), full.view(flat, name)))
            for p in params:  # scalars (step): per original parameter the view covers
                v = opt.state.get(p, {}).get(k)
                if v is not None and v.dim() == 0:
                    out += [(f"optim.{k}.{prefix}{n}", [], [], v) for n, _, _ in p._tessera_flat.parts]
    return _dedup(out)


def _agree(flag, fsdp):
    """True when any rank of the FSDP shard group says so (collective)."""
    t = torch.tensor([float(flag)])
    group = fsdp._fsdp.shard_group
    if group.backend != "gloo":
        t = t.cuda()
    group.all_reduce(t, "max")
    return bool(t.item())


def _dedup(pieces):
    seen, out = set(), []
    for p in pieces:
        key = (p[0], tuple(p[1]), tuple(p[2]))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _jsonable_groups(opt):
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def save(path, model, optimizer=None, *, step, world=None, scheduler=None, data_state=None, extra=None):
    """Collective over ``world``: ``model``'s parameters and persistent buffers, ``optimizer``'s
    state and hyperparameters, ``scheduler``'s state, ``step`` and ``data_state`` (a JSON-able
    dict, e.g. :meth:`tessera.data.Sampler.state_dict`) into the directory ``path``. ``extra``:
    more str -> str entries for the metadata. An interrupted save leaves the previous checkpoint
    at ``path`` intact."""
    world = world or _default_world()
    slots, fsdps = _slots(model, gather_fsdp=True)
    params = []
    if isinstance(optimizer, torch.optim.Optimizer):
        params = [s.param for s in slots if s.param is not None] + [p for _, f, _ in fsdps for p in f.parameters()]
    keys = _state_keys(optimizer, params, world) if optimizer is not None else []
    pieces = [(s.name, list(s.shape), list(s.offset), s.value) for s in slots]
    pieces = _dedup(pieces) + _optimizer_pieces(optimizer, slots, fsdps, keys, gather=True)
    meta = dict(extra or {})
    meta["python.optimizer_keys"] = json.dumps(keys)
    if isinstance(optimizer, torch.optim.Optimizer):
        meta["python.param_groups"] = json.dumps(_jsonable_groups(optimizer))
    if scheduler is not None:
        meta["python.scheduler"] = json.dumps(scheduler.state_dict())
    if data_state is not None:
        meta["python.data_state"] = json.dumps(data_state)
    _ck.save(os.fspath(path), pieces, world, int(step), meta)


def _metadata_path(d):
    """The metadata.pt of the checkpoint to read for ``d`` (C++ checkpoint::locate): ``d`` itself,
    the newest complete ``d/step-<N>`` of a run's directory (train_gpt's, tessera.train's), or
    ``d.old`` after a save interrupted between its renames; None when there is none. Raises
    :class:`tessera.Error` when ``d`` holds checkpoint files but nothing complete."""
    found = _ck.locate(d)
    return None if found is None else os.path.join(found, "metadata.pt")


def exists(path):
    """Whether ``path`` holds a checkpoint (as :func:`load` finds it: ``path``, its newest complete
    ``step-<N>``, or ``path.old``); :class:`tessera.Error` when it holds only an incomplete one."""
    return _metadata_path(os.fspath(path)) is not None


def read_metadata(path):
    """``{"step", "world", "extra", "shapes"}`` of the checkpoint at ``path`` (or ``path.old``),
    its checksum checked. Local; :class:`tessera.Error` naming the file when it is missing or
    corrupted."""
    return _ck.read_metadata(os.fspath(path))


def _saved_tensors(path):
    """{name: (shape, dtype)} of a checkpoint's metadata.pt (torch.load-able)."""
    d = os.fspath(path)
    mp = _metadata_path(d)
    if mp is None:
        raise _C.Error(f"checkpoint: no checkpoint at {d} (no metadata.pt)")
    _ck.read_metadata(d)  # checks metadata.pt against metadata.sum before torch.load reads it
    meta = torch.load(mp, weights_only=False)  # our own file: plain dicts, lists, strings, ints
    return {n: (tuple(t["shape"]), _DTYPES.get(t["dtype"], None)) for n, t in meta["tensors"].items()}


def load(path, model, optimizer=None, *, scheduler=None):
    """Loads what :func:`save` (or train_gpt) wrote at ``path`` into ``model`` (and
    ``optimizer``, ``scheduler``) in this rank's layout, whatever the layout and world size of the
    save. Not collective: every rank reads what it needs. ``optimizer``: a torch optimizer (its
    state is created where it has none yet, before its first step; a checkpoint without
    per-parameter steps, as train_gpt's, gives each parameter the checkpoint's step) or a
    :class:`tessera.ShardedAdamW`. Returns ``{"step", "data_state" (or None), "extra"}``."""
    path = os.fspath(path)
    saved = _saved_tensors(path)
    slots, fsdps = _slots(model, gather_fsdp=False)
    pieces = [(s.name, list(s.shape), list(s.offset), s.value) for s in slots]
    torch_opt = optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
    keys = sorted({n.split(".", 2)[1] for n in saved if n.startswith("optim.")}) if optimizer is not None else []
    in_opt = {id(p) for g in torch_opt.param_groups for p in g["params"]} if torch_opt is not None else set()
    for s in slots:
        if s.param is None or id(s.param) not in in_opt:
            continue
        for k in keys:
            name = f"optim.{k}.{s.name}"
            if name in saved:
                shape, dtype = saved[name]
                t = torch.zeros((), dtype=dtype, device=s.value.device) if shape == () else \
                    torch.zeros_like(s.value, dtype=dtype)
                torch_opt.state[s.param][k] = t
                pieces.append((name, list(s.shape) if shape else [], list(s.offset) if shape else [], t))
    flat_states = []  # (fsdp, _FlatFull, key, full flat buffers)
    for prefix, fsdp, full in fsdps:
        trainable = [(n, p) for n, p in fsdp.module.named_parameters() if p.requires_grad]
        for k in keys:
            if any(saved.get(f"optim.{k}.{prefix}{n}", ((),))[0] for n, _ in trainable):
                flat = [torch.zeros_like(v) for v in full.values]
                for n, p in trainable:
                    shape, off = _box(p)
                    pieces.append((f"optim.{k}.{prefix}{n}", list(shape), list(off), full.view(flat, n)))
                flat_states.append((fsdp, full, k, flat))
            for p in (fsdp.parameters() if torch_opt is not None else []):
                scalar = [f"optim.{k}.{prefix}{n}" for n, _, _ in p._tessera_flat.parts
                          if saved.get(f"optim.{k}.{prefix}{n}", (None,))[0] == ()]
                if scalar:
                    t = torch.zeros((), dtype=saved[scalar[0]][1], device=p.device)
                    torch_opt.state[p][k] = t
                    pieces.append((scalar[0], [], [], t))
    meta = _ck.load(path, pieces)
    for _, fsdp, full in fsdps:
        full.keep_shards()
        if isinstance(optimizer, ShardedAdamW) and optimizer._fsdp is fsdp:
            full.load_sharded_adamw(optimizer, {k: f for g, _, k, f in flat_states if g is fsdp}, meta["step"])
    for fsdp, full, k, flat in (flat_states if torch_opt is not None else []):
        for p in fsdp.parameters():
            fv = p._tessera_flat
            start = full.r * full.layouts[fv.unit]["shard_numel"] + fv.offset
            torch_opt.state[p][k] = flat[fv.unit][start:start + p.numel()].clone().view(p.shape)
    if torch_opt is not None:
        for st in torch_opt.state.values():
            if st and "step" not in st:  # train_gpt's checkpoints: one step for all
                st["step"] = torch.tensor(float(meta["step"]))
    ex = meta["extra"]
    if torch_opt is not None and "python.param_groups" in ex:
        groups = json.loads(ex["python.param_groups"])
        if len(groups) != len(torch_opt.param_groups):
            raise _C.Error(f"tessera.checkpoint.load: {path} holds {len(groups)} optimizer parameter groups, this "
                           f"optimizer has {len(torch_opt.param_groups)}")
        for g, saved_g in zip(torch_opt.param_groups, groups):
            for k, v in saved_g.items():
                g[k] = tuple(v) if isinstance(g.get(k), tuple) else v
    if scheduler is not None and "python.scheduler" in ex:
        scheduler.load_state_dict(json.loads(ex["python.scheduler"]))
    data = json.loads(ex["python.data_state"]) if "python.data_state" in ex else None
    return {"step": meta["step"], "data_state": data, "extra": ex}


def load_full(path, *, optimizer_state=False):
    """The unsharded tensors of a checkpoint by name (CPU), read in this one process (no
    tessera.init needed). ``optimizer_state=False`` leaves out the ``optim.*`` tensors."""
    saved = _saved_tensors(path)
    out = {n: torch.zeros(shape, dtype=dtype) for n, (shape, dtype) in saved.items()
           if optimizer_state or not n.startswith("optim.")}
    _ck.load(os.fspath(path), [(n, list(t.shape), [0] * t.dim(), t) for n, t in out.items()])
    return out


def full_state_dict(model, *, world=None, name_map=None):
    """Collective over ``world``: the unsharded parameters and persistent buffers of a parallel
    model on rank 0 (``{}`` elsewhere), float as trained, on the CPU, by the unsharded model's
    names (``name_map(name)`` renames; returning None drops a tensor), so that a plain
    ``torch.nn.Module`` of the same architecture can ``load_state_dict`` it."""
    world = world or _default_world()
    slots, _ = _slots(model, gather_fsdp=True)
    mine = _dedup([(s.name, tuple(s.shape), tuple(s.offset), s.value) for s in slots])
    index = _all_gather_object(world, [(n, sh, off, tuple(v.shape), str(v.dtype)) for n, sh, off, v in mine])
    dev = torch.device("cpu") if world.backend == "gloo" else torch.device("cuda", torch.cuda.current_device())
    out, seen = {}, set()
    for r, entries in enumerate(index):
        for k, (n, shape, off, sizes, dtype) in enumerate(entries):
            box = (n, off, sizes)
            if box in seen:
                continue  # a lower rank has it
            seen.add(box)
            if world.rank == 0:
                dt = getattr(torch, dtype.split(".")[1])
                full = out.setdefault(n, torch.zeros(shape, dtype=dt))
                dst = full
                for d, (o, s) in enumerate(zip(off, sizes)):
                    dst = dst.narrow(d, o, s)
                if r == 0:
                    dst.copy_(mine[k][3])
                else:
                    buf = torch.empty(sizes, dtype=dst.dtype, device=dev)
                    world.recv(buf, r)
                    dst.copy_(buf)
            elif world.rank == r:
                world.send(mine[k][3].detach().contiguous().to(dev), 0)
    if name_map is not None:
        out = {name_map(n): t for n, t in out.items() if name_map(n) is not None}
    return out


__all__ = ["save", "load", "load_full", "full_state_dict", "shard_of"]
