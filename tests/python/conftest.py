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
