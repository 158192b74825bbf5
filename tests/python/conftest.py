"""Shared fixtures of the Python tests. Every file runs on every rank of a torchrun launch
(tests/python/run_pytest.sh); collective tests must run in the same order on every rank."""
import os

import pytest
import torch

import tessera


@pytest.fixture(scope="session")
def ctx():
    """tessera.init() once per process (collective over the launch), Gloo on CPU."""
    assert "RANK" in os.environ, "run these tests under torchrun (tests/python/run_pytest.sh)"
    return tessera.init(backend="gloo")


@pytest.fixture(scope="session")
def world(ctx):
    return ctx.world


def gather_all(comm, t):
    """Every rank's copy of `t` (same shape on all ranks), stacked: [size, *t.shape]."""
    t = t.detach().contiguous()
    out = torch.empty((comm.size,) + tuple(t.shape), dtype=t.dtype)
    comm.all_gather(out, t)
    return out


def assert_close_on_rank0(comm, got, want, atol, skip=()):
    """Rank 0 compares `got` (a gathered state dict, on rank 0) with `want` ({name: tensor}) within
    `atol`, names in `skip` left out; every rank of `comm` fails with rank 0's findings."""
    bad = []
    if comm.rank == 0:
        names = sorted(set(want) - set(skip))
        if sorted(set(got) - set(skip)) != names:
            bad.append(f"names differ: {sorted((set(got) ^ set(want)) - set(skip))}")
        for n in names:
            if n in got:
                err = (got[n] - want[n].detach()).abs().max().item()
                if not err <= atol:
                    bad.append(f"{n}: max error {err:.3g}")
    ok = torch.tensor([float(not bad)])
    comm.broadcast(ok, 0)
    assert ok.item() == 1.0, "; ".join(bad) or "rank 0 found differences"
