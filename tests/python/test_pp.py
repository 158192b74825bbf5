"""tessera.Pipeline (the C++ schedule executor over Python stages) vs the unsplit model.

The model is 4 blocks (Linear + tanh) and a Linear head; every rank builds all of it from one
seed and keeps its stages. The reference runs the whole model on the whole batch (mean MSE).
After one step the loss (every rank) and each stage parameter's gradient must match it:
float32, rtol 1e-5 / atol 1e-6 (only the order of the micro-batch sums differs; a missing or
doubled micro-batch is off by far more).
"""
import pytest
import torch
import torch.nn.functional as F

import tessera

TOL = dict(rtol=1e-5, atol=1e-6)
BATCH, D, OUT, BLOCKS = 8, 6, 3, 4


def model():
    torch.manual_seed(3)
    blocks = [torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh()) for _ in range(BLOCKS)]
    return blocks, torch.nn.Linear(D, OUT)


def batch():
    g = torch.Generator().manual_seed(11)
    return torch.randn(BATCH, D, generator=g), torch.randn(BATCH, OUT, generator=g)


def stage_of(world, chunk, v=False):
    """Stage of this rank's chunk: chunk * pp + rank, or in zbv's V rank and 2 pp - 1 - rank."""
    return (2 * world.size - 1 - world.rank if chunk == 1 else world.rank) if v else chunk * world.size + world.rank


def my_stages(world, chunks, v=False):
    """This rank's stages: the blocks split evenly over pp * chunks stages (stage_of), the head
    appended to the last; returns (stage modules, all blocks, head)."""
    blocks, head = model()
    n_stages = world.size * chunks
    per = BLOCKS // n_stages
    stages = []
    for c in range(chunks):
        s = stage_of(world, c, v)
        mods = blocks[s * per:(s + 1) * per] + ([head] if s == n_stages - 1 else [])
        stages.append(torch.nn.Sequential(*mods))
    return stages, blocks, head


@pytest.mark.parametrize("schedule,micro,chunks,extra", [("1f1b", 4, 1, 0), ("gpipe", 2, 1, 0), ("1f1b", 8, 1, 0),
                                                         ("1f1b", 8, 1, 2), ("interleaved_1f1b", 4, 2, 0),
                                                         ("zbv", 4, 2, 0)])
def test_pipeline_matches_unsplit_model(world, schedule, micro, chunks, extra):
    if BLOCKS % (world.size * chunks):
        pytest.skip("needs pp * chunks to divide the blocks")
    v = schedule == "zbv"  # rank 0 holds the first and the last stage
    stages, _, _ = my_stages(world, chunks, v)
    pipe = tessera.Pipeline(stages, world, micro_batches=micro, loss_fn=F.mse_loss, schedule=schedule,
                            extra_warmup=extra)
    x, y = batch()
    first, last = world.rank == 0, world.rank == (0 if v else world.size - 1)
    loss = pipe.step(x if first else None, y if last else None)

    ref_blocks, ref_head = model()
    ref = torch.nn.Sequential(*ref_blocks, ref_head)
    ref_loss = F.mse_loss(ref(x), y)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), **TOL)
    # Each stage parameter's gradient equals the same parameter's in the reference: parameters
    # are matched by (stage index, name) against the reference modules the stage was built from.
    n_stages = world.size * chunks
    per = BLOCKS // n_stages
    checked = 0
    for c, stage in enumerate(stages):
        s = stage_of(world, c, v)
        ref_mods = ref_blocks[s * per:(s + 1) * per] + ([ref_head] if s == n_stages - 1 else [])
        ref_params = [p for m in ref_mods for p in m.parameters()]
        for (n, p), q in zip(stage.named_parameters(), ref_params):
            assert p.grad is not None, f"stage {s}: {n} got no gradient"
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=f"stage {s}: grad of {n}")
            checked += 1
    assert checked == sum(len(list(s.parameters())) for s in stages) > 0
    if schedule == "1f1b":
        last_rank = world.rank == world.size - 1
        assert pipe.peak_in_flight <= min(micro, world.size - world.rank + (0 if last_rank else extra))


def test_batch_not_divisible_is_an_error_on_every_rank(world):
    stages, _, _ = my_stages(world, 1)
    pipe = tessera.Pipeline(stages, world, micro_batches=3, loss_fn=F.mse_loss)
    x, y = batch()
    with pytest.raises(tessera.Error, match="micro"):
        pipe.step(x if world.rank == 0 else None, y if world.rank == world.size - 1 else None)
    # The communicator is still usable: a good step afterwards works.
    pipe = tessera.Pipeline(stages, world, micro_batches=2, loss_fn=F.mse_loss)
    loss = pipe.step(x if world.rank == 0 else None, y if world.rank == world.size - 1 else None)
    assert torch.isfinite(loss)


def test_python_exception_in_a_stage_reaches_python_on_every_rank(world):
    # The first step probes the stages' shapes in order; a stage raising there ends the step on
    # every rank (the communicator stays usable), the Python message on the rank that raised.
    def bad(t):
        raise ValueError("stage exploded")

    if world.size != 2:
        pytest.skip("the messages name the stages of a 2-rank pipeline")
    stages, _, _ = my_stages(world, 1)
    last = world.rank == world.size - 1
    pipe = tessera.Pipeline([bad] if last else stages, world, micro_batches=2, loss_fn=F.mse_loss)
    x, y = batch()
    want = r"pipeline stage 1 \(pp rank 1, chunk 0\) failed on its input .*stage exploded" if last else \
        r"pipeline step aborted on every pp rank: stage 1 \(pp rank 1"
    with pytest.raises(tessera.Error, match=want):
        pipe.step(x if world.rank == 0 else None, y if last else None)
    world.barrier()
