"""tessera beside torch.distributed in one process, under any launcher (beside_torch_test.sh).

    beside_torch.py <order>
      torch_first    torch.distributed.init_process_group("gloo"), then tessera.init()
      tessera_first  tessera.init(), then a plain torch.distributed.init_process_group("gloo")
      init_torch     tessera.init(init_torch_distributed=True) only
      torch_first_env  as torch_first, with tessera told it cannot take torch's store object (as
                     where tessera._C and torch do not share pybind11's registry): tessera then
                     finds the launcher itself and shares torch's multi-tenant server

Under torchrun the plain init_process_group uses env://; under mpirun/srun (no RANK or
MASTER_ADDR) torch_first passes the rank, world size and a tcp:// address itself, as a user's
script would (MASTER_ADDR/MASTER_PORT from the driver), and tessera_first is not run.

Then torch.distributed and tessera collectives alternate (all-reduce, broadcast, all-gather,
barrier, a torch group and a tessera split), each checked against its hand-computed result.
Every rank prints one line "BESIDE order=... launcher=... rank=r world=n ... ok", or
"BESIDE FAILED rank=r: <error>" and exits 1.
"""
import os
import sys
import traceback

import torch
import torch.distributed as dist

import tessera


def _launcher_rank():
    for r, n in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    raise RuntimeError("no launcher rank in the environment")


def start(order):
    if order == "torch_first_env":
        tessera._C.can_use_torch_store = lambda store: False
        order = "torch_first"
    if order == "torch_first":
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            dist.init_process_group("gloo")  # env://
        else:
            rank, world = _launcher_rank()
            url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
        return tessera.init(backend="gloo")
    if order == "tessera_first":
        ctx = tessera.init(backend="gloo")
        dist.init_process_group("gloo")  # env://, must not die on MASTER_PORT
        return ctx
    if order == "init_torch":
        ctx = tessera.init(backend="gloo", init_torch_distributed=True)
        assert dist.is_initialized(), "init_torch_distributed=True left torch.distributed uninitialized"
        return ctx
    raise SystemExit(f"unknown order {order}")


def alternate(ctx):
    r, n = ctx.rank, ctx.world_size
    assert dist.get_rank() == r and dist.get_world_size() == n, \
        f"torch.distributed says rank {dist.get_rank()} of {dist.get_world_size()}, tessera {r} of {n}"
    total = n * (n + 1) / 2
    for i in range(3):
        t = torch.full((7,), float(r + 1 + i))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((7,), total + n * i)), f"torch all_reduce {i}: {t}"
        u = torch.full((5,), float(r + 1 - i))
        ctx.world.all_reduce(u)
        assert torch.equal(u, torch.full((5,), total - n * i)), f"tessera all_reduce {i}: {u}"
        b = torch.full((3,), float(r * 10 + i))
        dist.broadcast(b, src=n - 1)
        assert torch.equal(b, torch.full((3,), float((n - 1) * 10 + i))), f"torch broadcast {i}: {b}"
        g = torch.empty(n * 2)
        ctx.world.all_gather(g, torch.tensor([float(r), float(i)]))
        want = torch.tensor([[float(k), float(i)] for k in range(n)]).flatten()
        assert torch.equal(g, want), f"tessera all_gather {i}: {g}"
        dist.barrier()
        ctx.world.barrier()
    # Groups of both sides after the first collectives: a torch group of the even ranks, a tessera split.
    evens = list(range(0, n, 2))
    tg = dist.new_group(evens)
    sub = ctx.world.split(r % 2, r, "parity")
    if r % 2 == 0:
        t = torch.ones(2)
        dist.all_reduce(t, group=tg)
        assert torch.equal(t, torch.full((2,), float(len(evens)))), f"torch group all_reduce: {t}"
    s = torch.ones(1)
    sub.all_reduce(s)
    assert s.item() == sub.size == len(range(r % 2, n, 2)), f"tessera split all_reduce: {s}"
    objs = [None] * n
    dist.all_gather_object(objs, ctx.launcher)
    assert len(set(objs)) == 1, f"ranks disagree on the launcher: {objs}"


def main():
    order = sys.argv[1]
    rank = "?"
    try:
        ctx = start(order)
        rank = ctx.rank
        alternate(ctx)
        print(f"BESIDE order={order} launcher={ctx.launcher} rank={ctx.rank} world={ctx.world_size} "
              f"hosts_store={int(ctx.hosts_store)} store='{ctx.store_description}' ok", flush=True)
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the driver greps the message
        traceback.print_exc()
        print(f"BESIDE FAILED rank={rank}: {e}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
