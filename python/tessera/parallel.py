"""Data-parallel wrappers of Python ``torch.nn.Module``s, run by tessera's C++ runtime.

``DistributedDataParallel`` is here. Still to come (their C++ parts are being written):
``FullyShardedDataParallel(module, units=..., ...)`` (src/sharding/fsdp) and pipeline stages
from a Python module list (src/pipeline): add them to this file (or a sibling module) and
export them from ``tessera/__init__.py``, binding the C++ in python/src/<area>.cpp.
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
