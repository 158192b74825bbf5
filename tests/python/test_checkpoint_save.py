"""Checkpoints from Python, first half (4 ranks): train SAVE_AT steps in two layouts — FSDP over
dp2 with tensor-parallel layers (tp2), and DDP over dp2 with a 2-stage pipeline — check them
against single-process training, save (tessera.checkpoint.save), and check that the full state
dict loads into the plain torch model. test_checkpoint_load.py (2 ranks) resumes them in other
layouts. Model, data and layouts: ckpt_model.py."""
import torch

import tessera
from ckpt_model import SAVE_AT, Plain, Run, assert_matches, batch, ckpt_dir, reference


def train_and_save(world, scenario, dp, pp, tp, mode):
    run = Run(world, dp, pp, tp, mode)
    for s in range(SAVE_AT):
        run.step(s)
    tessera.checkpoint.save(ckpt_dir(scenario), run.model, run.opt, step=SAVE_AT, scheduler=run.sched,
                            data_state={"next_step": SAVE_AT})
    full = tessera.checkpoint.full_state_dict(run.model)
    ref = reference(world, SAVE_AT)
    assert_matches(world, full, ref, atol=1e-5)
    if world.rank == 0:
        plain = Plain()
        plain.load_state_dict(full)  # strict: every name of the plain model, nothing else
        b = batch(0)
        torch.testing.assert_close(plain(b[:, :-1]), ref(b[:, :-1]), rtol=0, atol=1e-4)
    else:
        assert full == {}


def test_save_fsdp_tp(world):
    assert world.size == 4
    train_and_save(world, "fsdp_tp", dp=2, pp=1, tp=2, mode="fsdp")


def test_save_ddp_pp(world):
    train_and_save(world, "ddp_pp", dp=2, pp=2, tp=1, mode="ddp")
