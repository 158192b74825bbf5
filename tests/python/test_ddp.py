"""tessera.DistributedDataParallel on Python modules vs single-process training.

Each rank trains on its own slice of a global batch; the reference trains one copy of the
model on the whole batch (mean loss), which has the same gradient as the average of the
ranks' slice gradients. Tolerance: float32, rtol 1e-4 / atol 1e-5 after 5 SGD steps (the
sums run in another order; a missing or wrong average is off by ~1e-1).
"""
import copy
import re

import pytest
import torch

import tessera
from conftest import gather_all

STEPS, BATCH, D_IN, D_HID, D_OUT = 5, 16, 8, 32, 4
TOL = dict(rtol=1e-4, atol=1e-5)


class Mlp(torch.nn.Module):
    def __init__(self, with_unused=False, skip_on_rank=None):
        super().__init__()
        self.fc1 = torch.nn.Linear(D_IN, D_HID)
        self.norm = torch.nn.LayerNorm(D_HID)
        self.fc2 = torch.nn.Linear(D_HID, D_OUT)
        self.register_buffer("scale", torch.tensor(2.0))
        self.extra = torch.nn.Linear(D_HID, D_HID) if (with_unused or skip_on_rank is not None) else None
        self.with_unused, self.skip_on_rank, self.rank = with_unused, skip_on_rank, None

    def forward(self, x):
        h = torch.relu(self.norm(self.fc1(x)))
        if self.extra is not None and not self.with_unused and self.rank != self.skip_on_rank:
            h = h + self.extra(h)
        return self.fc2(h) * self.scale


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, D_IN, generator=g), torch.randn(BATCH, D_OUT, generator=g)


def my_slice(t, comm):
    per = BATCH // comm.size
    return t[comm.rank * per:(comm.rank + 1) * per]


def make_model(world, **kw):
    # Ranks start from different weights: DDP's construction must broadcast rank 0's.
    torch.manual_seed(world.rank)
    return Mlp(**kw)


def reference(**kw):
    torch.manual_seed(0)  # rank 0's initial weights
    return Mlp(**kw)


# Small buckets (150 / 100 bytes): 3 buckets for this model, so several all-reduces interleave.
@pytest.mark.parametrize("opts", [dict(), dict(bucket_cap_mb=150 / 2**20, first_bucket_cap_mb=100 / 2**20,
                                                 gradient_as_bucket_view=True)],
                         ids=["default", "small_buckets_views"])
def test_ddp_matches_single_process(world, opts):
    model = make_model(world)
    ddp = tessera.DistributedDataParallel(model, world, **opts)
    ref = reference()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=f"{n} not broadcast from rank 0")
    if opts:
        assert len(ddp.bucket_layout()) > 2
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    start = copy.deepcopy(ref.state_dict())
    for step in range(STEPS):
        x, y = data(step)
        ddp.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world))
        loss.backward()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=f"step {step}: grad of {n}")
        opt.step()
        ref_opt.step()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, **TOL, msg=f"{n} after {STEPS} steps")
        assert not torch.equal(q, start[n]), f"{n} did not train"
    # Every rank holds the same parameters.
    for n, p in model.named_parameters():
        allp = gather_all(world, p)
        assert all(torch.equal(allp[0], allp[k]) for k in range(world.size)), n


def test_python_hooks_and_cpp_hooks_together(world):
    # A Python tensor hook on a parameter sees the local gradient; tessera's C++ accumulator
    # hook then averages it. Local gradients differ across ranks, so averaging is observable.
    model = make_model(world)
    ddp = tessera.DistributedDataParallel(model, world)
    seen = []
    model.fc1.weight.register_hook(lambda g: seen.append(g.clone()))
    x, y = data(0)
    torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    assert len(seen) == 1
    local = gather_all(world, seen[0])
    assert not torch.allclose(local[0], local[1]), "ranks had equal local gradients: test is vacuous"
    torch.testing.assert_close(model.fc1.weight.grad, local.mean(0), **TOL)


def test_unused_parameter_is_named(world):
    model = make_model(world, with_unused=True)
    ddp = tessera.DistributedDataParallel(model, world)
    x, y = data(0)
    with pytest.raises(RuntimeError) as e:
        torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    # Raised in C++ at the end of backward; autograd's engine passes the message on unchanged.
    assert re.fullmatch(rf"DistributedDataParallel: on rank {world.rank}, 2 parameter\(s\) got no gradient in "
                        r"this backward: extra\.weight, extra\.bias\. Set findUnusedParameters if parts of the "
                        r"model are skipped on purpose, or set requires_grad=false on parameters that are never "
                        r"trained", str(e.value)), str(e.value)
    world.barrier()


def test_find_unused_parameters(world):
    # `extra` is used on every rank but rank 1: its gradient is the average with rank 1's zeros.
    model = make_model(world, skip_on_rank=1)
    model.rank = world.rank
    ddp = tessera.DistributedDataParallel(model, world, find_unused_parameters=True)
    ref = reference(skip_on_rank=1)
    ref.rank = 0
    x, y = data(0)
    torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    # Reference: per-rank gradients, averaged by hand (rank 1 without `extra`).
    grads = []
    for r in range(world.size):
        ref.zero_grad(set_to_none=True)
        ref.rank = r
        per = BATCH // world.size
        torch.nn.functional.mse_loss(ref(x[r * per:(r + 1) * per]), y[r * per:(r + 1) * per]).backward()
        grads.append({n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                      for n, p in ref.named_parameters()})
    for n, p in model.named_parameters():
        expect = sum(g[n] for g in grads) / world.size
        torch.testing.assert_close(p.grad, expect, **TOL, msg=n)
    assert grads[1]["extra.weight"].abs().sum() == 0 and grads[0]["extra.weight"].abs().sum() > 0


def test_no_sync_accumulates_locally(world):
    model = make_model(world)
    ddp = tessera.DistributedDataParallel(model, world)
    ref = reference()
    batches = [data(s) for s in range(3)]
    with ddp.no_sync():
        for x, y in batches[:2]:
            torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    # Inside no_sync nothing was averaged: ranks hold different (local) gradients.
    local = gather_all(world, model.fc2.weight.grad)
    assert not torch.allclose(local[0], local[1]), "no_sync gradients were synchronised"
    x, y = batches[2]
    torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    for x, y in batches:
        torch.nn.functional.mse_loss(ref(x), y).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=n)


def test_mismatched_models_are_a_tessera_error(world):
    # Construction is collective: every rank raises, naming the parameter and what each rank has.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4 + world.rank), torch.nn.Linear(4 + world.rank, 2))
    with pytest.raises(tessera.Error) as e:
        tessera.DistributedDataParallel(model, world)
    msg = str(e.value)
    assert msg.startswith("DistributedDataParallel: the ranks' parameters differ"), msg
    assert "rank 0 has '0.weight' [4, 4] float32; rank 1 has '0.weight' [5, 4] float32" in msg, msg


def test_bf16_communication(world):
    # comm_dtype=torch.bfloat16: gradients are averaged in bf16 and cast back to float32, so
    # they match the float32 average to bf16's precision (rtol 1e-2) but not exactly.
    model = make_model(world)
    ddp = tessera.DistributedDataParallel(model, world, comm_dtype=torch.bfloat16)
    ref = reference()
    x, y = data(0)
    torch.nn.functional.mse_loss(ddp(my_slice(x, world)), my_slice(y, world)).backward()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    exact = True
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-2, atol=1e-3, msg=n)
        exact = exact and torch.equal(p.grad, q.grad)
        assert torch.equal(p.grad, p.grad.bfloat16().float()), f"{n}: gradient is not bf16-rounded"
    assert not exact
