"""Collectives whose ranks disagree (issue 52): on every rank a catchable tessera.CommError naming every
rank's call, before anything is sent (before, Gloo returned garbage, killed a rank from its own thread
or waited the whole timeout). Each case runs on a group of its own, which the mismatch breaks; 'world'
is unaffected. Rank 1 calls something else than the other ranks."""
import re

import pytest
import torch

import tessera

CASES = {
    "all_gather": (lambda c, odd: c.all_gather(torch.empty(c.size * (5 if odd else 4)), torch.ones(5 if odd else 4)),
                   "all_gather of 4 x float32 per rank", "all_gather of 5 x float32 per rank"),
    "all_reduce": (lambda c, odd: c.all_reduce(torch.ones(8 if odd else 4)),
                   "all_reduce of 4 x float32 (sum)", "all_reduce of 8 x float32 (sum)"),
    "op": (lambda c, odd: c.broadcast(torch.ones(4), 0) if odd else c.all_reduce(torch.ones(4)),
           "all_reduce of 4 x float32 (sum)", "broadcast of 4 x float32 from root 0"),
    "dtype": (lambda c, odd: c.all_reduce(torch.ones(4, dtype=torch.int64 if odd else torch.float32)),
              "all_reduce of 4 x float32 (sum)", "all_reduce of 4 x int64 (sum)"),
    "root": (lambda c, odd: c.broadcast(torch.ones(4), 1 if odd else 0),
             "broadcast of 4 x float32 from root 0", "broadcast of 4 x float32 from root 1"),
}


def who(rank, n):
    """How rank `rank` sees the others' group and rank 1 in the message (ranks other than 1 agree)."""
    others = [r for r in range(n) if r != 1]
    names = ", ".join(map(str, others)) if len(others) <= 2 else f"{others[0]}, {others[1]}-{others[-1]}"
    many = len(others) > 1
    if rank == 1:
        return f"{'ranks' if many else 'rank'} {names}", "rank 1 (this rank)"
    me = " (this rank among them)" if many else " (this rank)"
    return f"{'ranks' if many else 'rank'} {names}{me}", "rank 1"


@pytest.mark.parametrize("case", list(CASES))
def test_mismatch_is_a_comm_error_on_every_rank(world, case):
    call, theirs, odd_call = CASES[case]
    sub = world.split(0, world.rank, f"mm_{case}")
    sub.all_reduce(torch.ones(2))  # matching calls pass
    rest, one = who(world.rank, world.size)
    with pytest.raises(tessera.CommError) as e:
        call(sub, world.rank == 1)
    msg = str(e.value)
    assert isinstance(e.value, tessera.Error) and isinstance(e.value, RuntimeError)
    assert re.search(rf"#2 on group 'mm_{case}' \(rank {world.rank} of {world.size}", msg), msg
    assert f"the ranks called different collectives: {rest} called {theirs}; {one} called {odd_call}" in msg, msg
    # The group is broken now, on every rank alike; 'world' still works.
    with pytest.raises(tessera.CommError, match="broken by an earlier failure"):
        sub.barrier()
    t = torch.ones(3)
    world.all_reduce(t)
    assert t.tolist() == [float(world.size)] * 3
