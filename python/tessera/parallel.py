"""Wrappers of Python ``torch.nn.Module``s run by tessera's C++ runtime.

``DistributedDataParallel`` (src/parallel/ddp), ``Pipeline`` (src/pipeline's schedule executor
over this rank's stages), ``FullyShardedDataParallel`` and ``ShardedAdamW`` (src/parallel/data_parallel/fsdp),
each binding its C++ area in python/src/<area>.cpp.
"""

import torch

from . import _C


def _group_of(group, axis):
    """A Communicator as given, or a ProcessMesh's group on ``axis`` ("dp", "pp" or "tp")."""
    if isinstance(group, _C.ProcessMesh):
        return getattr(group, axis)
    if isinstance(group, _C.Communicator):
        return group
    raise TypeError(f"expected a tessera.Communicator or tessera.ProcessMesh, got {type(group).__name__}")


class DistributedDataParallel(torch.nn.Module):
    """Data parallelism for a Python ``torch.nn.Module``: bucketed gradient all-reduce over
    ``group``, started from C++ autograd hooks on the module's own parameters while backward
    runs (see src/parallel/ddp/ddp.h for the full contract).

    Construction is collective over ``group`` (a :class:`tessera.Communicator`, or a
    :class:`tessera.ProcessMesh`, whose dp group is used): every rank must wrap the same
    architecture (same parameter names, shapes, dtypes; else :class:`tessera.Error` names the
    first difference); parameters and buffers are then broadcast from rank 0.

    When ``loss.backward()`` returns, every parameter's ``.grad`` is the average over the group.
    Every synchronised backward must give each parameter with ``requires_grad`` a gradient,
    unless ``find_unused_parameters=True``; otherwise backward raises a ``RuntimeError`` naming
    the parameters that got none.

    Options (C++ ``DdpOptions``): ``bucket_cap_mb`` (25), ``first_bucket_cap_mb`` (1),
    ``gradient_as_bucket_view``, ``comm_dtype`` (``torch.bfloat16``/``torch.float16``),
    ``find_unused_parameters``, ``broadcast_buffers`` (buffers from rank 0 before each forward
    with grad enabled, as PyTorch DDP), ``rebuild_buckets``.
    """

    def __init__(self, module, group, *, bucket_cap_mb=25, first_bucket_cap_mb=1,
                 gradient_as_bucket_view=False, comm_dtype=None, find_unused_parameters=False,
                 broadcast_buffers=True, rebuild_buckets=True):
        super().__init__()
        self.module = module
        comm = _group_of(group, "dp")
        params = [(n, p) for n, p in module.named_parameters()]
        buffers = [(n, b) for n, b in module.named_buffers()]
        self.broadcast_buffers = broadcast_buffers and len(buffers) > 0
        # Not an nn.Module attribute: the C++ object is no parameter, buffer or submodule.
        object.__setattr__(self, "_ddp", _C.DistributedDataParallel(
            params, buffers, comm,
            bucket_cap_bytes=int(bucket_cap_mb * (1 << 20)),
            first_bucket_cap_bytes=int(first_bucket_cap_mb * (1 << 20)),
            gradient_as_bucket_view=gradient_as_bucket_view,
            comm_dtype=None if comm_dtype is None else str(comm_dtype),
            find_unused_parameters=find_unused_parameters,
            broadcast_buffers=broadcast_buffers,
            rebuild_buckets=rebuild_buckets))
        self._sync_enabled = True

    @property
    def group(self):
        """The communicator gradients are averaged over."""
        return self._ddp.comm

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and torch.is_grad_enabled() and self._sync_enabled:
            self._ddp.sync_buffers()
        return self.module(*args, **kwargs)

    def sync_buffers(self):
        """Collective: the module's buffers from rank 0 (forward does it when broadcast_buffers)."""
        self._ddp.sync_buffers()

    def no_sync(self):
        """Context manager: backward passes inside it only accumulate ``.grad`` locally; the
        first backward after it averages the accumulated gradients::

            with ddp.no_sync():
                loss_fn(ddp(x0), y0).backward()
            loss_fn(ddp(x1), y1).backward()    # .grad = average over ranks of (g0 + g1)
        """
        return _NoSync(self)

    def zero_grad(self, set_to_none=False):
        """Zero every parameter's ``.grad`` in place (keeps bucket views); ``set_to_none``
        drops them instead (as torch.nn.Module.zero_grad)."""
        if set_to_none:
            self.module.zero_grad(set_to_none=True)
        else:
            self._ddp.zero_grad()

    def bucket_layout(self):
        """Parameter names per bucket, in launch order."""
        return self._ddp.bucket_layout()


class _NoSync:
    def __init__(self, ddp):
        self._ddp = ddp
        self._guard = None

    def __enter__(self):
        self._guard = self._ddp._ddp.no_sync()
        self._guard.__enter__()
        self._prev = self._ddp._sync_enabled
        self._ddp._sync_enabled = False
        return self._ddp

    def __exit__(self, *exc):
        self._ddp._sync_enabled = self._prev
        self._guard.__exit__(*exc)
        return False


class Pipeline:
    """Pipeline parallelism for Python stages: this rank's stages (``torch.nn.Module``s or any
    callables taking and returning one tensor) run by tessera's C++ schedule executor over
    ``group`` (a :class:`tessera.Communicator`, or a :class:`tessera.ProcessMesh`, whose pp
    group is used). See src/parallel/pipeline/executor.h for the full contract.

    ``stages``: this rank's chunks in order; with ``schedule="interleaved_1f1b"`` rank r holds
    stages r, r + pp, r + 2 pp, ... (one per chunk), with ``"zbv"`` the two stages r and
    2 pp - 1 - r (a V: pp rank 0 holds the first and the last), else exactly one stage. Stage 0
    takes the micro-batch, the last stage's output goes to ``loss_fn(output, target)``.
    ``schedule``: ``"1f1b"`` (default), ``"gpipe"``, ``"interleaved_1f1b"`` or ``"zb_h1"`` (zero
    bubble: backward split into input- and weight-gradient passes; only tessera's own linears defer
    their weight gradients, so with ``torch.nn`` layers its weight passes are empty and it runs
    1F1B's order; not with data-parallel gradient hooks, which fire before the weight passes), or
    ``"zbv"`` (zero bubble over two chunks per rank in a V, the same split).
    ``micro_batches``: the batch (dim 0) is split into this many equal micro-batches.
    ``extra_warmup``: with ``"1f1b"``, this many more warm-up forwards on every stage but the
    last (for stages of unequal cost; at most pp − rank + extra_warmup micro-batches in flight).

    :meth:`step` is collective over the group: pass ``input`` on pp rank 0 and ``target`` on
    the rank of the last stage (the last pp rank; pp rank 0 with ``"zbv"``; ``None`` elsewhere). It runs forward and backward of every micro-batch;
    the gradients of the mean loss accumulate into the stages' parameters (zero them yourself,
    e.g. ``optimizer.zero_grad()``), and the mean loss comes back on every rank. The GIL is
    released while the schedule runs and taken again for each call of a stage or of
    ``loss_fn``. Bad steps (a batch not divisible into micro-batches, stages whose shapes do
    not fit) raise :class:`tessera.Error` on every rank with the communicator left usable.
    ``device``: where activations and the loss live (default: the group's, CPU for Gloo, the
    current CUDA device for NCCL).
    """

    def __init__(self, stages, group, *, micro_batches, loss_fn, schedule="1f1b", device=None,
                 free_sent_outputs=True, extra_warmup=0):
        self.group = _group_of(group, "pp")
        self.stages = list(stages)
        if device is None:
            device = "cpu" if self.group.backend == "gloo" else f"cuda:{torch.cuda.current_device()}"
        self.device = torch.device(device)
        self._exec = _C.PipelineExecutor(self.group, schedule, micro_batches, self.stages, loss_fn, str(self.device),
                                         free_sent_outputs, extra_warmup)

    def step(self, input=None, target=None):
        return self._exec.step(input, target)

    def evaluate(self, input=None, target=None):
        """Forward only, under no_grad (validation): the micro-batches through the stages one after
        another, no backward; the mean loss on every rank. Collective over the group like :meth:`step`."""
        return self._exec.evaluate(input, target)

    def parameters(self):
        """The parameters of this rank's stages (those that are modules), for the optimiser."""
        for s in self.stages:
            if isinstance(s, torch.nn.Module):
                yield from s.parameters()

    @property
    def peak_in_flight(self):
        """Micro-batches between forward and backward at once in the last step (at most pp - rank for 1F1B)."""
        return self._exec.peak_in_flight

    def describe(self, rank=None):
        """The schedule's actions on ``rank`` (default: this rank), one per line."""
        return self._exec.describe(self.group.rank if rank is None else rank)


def _dtype_name(d):
    return str(d) if d is not None else "torch.float32"


class FullyShardedDataParallel(torch.nn.Module):
    """Fully sharded data parallelism for a Python ``torch.nn.Module`` (src/parallel/data_parallel/fsdp): each
    unit's parameters are flattened and sharded over ``group``; a unit is all-gathered just
    before its forward and backward and its gradients reduce-scattered as soon as backward has
    produced them, all by the C++ runtime.

    ``units``: submodules of ``module`` (e.g. ``model.blocks``), each one FSDP unit; every other
    parameter of ``module`` forms the root unit (if there is any), which stays gathered from the
    start of forward to the end of backward (the whole forward runs inside it). A unit's
    ``forward`` must return a tensor or a tuple of tensors.
    Construction is collective over ``group`` (a :class:`tessera.Communicator`, or a
    :class:`tessera.ProcessMesh`, whose dp group is used): every rank wraps the same
    architecture; rank 0's values are broadcast (``sync_module_states``).

    After construction the module's parameters have no memory of their own outside forward and
    backward. What is trained are this rank's fp32 master shards of each unit's flat parameter
    (as FSDP1's ``use_orig_params=False``): :meth:`parameters` are ``torch.nn.Parameter`` views of
    them (the trainable elements of this rank's shard of each unit), whose ``.grad`` is this rank's
    shard of the gradient averaged over the group when ``loss.backward()`` returns. Any torch
    optimizer and LR scheduler works on them::

        opt = torch.optim.AdamW(fsdp.param_groups(lambda name: {"weight_decay": 0.0}
                                                  if name.endswith("bias") or "norm" in name else {}),
                                lr=1e-3, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        loss_fn(fsdp(x), y).backward(); fsdp.clip_grad_norm_(1.0); opt.step(); sched.step(); opt.zero_grad()

    A parameter that got no gradient on any rank has zeros in the flat gradient (optimizers see a
    zero gradient, not None: momentum and weight decay still apply to it, as in FSDP1). Clip with
    :meth:`clip_grad_norm_` (the norm over all shards), not ``torch.nn.utils.clip_grad_norm_``
    on the shards. Or train with :class:`tessera.ShardedAdamW` (fused). Read the weights with
    :meth:`full_state_dict`.

    Options (C++ ``FsdpOptions``): ``param_dtype`` (compute dtype of the gathered parameters,
    default float32), ``reduce_dtype`` (float32), ``reshard_after_forward`` (True),
    ``prefetch_budget_mb`` (MiB of unsharded parameters allowed in flight, 0 = no prefetch),
    ``shard_group_size`` (hybrid sharding: shard within groups of this many ranks),
    ``sync_module_states`` (True). With ``param_dtype`` set, floating-point tensors given to the
    wrapper and to each unit's forward are cast to it (as torch FSDP's ``cast_forward_inputs``), so
    an fp32 batch meets bf16 weights without a cast of the caller's.
    """

    def __init__(self, module, group, *, units, param_dtype=None, reduce_dtype=None, reshard_after_forward=True,
                 prefetch_budget_mb=0, shard_group_size=0, sync_module_states=True):
        super().__init__()
        self.module = module
        self.group = _group_of(group, "dp")
        self._param_dtype = param_dtype
        units = list(units)
        names = {id(m): n for n, m in module.named_modules()}
        in_unit, specs = set(), []
        for m in units:
            if id(m) not in names:
                raise ValueError("FullyShardedDataParallel: a unit is not a submodule of the wrapped module")
            prefix = names[id(m)]
            params = [(f"{prefix}.{n}" if prefix else n, p) for n, p in m.named_parameters()]
            in_unit.update(id(p) for _, p in params)
            specs.append((prefix or "module", params, None))
        root = [(n, p) for n, p in module.named_parameters() if id(p) not in in_unit]
        self._has_root = bool(root)  # no root unit when every parameter is in a unit
        self._fsdp = _C.FullyShardedDataParallel(
            ([("root", root, False)] if root else []) + specs, self.group, _dtype_name(param_dtype),
            _dtype_name(reduce_dtype), reshard_after_forward, int(prefetch_budget_mb * 2**20), shard_group_size,
            sync_module_states)
        for i, m in enumerate(units):
            self._wrap_unit(m, i + 1 if root else i)
        self._views = None  # the flat shards' Parameter views, made on first use

    def _wrap_unit(self, m, index):
        orig = m.forward
        fsdp = self._fsdp

        def forward(*args, **kwargs):
            args, kwargs = self._cast_inputs(args, kwargs)
            out = fsdp.run_unit(index, lambda: orig(*args, **kwargs))
            return out[0] if len(out) == 1 else tuple(out)
        m.forward = forward

    def _cast_inputs(self, args, kwargs):
        """Floating-point tensors among the arguments (also inside lists, tuples, dicts) cast to
        ``param_dtype`` (nothing without one)."""
        dtype = self._param_dtype
        if dtype is None:
            return args, kwargs

        def cast(x):
            if torch.is_tensor(x):
                return x.to(dtype) if x.is_floating_point() and x.dtype != dtype else x
            if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
                return type(x)(*(cast(v) for v in x))
            if isinstance(x, (list, tuple)):
                return type(x)(cast(v) for v in x)
            if isinstance(x, dict):
                return {k: cast(v) for k, v in x.items()}
            return x
        return cast(args), cast(kwargs)

    def forward(self, *args, **kwargs):
        args, kwargs = self._cast_inputs(args, kwargs)
        if not self._has_root:
            return self.module(*args, **kwargs)
        out = self._fsdp.run_unit(0, lambda: self.module(*args, **kwargs))
        return out[0] if len(out) == 1 else tuple(out)

    def no_sync(self):
        """Context manager: backward accumulates unsharded gradients locally, no communication."""
        return self._fsdp.no_sync()

    def keep_gathered(self):
        """Context manager for gradient accumulation: a unit once gathered stays gathered until the
        block ends (one all-gather per unit for all the micro-batches inside it, at the memory of
        every unit gathered at once). Leave it before the optimizer steps: the gathered copies
        would keep the old values (tessera's ShardedAdamW refuses to step inside it)."""
        return self._fsdp.keep_gathered()

    # ---- the flat shards as torch.nn.Parameters (for torch optimizers)

    def param_groups(self, options=None):
        """Parameter groups for a torch optimizer: ``options(name)`` gives the optimizer options
        (a dict, e.g. ``{"weight_decay": 0.0}``; ``{}``: the optimizer's defaults) of the original
        parameter ``name`` (as in ``module.named_parameters()``). Returns ``[{"params": [...],
        **opts}, ...]``, one group per distinct options dict, in the order the options first occur
        in the model (the same on every rank; a rank whose shards hold none of a group's elements
        gets that group with no parameters). Each parameter is a ``torch.nn.Parameter`` viewing a
        run of this rank's fp32 master shard of one unit over original parameters of one group.
        Replaces the views :meth:`parameters` returned before: build the optimizer afterwards."""
        return self._make_views(options or (lambda name: {}))

    def named_parameters(self, prefix="", recurse=True, *args, **kwargs):
        """("<unit>.flat<i>", view) for the views of :meth:`param_groups` (by default one per
        unit: every trainable element of this rank's shard). Each view's ``_tessera_flat`` says which
        unit it is of and which original parameters' elements it holds."""
        if self._views is None:
            self._make_views(lambda name: {})
        for p in self._views:
            yield (prefix + ("." if prefix else "") + p._tessera_flat.name, p)

    def zero_grad(self, set_to_none=True):
        """Releases the gradient shards (every view's ``.grad`` becomes None) and the gradients
        accumulated under :meth:`no_sync`."""
        self._fsdp.zero_grad()

    def _make_views(self, options):
        f, r = self._fsdp, self._fsdp.shard_rank
        groups = {}  # options key -> (options, [params]); insertion order = first in the model
        layouts = [f.layout(u) for u in range(f.num_units)]
        for lay in layouts:
            for name, _, _, _, trainable in lay["entries"]:
                if trainable:
                    opts = dict(options(name))
                    groups.setdefault(_options_key(opts), (opts, []))
        views = []
        for u, lay in enumerate(layouts):
            n = lay["shard_numel"]
            lo = r * n
            runs = []  # [begin, end, key, [(name, begin in the parameter, end)]] within this rank's shard
            for name, _, off, numel, trainable in lay["entries"]:
                a, b = max(off, lo) - lo, min(off + numel, lo + n) - lo
                if not trainable or a >= b:
                    continue
                key = _options_key(dict(options(name)))
                part = (name, a + lo - off, b + lo - off)
                if runs and runs[-1][2] == key and runs[-1][1] == a:
                    runs[-1][1] = b
                    runs[-1][3].append(part)
                else:
                    runs.append([a, b, key, [part]])
            master = f.master_shard(u)
            mine = []
            for i, (a, b, key, parts) in enumerate(runs):
                p = torch.nn.Parameter(master.narrow(0, a, b - a))  # aliases the master shard
                p._tessera_flat = FlatView(f"{f.unit_name(u)}.flat{i}", u, f.unit_name(u), a, parts)
                mine.append((a, p))
                groups[key][1].append(p)
                views.append(p)
            f.set_grad_views(u, mine)
        self._views = views
        return [dict(params=ps, **opts) for opts, ps in groups.values()]

    def reshard_all(self):
        """Reshards every unit: call it after a forward without backward (evaluation under
        ``torch.no_grad()``), which leaves the root unit gathered."""
        self._fsdp.reshard_all()

    def clip_grad_norm_(self, max_norm):
        """Collective: scales the gradient shards to a total L2 norm of at most ``max_norm``; returns the norm
        before clipping as a 0-dim tensor on the shards' device (as ``torch.nn.utils.clip_grad_norm_``; nothing
        is read back to the host: ``.item()`` it only where the value is needed)."""
        return self._fsdp.clip_grad_norm(max_norm)

    def full_state_dict(self):
        """Collective: every parameter by name (float32, full shape) on rank 0, ``{}`` elsewhere."""
        return self._fsdp.full_state_dict()

    def load_full_state_dict(self, state_dict):
        """Collective: rank 0's ``state_dict`` is broadcast, each rank keeps its shards."""
        self._fsdp.load_full_state_dict(state_dict)

    def stats(self):
        return self._fsdp.stats()


class FlatView:
    """What a :class:`FullyShardedDataParallel` flat-shard parameter holds: ``name``
    ("<unit>.flat<i>"), ``unit`` (index), ``unit_name``, ``offset`` (in this rank's shard) and
    ``parts``: [(original parameter name, first element, end element)] in the parameter's
    flattened order, consecutive in the view."""

    def __init__(self, name, unit, unit_name, offset, parts):
        self.name, self.unit, self.unit_name, self.offset, self.parts = name, unit, unit_name, offset, parts

    def __repr__(self):
        return f"FlatView({self.name}: {', '.join(f'{n}[{a}:{b}]' for n, a, b in self.parts)})"


def _options_key(opts):
    return tuple(sorted((k, repr(v)) for k, v in opts.items()))


class ShardedAdamW:
    """AdamW over a :class:`FullyShardedDataParallel`'s fp32 shards, fused (one kernel per run of
    a shard): each rank keeps the optimizer state of its shards only. :meth:`step` after backward
    on every rank.

    ``decays(name) -> bool``: whether the original parameter ``name`` takes weight decay
    (default: every parameter does), e.g. ``lambda n: not (n.endswith("bias") or "norm" in n)``.

    It equals ``torch.optim.AdamW`` on the unsharded parameters (with the same decay rule as
    parameter groups) when every parameter gets a gradient. It differs for a parameter that
    gets none in a step: FSDP's flat gradient holds zeros for it, and ShardedAdamW steps it
    with a zero gradient (its moments decay, the update uses them, weight decay applies), where
    ``torch.optim.AdamW`` skips a parameter whose ``.grad`` is None. The same holds for any torch
    optimizer on :meth:`FullyShardedDataParallel.parameters` (as with FSDP1's flat parameters).
    ``lr`` can be changed between steps (an LR schedule)."""

    def __init__(self, fsdp, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, decays=None):
        self._opt = _C.ShardedAdamW(fsdp._fsdp, lr, betas[0], betas[1], eps, weight_decay, decays)
        self._fsdp = fsdp

    @property
    def lr(self):
        return self._opt.lr

    @lr.setter
    def lr(self, value):
        self._opt.lr = value

    def step(self):
        self._opt.step()

    def zero_grad(self):
        self._fsdp.zero_grad()
