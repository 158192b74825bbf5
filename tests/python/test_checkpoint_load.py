"""Checkpoints from Python, second half (2 ranks): the checkpoints test_checkpoint_save.py wrote
on 4 ranks are loaded into other layouts — FSDP dp2 × tp2 into a 2-stage pipeline (DDP, tp1),
DDP dp2 × pp2 into FSDP dp2 — and training continues to TOTAL steps; the result must match an
uninterrupted single-process run (parameters, optimizer state through the steps that follow,
the LR schedule, the data position). The checkpoint read in one process loads into the plain
torch model."""
import os

import torch

import tessera
from ckpt_model import SAVE_AT, TOTAL, Plain, Run, assert_matches, batch, ckpt_dir, cosine_lr, reference


def resume(world, scenario, dp, pp, tp, mode):
    run = Run(world, dp, pp, tp, mode)
    info = tessera.checkpoint.load(ckpt_dir(scenario), run.model, run.opt, scheduler=run.sched)
    assert info["step"] == SAVE_AT and info["data_state"] == {"next_step": SAVE_AT}
    assert run.sched.last_epoch == SAVE_AT
    for g in run.opt.param_groups:
        assert abs(g["lr"] - cosine_lr(SAVE_AT)) < 1e-9, g["lr"]
    for s in range(info["data_state"]["next_step"], TOTAL):
        run.step(s)
    full = tessera.checkpoint.full_state_dict(run.model)
    assert_matches(world, full, reference(world, TOTAL), atol=1e-5)


def test_fsdp_tp_into_pipeline(world):
    assert world.size == 2
    resume(world, "fsdp_tp", dp=1, pp=2, tp=1, mode="ddp")


def test_ddp_pp_into_fsdp(world):
    resume(world, "ddp_pp", dp=2, pp=1, tp=1, mode="fsdp")


def test_load_full_into_plain(world):
    """One process reads the whole checkpoint (no collective) into the plain model."""
    ref = reference(world, SAVE_AT)
    sd = tessera.checkpoint.load_full(ckpt_dir("ddp_pp"))
    plain = Plain()
    plain.load_state_dict(sd)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(sd[n], p.detach(), rtol=0, atol=1e-5, msg=n)
    opt_state = tessera.checkpoint.load_full(ckpt_dir("ddp_pp"), optimizer_state=True)
    assert {n for n in opt_state if n.startswith("optim.exp_avg.")} == {f"optim.exp_avg.{n}" for n in sd}
    b = batch(1)
    torch.testing.assert_close(plain(b[:, :-1]), ref(b[:, :-1]), rtol=0, atol=1e-4)


def test_sharded_adamw_round_trip(world):
    """FSDP with tessera.ShardedAdamW (whose state is saved under train_gpt's names, its step as the
    checkpoint's): saved after 2 steps and resumed into a fresh model and optimizer, the next 2
    steps are bitwise those of the run that went on."""
    from ckpt_model import Stage, batch, loss_fn, no_decay

    path = os.path.join(ckpt_dir("sharded_adamw"), "ckpt")

    def build():
        stage = Stage(world.split(world.rank, 0, "solo"))
        fsdp = tessera.FullyShardedDataParallel(stage, world, units=list(stage.blocks.values()))
        return fsdp, tessera.ShardedAdamW(fsdp, lr=0.01, weight_decay=0.1, decays=lambda n: not no_decay(n))

    def train(fsdp, opt, steps):
        for s in steps:
            b = batch(s)
            opt.zero_grad()
            loss_fn(fsdp(b[:, :-1]), b[:, 1:]).backward()
            opt.step()

    fsdp, opt = build()
    train(fsdp, opt, range(2))
    tessera.checkpoint.save(path, fsdp, opt, step=2)
    train(fsdp, opt, range(2, 4))
    straight = tessera.checkpoint.full_state_dict(fsdp)
    fsdp2, opt2 = build()
    assert tessera.checkpoint.load(path, fsdp2, opt2)["step"] == 2
    assert opt2._opt.steps == 2
    train(fsdp2, opt2, range(2, 4))
    resumed = tessera.checkpoint.full_state_dict(fsdp2)
    if world.rank == 0:
        assert sorted(resumed) == sorted(straight)
        for n in straight:
            assert torch.equal(resumed[n], straight[n]), n
    full = tessera.checkpoint.load_full(path, optimizer_state=True)
    assert {n[len("optim.exp_avg."):] for n in full if n.startswith("optim.exp_avg.")} == {
        n for n in full if not n.startswith("optim.")}
