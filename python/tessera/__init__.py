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

Beside torch.distributed: either may be initialized first; they share one rendezvous store
(see :func:`init`).

Modules: :mod:`tessera.train` (``train_gpt``'s trainer: a ``Config`` and a ``Trainer``, every layout),
and for your own ``torch.nn.Module``s :mod:`tessera.parallel` (``DistributedDataParallel``,
``FullyShardedDataParallel``, ``Pipeline``), :mod:`tessera.nn` (tensor-parallel layers and the
Llama's blocks), :mod:`tessera.data` (token data), :mod:`tessera.checkpoint` (sharded checkpoints,
resharded on load; full state dicts), :mod:`tessera.llama` (a Llama written with them),
:mod:`tessera.hf` (Hugging Face directories for it).
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
         local_world_size=None, store_host="127.0.0.1", store_port=None, rank0_hosts_store=True,
         store=None, init_torch_distributed=False):
    """Start tessera on this process; collective over every process of the job.

    With no arguments the launcher is detected exactly as C++ ``tessera::init()`` does:
    torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``; its agent's store when
    ``TORCHELASTIC_USE_AGENT_STORE=True``), then PMIx (``PMIX_NAMESPACE``), then SLURM's
    environment. Explicit: ``rank``, ``world_size`` and ``store_port`` (rank 0 hosts the store
    at ``store_host:store_port`` unless ``rank0_hosts_store=False``), or ``store``.

    Beside ``torch.distributed`` (one rendezvous store per job, either order):

    - torch.distributed first: when its default group is initialized, tessera uses its store
      (``_get_default_store()``, keys under ``tessera/``) with its rank and world size
      (launcher ``"torch.distributed"``). Where this build cannot take torch's store object
      (pybind11 registries not shared), tessera detects the launcher as above: rank 0's server is
      multi-tenant, as the one torch's ``env://``/``tcp://`` rendezvous starts, so the one
      server on ``MASTER_PORT`` is shared rather than bound twice (the agent's store: both are
      clients).
    - tessera first: rank 0 runs its store server multi-tenant on ``MASTER_PORT``; a later plain
      ``torch.distributed.init_process_group(...)`` (``env://``) shares that server. With
      ``init_torch_distributed=True`` tessera brings up torch.distributed's default group
      itself, over tessera's store (keys under ``<prefix>/torch.distributed``), with backend
      ``gloo`` or ``nccl`` as tessera's world, so later torch.distributed calls just work.
    - ``store``: any ``torch.distributed.Store`` (with ``rank`` and ``world_size``, else those of
      torch.distributed's default group).

    ``backend``: ``"gloo"`` or ``"nccl"`` (``TESSERA_BACKEND`` overrides; default NCCL when a
    GPU is visible). ``timeout``: per-op timeout in seconds (default ``TESSERA_TIMEOUT_S`` or
    600).

    Returns a :class:`tessera.Context` (``world`` communicator, ``rank``, ``world_size``,
    ``local_rank``, ``device``, ``launcher``, ``store_description``). It also becomes the
    default that :func:`tessera.mesh` uses when no ``world`` is given. Call it once per process
    (a second call raises :class:`tessera.Error`); more groups come from ``world.split`` or a
    mesh. Failures to reach the store or form the world name the launcher and the store tried.
    An uncaught exception that ends this rank is published to the job's error board first, so the
    other ranks' failed collectives name it as the cause (docs/design.md, Failures).
    """
    global _default_context
    if _default_context is not None:
        # A second world over the same store keys would meet the first one's stale entries.
        raise Error(f"tessera.init: already initialized in this process (rank {_default_context.rank} of "
                    f"{_default_context.world_size}); use the context it returned, or split its world")
    kw = dict(local_rank=local_rank, local_world_size=local_world_size, backend=backend, timeout=timeout)
    torch_first = store is None and rank is None and world_size is None and _torch_dist_initialized()
    if torch_first and not _C.can_use_torch_store(torch.distributed.distributed_c10d._get_default_store()):
        torch_first = False  # fall back to the launcher's environment (multi-tenant server, see above)
    if store is not None or torch_first:
        if store is None:
            store = torch.distributed.distributed_c10d._get_default_store()
            name = f"torch.distributed's default store (backend {torch.distributed.get_backend()})"
        else:
            name = f"the given {type(store).__name__}"
        if rank is None or world_size is None:
            if not _torch_dist_initialized():
                raise Error("tessera.init: store= needs rank= and world_size= (torch.distributed is not initialized)")
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if kw["local_rank"] is None:
            kw["local_rank"], kw["local_world_size"] = _local_rank_from_env(world_size)
        ctx = _C.init(rank=rank, world_size=world_size, store=store, store_name=name,
                      launcher="torch.distributed" if torch_first else "explicit", **kw)
    else:
        ctx = _C.init(rank=rank, world_size=world_size, store_host=store_host, store_port=store_port,
                      rank0_hosts_store=rank0_hosts_store, **kw)
    _default_context = ctx
    _publish_uncaught_exceptions()
    if init_torch_distributed and not _torch_dist_initialized():
        _init_torch_distributed(ctx)
    return ctx


def _publish_uncaught_exceptions():
    """An exception that ends this rank goes to the job's error board before Python prints it and
    exits, so the other ranks' failed collectives name it (and this rank) as the cause. Installed
    once, in front of the excepthook in place."""
    import sys
    previous = sys.excepthook
    if getattr(previous, "_tessera", False):
        return

    def hook(kind, value, tb):
        try:
            _C._publish_fatal(f"{kind.__name__}: {value}", issubclass(kind, CommError))
        except Exception:  # noqa: BLE001  (never in the way of the traceback)
            pass
        previous(kind, value, tb)

    hook._tessera = True
    sys.excepthook = hook


def _torch_dist_initialized():
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _local_rank_from_env(world_size):
    """(local rank, local world size) from the launcher's variables (torchrun, SLURM, Open MPI),
    else (None, None): tessera then takes the rank and world size."""
    import os
    for r, n in (("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                 ("SLURM_LOCALID", None)):
        if r in os.environ:
            size = int(os.environ[n]) if n and n in os.environ else None
            return int(os.environ[r]), size
    return None, None


def _init_torch_distributed(ctx):
    """torch.distributed's default group over tessera's store: a TCPStore on tessera's address
    (on the rank hosting it, the multi-tenant server already running in this process), keys under
    ``<tessera prefix>/torch.distributed``. Collective over the world."""
    import datetime
    dist = torch.distributed
    backend = "gloo" if ctx.world.backend == "gloo" else "nccl"
    timeout = datetime.timedelta(seconds=ctx.world.timeout)
    what = f"tessera.init(init_torch_distributed=True) ({ctx.launcher} launch, {ctx.store_description})"
    try:
        if ctx.given_store:
            raise Error("the store was given to tessera; initialize torch.distributed on it yourself")
        base = dist.TCPStore(ctx.store_host, ctx.store_port, None, ctx.hosts_store, timeout,
                             wait_for_workers=False, multi_tenant=True)
        store = dist.PrefixStore(f"{ctx.store_prefix}/torch.distributed", base)
        dist.init_process_group(backend, store=store, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
    except Exception as e:
        raise Error(f"{what}: could not initialize torch.distributed ({backend}): {e}") from e


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
from . import checkpoint  # noqa: E402
from . import llama  # noqa: E402
from . import hf  # noqa: E402
from . import train  # noqa: E402

__all__ = [
    "__version__", "build_info", "init", "mesh", "Context", "Communicator", "Work", "ReduceOp",
    "ProcessMesh", "Error", "CommError", "DistributedDataParallel", "FullyShardedDataParallel",
    "ShardedAdamW", "Pipeline", "nn", "data", "checkpoint", "llama", "hf", "train",
]
