"""tessera: a distributed training runtime in C++ (LibTorch, NCCL, Gloo), used from Python.

Run every rank under a launcher (``torchrun``, ``srun --mpi=pmix``, ``mpirun``)::

    import torch, tessera
    ctx = tessera.init()                     # reads torchrun / PMIx / SLURM, as the C++ side
    mesh = tessera.mesh(dp=2, tp=2)          # dp x pp x tp over the world, tp fastest-varying
    model = tessera.DistributedDataParallel(MyModel(), mesh.dp)
    loss_fn(model(x), y).backward()          # gradients averaged over mesh.dp on return

The C++ runtime does the bucketing, collectives and streams; this package only passes
Python tensors and modules to it. Errors raised in C++ arrive as :class:`tessera.Error`
(a ``RuntimeError``; :class:`tessera.CommError` for failed communication) with the C++
message. An error raised inside ``backward()`` (e.g. DDP's "got no gradient") passes through
autograd's engine and so arrives as torch's ``RuntimeError`` with the same message.

Modules: :mod:`tessera.parallel` (``DistributedDataParallel``; FSDP and pipeline stages go
there when the C++ parts land), :mod:`tessera.nn` (tensor-parallel layers).
"""

import torch  # noqa: F401  (loads libtorch and torch's Python types before _C)

from . import _C
from ._C import Communicator, Context, Error, CommError, ProcessMesh, ReduceOp, Work

__version__ = _C.__version__

_default_context = None


def build_info():
    """What this build contains: a dict with ``version``, ``cuda`` (CUDA/NCCL code built in),
    ``torch_cuda`` (LibTorch with CUDA), ``nccl`` (bool), ``nccl_version`` (``"2.28.3"`` or
    None), ``gloo``, ``pmix``, ``torch_version`` (the torch the module was built against) and
    ``cuda_devices`` (visible now)."""
    return _C.build_info()


def init(*, backend=None, timeout=None, rank=None, world_size=None, local_rank=None,
         local_world_size=None, store_host="127.0.0.1", store_port=None, rank0_hosts_store=True):
    """Start tessera on this process; collective over every process of the job.

    With no arguments the launcher is detected exactly as C++ ``tessera::init()`` does:
    torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``; its agent's store when
    ``TORCHELASTIC_USE_AGENT_STORE=True``), then PMIx (``PMIX_NAMESPACE``), then SLURM's
    environment. Explicit: ``rank``, ``world_size`` and ``store_port`` (rank 0 hosts the store
    at ``store_host:store_port`` unless ``rank0_hosts_store=False``).

    ``backend``: ``"gloo"`` or ``"nccl"`` (``TESSERA_BACKEND`` overrides; default NCCL when a
    GPU is visible). ``timeout``: per-op timeout in seconds (default ``TESSERA_TIMEOUT_S`` or
    600).

    Returns a :class:`tessera.Context` (``world`` communicator, ``rank``, ``world_size``,
    ``local_rank``, ``device``, ``launcher``). It also becomes the default that
    :func:`tessera.mesh` uses when no ``world`` is given. Call it once per process (a second
    call raises :class:`tessera.Error`); more groups come from ``world.split`` or a mesh.
    """
    global _default_context
    if _default_context is not None:
        # A second world over the same store keys would meet the first one's stale entries.
        raise Error(f"tessera.init: already initialized in this process (rank {_default_context.rank} of "
                    f"{_default_context.world_size}); use the context it returned, or split its world")
    ctx = _C.init(rank=rank, world_size=world_size, local_rank=local_rank,
                  local_world_size=local_world_size, store_host=store_host, store_port=store_port,
                  rank0_hosts_store=rank0_hosts_store, backend=backend, timeout=timeout)
    _default_context = ctx
    return ctx


def mesh(dp=None, pp=1, tp=1, *, world=None):
    """The dp x pp x tp :class:`tessera.ProcessMesh` over ``world`` (a :class:`Communicator`;
    default: the world of the last :func:`tessera.init`). ``dp=None`` takes what is left:
    world size / (pp * tp). Collective over ``world``. Groups: ``.dp``, ``.pp``, ``.tp``
    (communicators), ``.coord`` = (dp, pp, tp) of this rank; rank = (d * pp + p) * tp + t."""
    if world is None:
        if _default_context is None:
            raise Error("tessera.mesh: call tessera.init() first or pass world=")
        world = _default_context.world
    if dp is None:
        if world.size % (pp * tp) != 0:
            raise Error(f"tessera.mesh: world size {world.size} is not divisible by pp * tp = {pp} * {tp}")
        dp = world.size // (pp * tp)
    return ProcessMesh(world, dp, pp, tp)


from .parallel import DistributedDataParallel, FullyShardedDataParallel, Pipeline, ShardedAdamW  # noqa: E402
from . import nn  # noqa: E402
from . import data  # noqa: E402

__all__ = [
    "__version__", "build_info", "init", "mesh", "Context", "Communicator", "Work", "ReduceOp",
    "ProcessMesh", "Error", "CommError", "DistributedDataParallel", "FullyShardedDataParallel",
    "ShardedAdamW", "Pipeline", "nn", "data",
]
