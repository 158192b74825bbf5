"""tessera.nn's tensor-parallel layers vs the unsharded torch.nn modules.

The tp group is pairs of ranks (tessera.mesh(tp=2)): with 4 ranks there are two independent
tp groups. Float32, rtol 1e-5 / atol 1e-6 (only the summation order differs; a missing
reduction or a wrong shard is off by O(1)).
"""
import pytest
import torch
import torch.nn.functional as F

import tessera
import tessera.nn as tnn

TOL = dict(rtol=1e-5, atol=1e-6)
S, B, D, H, V = 4, 3, 8, 16, 12


@pytest.fixture(scope="module")
def mesh(ctx):
    return tessera.mesh(tp=2)


def shard(t, mesh, dim):
    return t.chunk(mesh.tp.size, dim)[mesh.tp.rank]


def inputs(*shape, seed=0):
    # The same on every rank of a tp group (tp inputs are replicated); different per dp rank.
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).requires_grad_()


def test_column_gather_output_matches_linear(mesh):
    torch.manual_seed(1)
    ref = torch.nn.Linear(D, H)
    torch.manual_seed(1)
    col = tnn.ColumnParallelLinear(D, H, mesh, gather_output=True)
    assert col.weight.shape == (H // 2, D)
    x, xr = inputs(S, B, D), inputs(S, B, D)
    y = col(x)
    assert "CppNode<tessera::tp::" in y.grad_fn.name(), y.grad_fn.name()  # autograd goes through C++
    yr = ref(xr)
    torch.testing.assert_close(y, yr, **TOL)
    (y * torch.arange(H)).sum().backward()
    (yr * torch.arange(H)).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, **TOL)
    torch.testing.assert_close(col.weight.grad, shard(ref.weight.grad, mesh, 0), **TOL)
    torch.testing.assert_close(col.bias.grad, shard(ref.bias.grad, mesh, 0), **TOL)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["plain", "sequence_parallel"])
def test_column_row_mlp_matches_two_linears(mesh, sequence_parallel):
    torch.manual_seed(2)
    fc1, fc2 = torch.nn.Linear(D, H), torch.nn.Linear(H, D)
    torch.manual_seed(2)
    c = tnn.ColumnParallelLinear(D, H, mesh, sequence_parallel=sequence_parallel)
    r = tnn.RowParallelLinear(H, D, mesh, sequence_parallel=sequence_parallel)
    x, xr = inputs(S, B, D, seed=3), inputs(S, B, D, seed=3)
    xin = shard(x.detach(), mesh, 0).requires_grad_() if sequence_parallel else x
    y = r(F.gelu(c(xin)))
    yr = fc2(F.gelu(fc1(xr)))
    torch.testing.assert_close(y, shard(yr, mesh, 0) if sequence_parallel else yr, **TOL)
    w = torch.linspace(-1, 1, S * B * D).view(S, B, D)
    (y * (shard(w, mesh, 0) if sequence_parallel else w)).sum().backward()
    (yr * w).sum().backward()
    torch.testing.assert_close(xin.grad, shard(xr.grad, mesh, 0) if sequence_parallel else xr.grad, **TOL)
    torch.testing.assert_close(c.weight.grad, shard(fc1.weight.grad, mesh, 0), **TOL)
    torch.testing.assert_close(c.bias.grad, shard(fc1.bias.grad, mesh, 0), **TOL)
    torch.testing.assert_close(r.weight.grad, shard(fc2.weight.grad, mesh, 1), **TOL)
    torch.testing.assert_close(r.bias.grad, fc2.bias.grad, **TOL)


def test_row_splits_a_full_input(mesh):
    torch.manual_seed(4)
    ref = torch.nn.Linear(H, D, bias=False)
    torch.manual_seed(4)
    row = tnn.RowParallelLinear(H, D, mesh, bias=False, input_is_parallel=False)
    assert row.bias is None
    x, xr = inputs(5, H, seed=5), inputs(5, H, seed=5)
    y, yr = row(x), ref(xr)
    torch.testing.assert_close(y, yr, **TOL)
    y.square().sum().backward()
    yr.square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, **TOL)
    torch.testing.assert_close(row.weight.grad, shard(ref.weight.grad, mesh, 1), **TOL)


def test_vocab_parallel_embedding_matches_embedding(mesh):
    torch.manual_seed(6)
    ref = torch.nn.Embedding(V, D)
    torch.manual_seed(6)
    emb = tnn.VocabParallelEmbedding(V, D, mesh)
    assert emb.weight.shape == (V // 2, D)
    ids = torch.tensor([[0, 11, 5], [6, 6, 3]])
    y, yr = emb(ids), ref(ids)
    torch.testing.assert_close(y, yr, **TOL)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7))
    (y * w).sum().backward()
    (yr * w).sum().backward()
    torch.testing.assert_close(emb.weight.grad, shard(ref.weight.grad, mesh, 0), **TOL)


def test_vocab_parallel_cross_entropy_matches_cross_entropy(mesh):
    logits = inputs(6, V, seed=8)
    targets = torch.tensor([0, 11, 5, 6, 7, 2])
    mine = shard(logits.detach(), mesh, 1).requires_grad_()
    loss = tnn.vocab_parallel_cross_entropy(mine, targets, mesh, vocab=V)
    assert "CppNode<tessera::tp::" in loss.grad_fn.name(), loss.grad_fn.name()
    ref = F.cross_entropy(logits, targets)
    torch.testing.assert_close(loss, ref, **TOL)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(mine.grad, shard(logits.grad, mesh, 1), **TOL)


def test_tp_errors_reach_python(mesh):
    with pytest.raises(tessera.Error, match=r"tp layer 'odd': output features = 7 is not divisible by the "
                                            r"tensor-parallel size 2"):
        tnn.ColumnParallelLinear(D, 7, mesh, name="odd")
    col = tnn.ColumnParallelLinear(D, H, mesh, name="c")
    with pytest.raises(tessera.Error, match=r"tp layer 'c' \(column-parallel\): input has 5 features, expects 8"):
        col(torch.ones(2, 5))
    with pytest.raises(tessera.Error, match=r"vocab size 13 is not divisible by the tensor-parallel size 2"):
        tnn.VocabParallelEmbedding(13, D, mesh)
