"""Not a test file: the harness check (python.harness_rank_fails). Rank 1 raises while the
other ranks wait in a barrier it never joins; the launch must end with rank 1's error, not hang."""
import tessera

ctx = tessera.init(backend="gloo")
if ctx.rank == 1:
    raise RuntimeError("rank 1: failing on purpose")
ctx.world.barrier()
print(f"rank {ctx.rank}: passed the barrier (wrong)")
