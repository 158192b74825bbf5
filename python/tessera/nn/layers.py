"""Tensor-parallel layers (Megatron-LM style) as ``torch.nn.Module``s.

Each module holds its weight shards as ordinary ``torch.nn.Parameter``s (so optimizers,
``state_dict`` and DDP over the dp group work as usual) and calls tessera's C++ functional
ops, whose autograd nodes (and their communication) are C++ (src/parallel/tensor/).
Forward and backward are collective over ``group``: every rank of it runs the same forward
and backward. ``group`` is a :class:`tessera.Communicator` or a :class:`tessera.ProcessMesh`
(its tp group). A group of one communicates nothing.

Checkpoints (:mod:`tessera.checkpoint`) save each shard as its box of the unsharded weight, so
they load into any tensor-parallel size and into plain ``torch.nn.Linear``/``Embedding`` models.

Initial weights equal those of the unsharded ``torch.nn.Linear`` / ``torch.nn.Embedding``
built from the same RNG state (the full weight is drawn on every rank and the shard kept):
seed every rank alike before construction. ``load_full()`` takes an unsharded weight.

The f/g mappings are exposed too: :func:`copy_to_region` (fwd identity / bwd all-reduce),
:func:`reduce_from_region` (fwd all-reduce / bwd identity), :func:`gather_last_dim`,
:func:`split_last_dim`, :func:`gather_seq`, :func:`reduce_scatter_seq`.
"""

import torch

from .. import _C
from ..checkpoint import shard_of
from ..parallel import _group_of

_tp = _C.tp

copy_to_region = _tp.copy_to_region
reduce_from_region = _tp.reduce_from_region
gather_last_dim = _tp.gather_last_dim
split_last_dim = _tp.split_last_dim
gather_seq = _tp.gather_seq
reduce_scatter_seq = _tp.reduce_scatter_seq


def _tp_group(group):
    return _group_of(group, "tp")


def _check_divisible(layer, what, n, size):
    if n % size != 0:
        raise _C.Error(f"tp layer '{layer}': {what} = {n} is not divisible by the tensor-parallel size {size}")


class ColumnParallelLinear(torch.nn.Module):
    """``y = x W^T + b`` with W split by output features: rank r holds rows
    ``[r*out/tp, (r+1)*out/tp)`` of the ``[out, in]`` weight (and of the bias).

    Input ``[..., in]`` replicated over the group (``[tokens/tp, ..., in]`` with
    ``sequence_parallel``); output ``[..., out/tp]``, or ``[..., out]`` with ``gather_output``.
    fwd: f (identity; all-gather dim 0 when sequence parallel) / bwd: all-reduce (reduce-scatter).
    """

    def __init__(self, in_features, out_features, group, *, bias=True, gather_output=False,
                 sequence_parallel=False, name="linear", device=None, dtype=None):
        super().__init__()
        self.group = _tp_group(group)
        _check_divisible(name, "output features", out_features, self.group.size)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.sequence_parallel, self.name = gather_output, sequence_parallel, name
        shard = out_features // self.group.size
        kw = dict(device=device, dtype=dtype)
        self.weight = torch.nn.Parameter(torch.empty(shard, in_features, **kw))
        self.bias = torch.nn.Parameter(torch.empty(shard, **kw)) if bias else None
        r = self.group.rank
        shard_of(self.weight, (out_features, in_features), (r * shard, 0))  # checkpoints: rows of the full weight
        if bias:
            shard_of(self.bias, (out_features,), (r * shard,))
        full = torch.nn.Linear(in_features, out_features, bias=bias)  # the unsharded init
        self.load_full(full.weight, full.bias)

    @torch.no_grad()
    def load_full(self, weight, bias=None):
        """Keep this rank's rows of the unsharded ``weight [out, in]`` and ``bias [out]``."""
        r, n = self.group.rank, self.group.size
        self.weight.copy_(weight.chunk(n, 0)[r])
        if self.bias is not None:
            self.bias.copy_(bias.chunk(n, 0)[r])

    def forward(self, x):
        return _tp.column_parallel_linear(x, self.weight, self.bias, self.group,
                                          gather_output=self.gather_output,
                                          sequence_parallel=self.sequence_parallel, name=self.name)

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features} (/{self.group.size}), "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(torch.nn.Module):
    """``y = x W^T + b`` with W split by input features: rank r holds columns
    ``[r*in/tp, (r+1)*in/tp)`` of the ``[out, in]`` weight; the bias is replicated.

    Input: this rank's ``[..., in/tp]`` (``input_is_parallel``, e.g. a ColumnParallelLinear's
    output) or the full ``[..., in]`` (split here). Output ``[..., out]`` summed over the group
    (``[tokens/tp, ..., out]`` reduce-scattered with ``sequence_parallel``).
    fwd: g (all-reduce; reduce-scatter dim 0) / bwd: identity (all-gather dim 0).
    """

    def __init__(self, in_features, out_features, group, *, bias=True, input_is_parallel=True,
                 sequence_parallel=False, name="linear", device=None, dtype=None):
        super().__init__()
        self.group = _tp_group(group)
        _check_divisible(name, "input features", in_features, self.group.size)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.sequence_parallel, self.name = input_is_parallel, sequence_parallel, name
        kw = dict(device=device, dtype=dtype)
        cols = in_features // self.group.size
        self.weight = torch.nn.Parameter(torch.empty(out_features, cols, **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **kw)) if bias else None  # replicated
        shard_of(self.weight, (out_features, in_features), (0, self.group.rank * cols))
        full = torch.nn.Linear(in_features, out_features, bias=bias)
        self.load_full(full.weight, full.bias)

    @torch.no_grad()
    def load_full(self, weight, bias=None):
        """Keep this rank's columns of the unsharded ``weight [out, in]``; the full ``bias``."""
        r, n = self.group.rank, self.group.size
        self.weight.copy_(weight.chunk(n, 1)[r])
        if self.bias is not None:
            self.bias.copy_(bias)

    def forward(self, x):
        return _tp.row_parallel_linear(x, self.weight, self.bias, self.group,
                                       input_is_parallel=self.input_is_parallel,
                                       sequence_parallel=self.sequence_parallel, name=self.name)

    def extra_repr(self):
        return (f"in={self.in_features} (/{self.group.size}), out={self.out_features}, "
                f"input_is_parallel={self.input_is_parallel}, sequence_parallel={self.sequence_parallel}")


class VocabParallelEmbedding(torch.nn.Module):
    """An embedding table of ``num_embeddings`` rows split by rows over the group: rank r owns
    rows ``[r*V/tp, (r+1)*V/tp)``. ``forward(ids)`` (int64/int32, any shape, values in
    ``[0, V)``) returns ``[*ids.shape, dim]``, equal to the unsharded lookup on every rank.
    fwd: local lookup (zeros for rows owned elsewhere), then g (all-reduce) / bwd: local."""

    def __init__(self, num_embeddings, embedding_dim, group, *, device=None, dtype=None):
        super().__init__()
        self.group = _tp_group(group)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start, self.vocab_end = _tp.vocab_range(num_embeddings, self.group.rank, self.group.size)
        self.weight = torch.nn.Parameter(
            torch.empty(self.vocab_end - self.vocab_start, embedding_dim, device=device, dtype=dtype))
        shard_of(self.weight, (num_embeddings, embedding_dim), (self.vocab_start, 0))
        full = torch.nn.Embedding(num_embeddings, embedding_dim)  # N(0, 1) from the global RNG
        self.load_full(full.weight)

    @torch.no_grad()
    def load_full(self, weight):
        """Keep this rank's rows of the unsharded ``weight [V, dim]``."""
        self.weight.copy_(weight[self.vocab_start:self.vocab_end])

    def forward(self, ids):
        return _tp.vocab_parallel_embedding(ids, self.weight, self.group, self.num_embeddings)

    def extra_repr(self):
        return (f"{self.num_embeddings} (rows {self.vocab_start}..{self.vocab_end}), {self.embedding_dim}")


def vocab_parallel_cross_entropy(logits_shard, targets, group, vocab=0):
    """Mean cross-entropy of ``[N, V/tp]`` logit shards (this rank's vocab columns) against
    global ``targets [N]`` (int64): equals ``torch.nn.functional.cross_entropy(full_logits,
    targets)`` on every rank without gathering the logits. fwd: two all-reduces over the
    group / bwd: local. ``vocab`` > 0 checks that shard width x group size equals it."""
    return _tp.vocab_parallel_cross_entropy(logits_shard, targets, _tp_group(group), vocab)
