"""The Python extension on GPUs: NCCL communicators, DDP and tensor-parallel layers on CUDA
tensors, each against single-process training/modules on the same device (ctest python.gpu_2,
label gpu, registered where tessera was built with CUDA LibTorch; scripts/gpu-test runs it).
Float32 (TF32 off, PyTorch's default for matmuls): rtol 1e-4 / atol 1e-5; a missing average or
reduction, or a wrong shard, is off by O(1e-1).
"""
import os

import pytest
import torch
import torch.nn.functional as F

import tessera
import tessera.nn as tnn

TOL = dict(rtol=1e-4, atol=1e-5)
STEPS, BATCH, D_IN, D_HID, D_OUT = 5, 16, 8, 32, 4


@pytest.fixture(scope="module")
def ctx():
    """Overrides conftest's Gloo context: one NCCL world, one GPU per rank."""
    assert torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"]), "needs one GPU per rank"
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    os.environ["TESSERA_BACKEND"] = "nccl"  # ctest sets gloo for the other files; the variable wins over backend=
    return tessera.init(backend="nccl")


@pytest.fixture(scope="module")
def world(ctx):
    return ctx.world


def dev():
    return torch.device("cuda", torch.cuda.current_device())


def gather_all(comm, t):
    t = t.detach().contiguous()
    out = torch.empty((comm.size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
    comm.all_gather(out, t)
    return out


def test_world_is_nccl_and_all_reduce_sums(world):
    assert world.backend == "nccl"
    t = torch.full((1000,), float(world.rank + 1), device=dev())
    world.all_reduce(t)
    torch.testing.assert_close(t, torch.full_like(t, world.size * (world.size + 1) / 2), rtol=0, atol=0)


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.LayerNorm(D_HID), torch.nn.ReLU(),
                               torch.nn.Linear(D_HID, D_OUT)).to(dev())


def test_ddp_on_cuda_matches_single_process(world):
    model = mlp(seed=world.rank)  # different on every rank: DDP broadcasts rank 0's
    ddp = tessera.DistributedDataParallel(model, world)
    ref = mlp(seed=0)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    start = [p.detach().clone() for p in ref.parameters()]
    per = BATCH // world.size
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(BATCH, D_IN, generator=g).to(dev()), torch.randn(BATCH, D_OUT, generator=g).to(dev())
        ddp.zero_grad()
        F.mse_loss(ddp(x[world.rank * per:(world.rank + 1) * per]), y[world.rank * per:(world.rank + 1) * per]).backward()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=f"step {step}: grad of {n}")
        opt.step()
        ref_opt.step()
    for (n, p), q, q0 in zip(model.named_parameters(), ref.parameters(), start):
        torch.testing.assert_close(p, q, **TOL, msg=f"{n} after {STEPS} steps")
        assert not torch.equal(q, q0), f"{n} did not train"
        allp = gather_all(world, p)
        assert all(torch.equal(allp[0], allp[k]) for k in range(world.size)), f"{n} differs across ranks"


def test_tp_mlp_on_cuda_matches_unsharded(ctx):
    mesh = tessera.mesh(tp=ctx.world.size)
    tp = mesh.tp
    S, B, D, H = 6, 3, 16, 32
    torch.manual_seed(1)
    ref1, ref2 = torch.nn.Linear(D, H), torch.nn.Linear(H, D)
    torch.manual_seed(1)
    col = tnn.ColumnParallelLinear(D, H, mesh)
    row = tnn.RowParallelLinear(H, D, mesh, input_is_parallel=True)
    ref1, ref2, col, row = ref1.to(dev()), ref2.to(dev()), col.to(dev()), row.to(dev())
    row.weight.data.copy_(ref2.weight.detach().chunk(tp.size, 1)[tp.rank])  # the row layer's own draw differs
    row.bias.data.copy_(ref2.bias.detach())
    g = torch.Generator().manual_seed(7)
    x = torch.randn(S, B, D, generator=g).to(dev()).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y = row(F.gelu(col(x)))
    yr = ref2(F.gelu(ref1(xr)))
    torch.testing.assert_close(y, yr, **TOL)
    w = torch.arange(D, dtype=torch.float32, device=dev())
    (y * w).sum().backward()
    (yr * w).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, **TOL)
    torch.testing.assert_close(col.weight.grad, ref1.weight.grad.chunk(tp.size, 0)[tp.rank], **TOL)
    torch.testing.assert_close(row.weight.grad, ref2.weight.grad.chunk(tp.size, 1)[tp.rank], **TOL)
    torch.testing.assert_close(row.bias.grad, ref2.bias.grad, **TOL)
