"""FSDP with torch optimizers: the flat fp32 master shards as torch.nn.Parameters (FSDP1's
use_orig_params=False), against single-process training of the same model on the same global
batches. The model has a tied weight (head = embedding table) and a parameter no forward uses.
Parameter groups by original name: no weight decay on biases and norms."""
import math

import pytest
import torch
import torch.nn.functional as F

import tessera
from conftest import assert_close_on_rank0, gather_all

V, D, T, STEPS, PER_RANK = 16, 8, 6, 5, 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, 2 * D)
        self.fc2 = torch.nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(D)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.unused = torch.nn.Parameter(torch.randn(5))

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def no_decay(name):
    return name.endswith("bias") or "norm" in name


def options(name):
    return {"weight_decay": 0.0} if no_decay(name) else {}


def make():
    torch.manual_seed(0)
    return Net()


def batches(world):
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, V, (world * PER_RANK, T + 1), generator=g) for _ in range(STEPS)]


def loss_of(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))


def reference(make_opt, world):
    """Single process: the whole global batch each step."""
    model = make()
    opt, sched = make_opt(model)
    for b in batches(world):
        opt.zero_grad(set_to_none=True)
        loss_of(model, b).backward()
        opt.step()
        if sched:
            sched.step()
    return model


def torch_groups(model):
    named = dict(model.named_parameters())
    return [dict(params=[p for n, p in named.items() if not no_decay(n)]),
            dict(params=[p for n, p in named.items() if no_decay(n)], weight_decay=0.0)]


def train_fsdp(world, make_opt, set_to_none):
    model = make()
    fsdp = tessera.FullyShardedDataParallel(model, world, units=list(model.blocks))
    opt, sched = make_opt(fsdp)
    lo = world.rank * PER_RANK
    for b in batches(world.size):
        opt.zero_grad(set_to_none=set_to_none)
        loss_of(fsdp, b[lo:lo + PER_RANK]).backward()
        opt.step()
        if sched:
            sched.step()
    return fsdp


def check_used(world, fsdp, ref, atol=1e-6):
    """Every used parameter within atol of the reference (rank 0 checks, every rank learns the verdict)."""
    full = fsdp.full_state_dict()
    assert_close_on_rank0(world, full, dict(ref.named_parameters()), atol, skip=("unused",))
    return full


def test_views_and_grads(world):
    """The views cover this rank's trainable elements once, alias the master shard, and after
    backward their .grad is this rank's shard of the averaged gradient of every original parameter."""
    model = make()
    fsdp = tessera.FullyShardedDataParallel(model, world, units=list(model.blocks))
    groups = fsdp.param_groups(options)
    assert [sorted(g) for g in groups] == [["params"], ["params", "weight_decay"]]
    params = list(fsdp.parameters())
    assert all(isinstance(p, torch.nn.Parameter) and p.is_leaf and p.dtype == torch.float32 for p in params)
    assert sorted(id(p) for g in groups for p in g["params"]) == sorted(id(p) for p in params)
    for g in groups:
        for p in g["params"]:
            assert all(no_decay(n) == ("weight_decay" in g) for n, _, _ in p._tessera_flat.parts), p._tessera_flat
    b = batches(world.size)[0]
    lo = world.rank * PER_RANK
    loss_of(fsdp, b[lo:lo + PER_RANK]).backward()
    ref = make()
    loss_of(ref, b).backward()
    rg = {n: p.grad.reshape(-1) for n, p in ref.named_parameters() if p.grad is not None}
    covered = {}
    for p in params:
        assert p.grad is not None and p.grad.shape == p.shape
        at = 0
        for n, a, e in p._tessera_flat.parts:
            want = rg[n][a:e] if n in rg else torch.zeros(e - a)  # "unused": zeros
            torch.testing.assert_close(p.grad[at:at + e - a], want, rtol=0, atol=1e-6, msg=f"grad of {n}[{a}:{e}]")
            covered[n] = covered.get(n, 0) + e - a
            at += e - a
        assert at == p.numel()
    # Over the ranks every element of every parameter is in exactly one view.
    counts = torch.tensor([float(covered.get(n, 0)) for n, _ in ref.named_parameters()])
    world.all_reduce(counts)
    assert counts.tolist() == [float(p.numel()) for _, p in ref.named_parameters()]
    fsdp.zero_grad()
    assert all(p.grad is None for p in params)


def test_sgd_momentum_groups(world):
    """torch.optim.SGD (momentum, weight decay by group, a StepLR) equals single-process SGD on every
    parameter, the unused one (no decay: a zero gradient leaves it unchanged) included."""
    def make_opt(m):
        groups = m.param_groups(lambda n: {"weight_decay": 0.0} if no_decay(n) or n == "unused" else {}) \
            if isinstance(m, tessera.FullyShardedDataParallel) else \
            [dict(params=[p for n, p in m.named_parameters() if not (no_decay(n) or n == "unused")]),
             dict(params=[p for n, p in m.named_parameters() if no_decay(n) or n == "unused"], weight_decay=0.0)]
        opt = torch.optim.SGD(groups, lr=0.2, momentum=0.9, weight_decay=0.01)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    fsdp = train_fsdp(world, make_opt, set_to_none=False)
    ref = reference(make_opt, world.size)
    full = check_used(world, fsdp, ref)
    if world.rank == 0:
        assert torch.equal(full["unused"], ref.unused.detach())
        assert torch.equal(full["unused"], make().unused.detach())


def test_adamw_cosine(world):
    """torch.optim.AdamW with parameter groups and a cosine LR schedule equals single-process AdamW
    on every used parameter within 1e-6. The unused parameter (decayed group) gets a zero gradient
    instead of none: its moments stay zero, so it only decays, by prod(1 - lr_t * wd)."""
    wd = 0.1

    def make_opt(m):
        groups = m.param_groups(options) if isinstance(m, tessera.FullyShardedDataParallel) else torch_groups(m)
        opt = torch.optim.AdamW(groups, lr=0.01, weight_decay=wd)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=1e-3)

    fsdp = train_fsdp(world, make_opt, set_to_none=True)
    ref = reference(make_opt, world.size)
    full = check_used(world, fsdp, ref)
    if world.rank == 0:
        start = make().unused.detach()
        assert torch.equal(ref.unused.detach(), start)  # torch: skipped (no gradient)
        factor = 1.0
        for s in range(STEPS):
            lr = 1e-3 + (0.01 - 1e-3) * (1 + math.cos(math.pi * s / STEPS)) / 2
            factor *= 1 - lr * wd
        torch.testing.assert_close(full["unused"], start * factor, rtol=1e-6, atol=0)


def test_sharded_adamw_docstring(world):
    """tessera.ShardedAdamW with a decay rule: equal to torch.optim.AdamW (groups) on used
    parameters; the unused one decays as its docstring says (moments zero, weight decay applies)."""
    wd, lr = 0.1, 0.01
    model = make()
    fsdp = tessera.FullyShardedDataParallel(model, world, units=list(model.blocks))
    opt = tessera.ShardedAdamW(fsdp, lr=lr, weight_decay=wd, decays=lambda n: not no_decay(n))
    lo = world.rank * PER_RANK
    for b in batches(world.size):
        opt.zero_grad()
        loss_of(fsdp, b[lo:lo + PER_RANK]).backward()
        opt.step()
    ref = reference(lambda m: (torch.optim.AdamW(torch_groups(m), lr=lr, weight_decay=wd), None), world.size)
    full = check_used(world, fsdp, ref, atol=2e-6)
    if world.rank == 0:
        torch.testing.assert_close(full["unused"], make().unused.detach() * (1 - lr * wd) ** STEPS, rtol=1e-6, atol=0)


def test_views_replaced_and_grad_copied(world):
    """A view's .grad set by the user to another tensor is taken as its gradient (added to by the
    next backward); param_groups() again replaces the views (the old ones get no more .grad)."""
    model = make()
    fsdp = tessera.FullyShardedDataParallel(model, world, units=list(model.blocks))
    old = list(fsdp.parameters())
    new = [p for g in fsdp.param_groups(options) for p in g["params"]]
    assert not set(map(id, old)) & set(map(id, new))
    b = batches(world.size)[0]
    lo = world.rank * PER_RANK
    loss_of(fsdp, b[lo:lo + PER_RANK]).backward()
    assert all(p.grad is None for p in old)
    first = [p.grad.clone() for p in new]
    for p in new:
        p.grad = torch.ones_like(p)  # another tensor: copied in before the next backward adds
    loss_of(fsdp, b[lo:lo + PER_RANK]).backward()
    for p, g in zip(new, first):
        torch.testing.assert_close(p.grad, g + 1, rtol=1e-6, atol=1e-7)
    gather_all(world, torch.zeros(1))  # keep the ranks in step
