"""Wrappers of Python ``torch.nn.Module``s run by tessera's C++ runtime.

``DistributedDataParallel`` (src/parallel/ddp) and ``Pipeline`` (src/pipeline's schedule
executor over this rank's stages) are here. Still to come: ``FullyShardedDataParallel(module,
units=..., ...)`` over src/sharding/fsdp: add it to this file (or a sibling module) and export
it from ``tessera/__init__.py``, binding the C++ in python/src/<area>.cpp.
"""

import torch

from . import _C


def _group(group):
    """A Communicator, or a ProcessMesh (its dp group)."""
    if isinstance(group, _C.ProcessMesh):
        return group.dp
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
        comm = _group(group)
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


def _pp_group(group):
    """A Communicator, or a ProcessMesh (its pp group)."""
    if isinstance(group, _C.ProcessMesh):
        return group.pp
    if isinstance(group, _C.Communicator):
        return group
    raise TypeError(f"expected a tessera.Communicator or tessera.ProcessMesh, got {type(group).__name__}")


class Pipeline:
    """Pipeline parallelism for Python stages: this rank's stages (``torch.nn.Module``s or any
    callables taking and returning one tensor) run by tessera's C++ schedule executor over
    ``group`` (a :class:`tessera.Communicator`, or a :class:`tessera.ProcessMesh`, whose pp
    group is used). See src/pipeline/executor.h for the full contract.

    ``stages``: this rank's chunks in order; with ``schedule="interleaved_1f1b"`` rank r holds
    stages r, r + pp, r + 2 pp, ... (one per chunk), else exactly one stage. Stage 0 takes the
    micro-batch, the last stage's output goes to ``loss_fn(output, target)``.
    ``schedule``: ``"1f1b"`` (default), ``"gpipe"`` or ``"interleaved_1f1b"``.
    ``micro_batches``: the batch (dim 0) is split into this many equal micro-batches.

    :meth:`step` is collective over the group: pass ``input`` on pp rank 0 and ``target`` on
    the last pp rank (``None`` elsewhere). It runs forward and backward of every micro-batch;
    the gradients of the mean loss accumulate into the stages' parameters (zero them yourself,
    e.g. ``optimizer.zero_grad()``), and the mean loss comes back on every rank. The GIL is
    released while the schedule runs and taken again for each call of a stage or of
    ``loss_fn``. Bad steps (a batch not divisible into micro-batches, stages whose shapes do
    not fit) raise :class:`tessera.Error` on every rank with the communicator left usable.
    ``device``: where activations and the loss live (default: the group's, CPU for Gloo, the
    current CUDA device for NCCL).
    """

    def __init__(self, stages, group, *, micro_batches, loss_fn, schedule="1f1b", device=None,
                 free_sent_outputs=True):
        self.group = _pp_group(group)
        self.stages = list(stages)
        if device is None:
            device = "cpu" if self.group.backend == "gloo" else f"cuda:{torch.cuda.current_device()}"
        self.device = torch.device(device)
        self._exec = _C.PipelineExecutor(self.group, schedule, micro_batches, self.stages, loss_fn, str(self.device),
                                         free_sent_outputs)

    def step(self, input=None, target=None):
        return self._exec.step(input, target)

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
