"""tessera.nn.MoE with expert parallelism over the world against the one-process layer holding every
expert, on every rank's tokens in turn: outputs, input gradients, the experts' gradients (the mean
over the ranks' tokens) and the router's (summed over the ranks), weights after three SGD steps with
the data-parallel mean. Float32 on Gloo, rtol 1e-5 (only the summation order differs)."""
import pytest
import torch

import tessera
import tessera.nn as tnn

TOL = dict(rtol=1e-5, atol=1e-6)
D, E, K, F = 16, 8, 2, 12


def layer(ep, **kw):
    return tnn.MoE(D, E, K, F, shared_ffn=8, aux_loss_coef=0.01, z_loss_coef=0.001, ep=ep, layer=1, seed=7, **kw)


def batch(step, r):
    g = torch.Generator().manual_seed(100 * step + r)
    return torch.randn(5, 2, D, generator=g), torch.randn(5, 2, D, generator=g)


def run(m, step, r):
    x, g = batch(step, r)
    x.requires_grad_()
    y = m(x)
    (y * g).sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_expert_parallel_matches_one_process(world, score):
    p, r = world.size, world.rank
    ep, ref = layer(world, score=score), layer(None, score=score)
    assert ep.local_experts == E // p and ep.first_expert == r * E // p
    assert ep.w1.shape == (E // p, F, D) and ref.w1.shape == (E, F, D)
    experts = slice(ep.first_expert, ep.first_expert + ep.local_experts)
    torch.testing.assert_close(ep.w2.detach(), ref.w2.detach()[experts], rtol=0, atol=0)  # drawn per expert
    for step in range(3):
        y, gx = run(ep, step, r)
        for q in range(p):
            ry, rgx = run(ref, step, q)
            if q == r:
                torch.testing.assert_close(y, ry, **TOL)
                torch.testing.assert_close(gx, rgx, **TOL)
        for name in ("w1", "w3", "w2"):
            want = getattr(ref, name).grad[experts] / p  # the mean over the ranks' tokens
            torch.testing.assert_close(getattr(ep, name).grad, want, **TOL)
        router = ep.router.grad.clone()
        world.all_reduce(router)
        torch.testing.assert_close(router, ref.router.grad, **TOL)
        experts_of_ep = {id(t) for t in ep.expert_parameters()}
        with torch.no_grad():  # SGD on the data-parallel mean
            for prm in ep.parameters():
                if id(prm) not in experts_of_ep:
                    world.all_reduce(prm.grad, "avg")
                prm -= 0.5 * prm.grad
            for prm in ref.parameters():
                prm -= 0.5 * prm.grad / p
        ep.zero_grad()
        ref.zero_grad()
    torch.testing.assert_close(ep.w2.detach(), ref.w2.detach()[experts], **TOL)
    torch.testing.assert_close(ep.shared_w1.detach(), ref.shared_w1.detach(), **TOL)
    load = ep.take_stats()["load"].float()
    world.all_reduce(load)
    assert torch.equal(load, ref.take_stats()["load"].float())


def test_fp8_leaves_the_cpu_path_as_it_is(world):
    # FP8 experts run only on the grouped CUDA kernel; on the CPU the layer computes as without them.
    plain, fp8 = layer(None), layer(None, fp8=True)
    assert fp8.fp8 and not plain.fp8
    y0, g0 = run(plain, 0, world.rank)
    y1, g1 = run(fp8, 0, world.rank)
    assert torch.equal(y0, y1) and torch.equal(g0, g1)
    fp8.fp8 = False
    assert not fp8.fp8


def test_bad_arguments_are_named(world):
    with pytest.raises(tessera.Error, match="top_k = 9"):
        tnn.MoE(D, E, 9, F)
    if world.size == 2:
        with pytest.raises(tessera.Error, match="3 experts do not split evenly over the expert-parallel size 2"):
            tnn.MoE(D, 3, 1, F, ep=world)
    m = tnn.MoE(D, E, K, F)
    with pytest.raises(tessera.Error, match="input must be"):
        m(torch.randn(3, D + 1))
