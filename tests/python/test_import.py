"""The module imports, reports its version and build, and its collectives and mesh work."""
import os
import re

import pytest
import torch

import tessera


def test_version_and_build_info():
    # run_pytest.sh passes what CMake knows; none of these has a default that could pass alone.
    assert tessera.__version__ == os.environ["TESSERA_EXPECT_VERSION"]
    info = tessera.build_info()
    assert set(info) >= {"version", "cuda", "torch_cuda", "nccl", "nccl_version", "gloo", "pmix",
                         "torch_version", "cuda_devices"}
    assert info["version"] == tessera.__version__
    assert info["torch_version"] == torch.__version__
    assert info["gloo"] is (os.environ["TESSERA_EXPECT_GLOO"] == "ON")
    assert info["nccl"] is (os.environ["TESSERA_EXPECT_NCCL"] == "ON")
    assert info["pmix"] is (os.environ["TESSERA_EXPECT_PMIX"] == "ON")
    assert info["cuda"] is (os.environ["TESSERA_EXPECT_CUDA"] == "ON")
    if info["nccl"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["nccl_version"])
    else:
        assert info["nccl_version"] is None


def test_one_libtorch_in_the_process():
    # tessera._C links libtessera's LibTorch; torch's Python package must have loaded the same file.
    with open("/proc/self/maps") as f:
        libs = {os.path.realpath(line.split()[-1]) for line in f
                if re.search(r"/libtorch_cpu[^/]*\.so", line.split()[-1] if line.split() else "")}
    assert len(libs) == 1, libs


def test_init_reads_torchrun(ctx):
    assert ctx.launcher == "torchrun"
    assert ctx.rank == int(os.environ["RANK"])
    assert ctx.world_size == int(os.environ["WORLD_SIZE"])
    assert ctx.local_rank == int(os.environ["LOCAL_RANK"])
    assert ctx.world.size == ctx.world_size and ctx.world.rank == ctx.rank
    assert ctx.world.backend == "gloo"
    assert ctx.device == torch.device("cpu")


def test_collectives(world):
    r, n = world.rank, world.size
    t = torch.full((5,), float(r + 1))
    world.all_reduce(t)
    assert torch.equal(t, torch.full((5,), n * (n + 1) / 2))
    t = torch.full((3,), float(r + 1))
    world.all_reduce(t, op=tessera.ReduceOp.MAX)
    assert torch.equal(t, torch.full((3,), float(n)))
    t = torch.full((3,), float(r))
    world.all_reduce(t, op="avg")
    assert torch.allclose(t, torch.full((3,), (n - 1) / 2))

    t = torch.arange(4, dtype=torch.int64) * (r + 7)
    world.broadcast(t, root=n - 1)
    assert torch.equal(t, torch.arange(4) * (n - 1 + 7))

    out = torch.empty(n * 2, dtype=torch.int32)
    world.all_gather(out, torch.tensor([r, 10 * r], dtype=torch.int32))
    assert out.tolist() == [v for k in range(n) for v in (k, 10 * k)]

    inp = torch.arange(n * 3, dtype=torch.float32) + r
    out = torch.empty(3)
    world.reduce_scatter(out, inp)
    expect = sum(torch.arange(n * 3, dtype=torch.float32) + k for k in range(n))[r * 3:(r + 1) * 3]
    assert torch.equal(out, expect)

    inp = torch.tensor([100 * r + j for j in range(n)], dtype=torch.int64)
    out = torch.empty(n, dtype=torch.int64)
    world.all_to_all(out, inp)
    assert out.tolist() == [100 * k + r for k in range(n)]


def test_async_work_and_p2p(world):
    r, n = world.rank, world.size
    t = torch.ones(1000) * r
    work = world.all_reduce(t, async_op=True)
    assert isinstance(work, tessera.Work) and work.op == "all_reduce"
    work.wait()
    assert work.is_completed()
    assert torch.equal(t, torch.full((1000,), float(sum(range(n)))))
    # A ring: send to the right, receive from the left (ops run in issue order: even ranks
    # send first, odd ranks receive first).
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(3)
    if r % 2 == 0:
        world.send(torch.full((3,), float(r)), right)
        world.recv(got, left, async_op=True).wait()
    else:
        world.recv(got, left)
        world.send(torch.full((3,), float(r)), right, async_op=True).wait()
    assert torch.equal(got, torch.full((3,), float(left)))
    assert world.barrier() is None


def test_mesh(ctx, world):
    n = world.size
    tp = 2
    m = tessera.mesh(tp=tp)  # dp = n / 2
    assert (m.dp_size, m.pp_size, m.tp_size) == (n // tp, 1, tp)
    assert m.coord == (world.rank // tp, 0, world.rank % tp)
    assert m.rank_of(*m.coord) == world.rank
    assert m.tp.size == tp and m.dp.size == n // tp and m.pp.size == 1
    assert m.group_ranks("tp") == [world.rank // tp * tp + t for t in range(tp)]
    # The tp group reduces over exactly its members.
    t = torch.tensor([float(world.rank)])
    m.tp.all_reduce(t)
    assert t.item() == sum(m.group_ranks("tp"))
    assert m.group_ranks("dp") == [d * tp + world.rank % tp for d in range(n // tp)]
    t = torch.tensor([float(world.rank)])
    m.dp.all_reduce(t)
    assert t.item() == sum(m.group_ranks("dp"))
    assert "tp" in repr(m)


def test_gil_released_while_waiting(world):
    # Rank 0 blocks in all_reduce until the last rank joins 0.5 s later; a Python thread must
    # keep running meanwhile (it could not if the binding held the GIL while waiting).
    import threading
    import time
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=spin)
    th.start()
    try:
        if world.rank == world.size - 1:
            time.sleep(0.5)
        before = ticks[0]
        t = torch.ones(1)
        world.all_reduce(t)
        during = ticks[0] - before
    finally:
        stop.set()
        th.join()
    assert t.item() == world.size
    if world.rank == 0:
        assert during >= 50, f"the Python thread ran only {during} times during a 0.5 s wait"
