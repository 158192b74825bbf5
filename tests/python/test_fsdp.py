"""tessera.FullyShardedDataParallel on a Python module vs single-process training.

Model: an input Linear and an output Linear (the root unit) around 3 blocks (Linear + tanh, one
unit each). Each rank trains on its slice of a global batch with ShardedAdamW; the reference
trains the whole model on the whole batch (mean loss) with torch.optim.AdamW, whose gradient is
the average of the slices'. After STEPS steps the gathered parameters (full_state_dict on
rank 0) must match: float32, rtol 1e-4 / atol 1e-5 (sums in another order; a missing average or
a lost unit is off by O(1e-2) or more after a few lr-1e-2 steps).
"""
import time

import pytest
import torch
import torch.nn.functional as F

import tessera
from conftest import gather_all

STEPS, BATCH, D, OUT = 4, 8, 8, 3
TOL = dict(rtol=1e-4, atol=1e-5)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(D, D)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh()) for _ in range(3))
        self.out = torch.nn.Linear(D, OUT)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def net(seed):
    torch.manual_seed(seed)
    return Net()


def data(step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, OUT, generator=g)


@pytest.mark.parametrize("prefetch_mb", [0, 1])
def test_fsdp_matches_single_process(world, prefetch_mb):
    model = net(seed=world.rank)  # different per rank: rank 0's values are broadcast
    fsdp = tessera.FullyShardedDataParallel(model, world, units=model.blocks, prefetch_budget_mb=prefetch_mb)
    opt = tessera.ShardedAdamW(fsdp, lr=1e-2)
    ref = net(seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    per = BATCH // world.size
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        loss = F.mse_loss(fsdp(x[world.rank * per:(world.rank + 1) * per]), y[world.rank * per:(world.rank + 1) * per])
        loss.backward()
        # A bound no norm reaches: the shards are multiplied by exactly 1 (training unchanged).
        norm = fsdp.clip_grad_norm_(1e9)
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9)
        ref_opt.step()
        # The same gradient summed in another order: float32 rounding, ~1e-7 relative.
        assert isinstance(norm, torch.Tensor) and norm.dim() == 0, type(norm)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-5, atol=0, msg=f"gradient norm at step {step}")
    sd = fsdp.full_state_dict()
    if world.rank == 0:
        assert set(sd) == set(start), sorted(sd)
        for n, q in ref.named_parameters():
            torch.testing.assert_close(sd[n], q.detach(), **TOL, msg=f"{n} after {STEPS} steps")
            assert not torch.equal(q.detach(), start[n]), f"{n} did not train"
    else:
        assert sd == {}
    # Every unit ran through FSDP: 4 units (root + 3 blocks), each gathered every step.
    assert fsdp.stats()["all_gathers"] > 0


def test_keep_gathered_accumulates_with_one_gather_per_unit(world):
    """Two micro-batches per step inside keep_gathered (the first under no_sync): each unit is
    all-gathered once a step, the training equals the reference's on the whole batch, and
    stepping inside the block is refused."""
    model = net(seed=world.rank)
    fsdp = tessera.FullyShardedDataParallel(model, world, units=model.blocks)
    opt = tessera.ShardedAdamW(fsdp, lr=1e-2)
    ref = net(seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    per, half = BATCH // world.size, BATCH // world.size // 2
    for step in range(STEPS):
        x, y = data(step)
        xs, ys = x[world.rank * per:(world.rank + 1) * per], y[world.rank * per:(world.rank + 1) * per]
        opt.zero_grad()
        with fsdp.keep_gathered():
            with fsdp.no_sync():
                (F.mse_loss(fsdp(xs[:half]), ys[:half]) / 2).backward()
            (F.mse_loss(fsdp(xs[half:]), ys[half:]) / 2).backward()
            if step == 0:
                with pytest.raises(tessera.Error, match="KeepGathered"):
                    opt.step()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert fsdp.stats()["all_gathers"] == STEPS * 4  # root + 3 blocks, once a step
    sd = fsdp.full_state_dict()
    if world.rank == 0:
        for n, q in ref.named_parameters():
            torch.testing.assert_close(sd[n], q.detach(), **TOL, msg=f"{n} after {STEPS} steps")


def test_unit_returning_a_non_tensor_is_a_clear_error(world):
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(D, D)

        def forward(self, x):
            return {"h": self.lin(x)}

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.odd = Odd()

        def forward(self, x):
            return self.odd(x)["h"]

    torch.manual_seed(0)
    model = Wrap()
    fsdp = tessera.FullyShardedDataParallel(model, world, units=[model.odd])
    with pytest.raises(tessera.Error, match=r"the forward of unit 'odd' returned a dict; it must return a tensor"):
        fsdp(torch.randn(2, D))


def test_forward_waits_for_its_all_gather_without_the_gil(world):
    """Issue 27: a unit's all-gather queued behind an op whose Gloo worker needs the GIL. After
    `del t` the async all-reduce holds the last references to t; the worker drops them after the
    op, which frees t's PyObject and so takes the GIL. run_unit used to wait for its all-gather
    with the GIL held: a deadlock until the timeout (train_llama.py's FSDP run stalled so, the
    step's first all-gather behind the previous step's loss all-reduce). Rank 1 joins the
    all-reduce 1 s late, so rank 0 is waiting in run_unit when its worker drops t."""
    comm = world.split(0, world.rank, "fsdp_gil")
    comm.timeout = 20  # a deadlock fails the test after 20 s rather than TESSERA_TIMEOUT_S
    torch.manual_seed(0)
    model = Net()
    fsdp = tessera.FullyShardedDataParallel(model, comm, units=model.blocks)
    x = torch.randn(2, D)
    for _ in range(2):
        if comm.rank == 1:
            time.sleep(1.0)
        t = torch.ones(4096)
        work = comm.all_reduce(t, async_op=True)
        del t  # the op's copies are the last references now: the worker frees the tensor
        fsdp(x).sum().backward()  # the root's all-gather queues behind the all-reduce
        work.wait()
    assert fsdp.stats()["all_gathers"] > 0


def test_fsdp_bf16_params_take_fp32_inputs(world):
    """param_dtype=torch.bfloat16: an fp32 batch is cast to bf16 at the wrapper (as torch FSDP's
    cast_forward_inputs), so forward and backward run without the caller casting (before: "mat1
    and mat2 must have the same dtype")."""
    model = net(seed=0)
    fsdp = tessera.FullyShardedDataParallel(model, world, units=model.blocks, param_dtype=torch.bfloat16)
    x, _ = data(0)
    out = fsdp(x)
    assert out.dtype == torch.bfloat16
    ref = net(seed=0).to(torch.bfloat16)
    torch.testing.assert_close(out.float(), ref(x.to(torch.bfloat16)).float(), rtol=2e-2, atol=2e-2)
    out.float().square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fsdp.parameters())
