"""Errors raised in C++ reach Python as tessera.Error (a RuntimeError) with the C++ message.
Every bad call here is made on every rank alike, so the communicators stay in step."""
import re
import time

import pytest
import torch

import tessera


def test_bad_dtype_is_a_tessera_error_with_the_cpp_message(world):
    r, n = world.rank, world.size
    with pytest.raises(tessera.Error) as e:
        world.all_reduce(torch.ones(4, dtype=torch.float64))
    assert isinstance(e.value, RuntimeError)
    assert re.fullmatch(
        rf"all_reduce #\d+ on group 'world' \(rank {r} of {n}, 4 x float64, sum\): input tensor has dtype "
        r"float64; supported: float32, bfloat16, float16, int32, int64", str(e.value)), str(e.value)


def test_bad_peer_and_sizes(world):
    n = world.size
    with pytest.raises(tessera.Error, match=rf"send #\d+ .*: peer rank {n} is invalid \(group of {n}, self {world.rank}\)"):
        world.send(torch.ones(2), n)
    with pytest.raises(tessera.Error, match=r"all_gather"):
        world.all_gather(torch.empty(n * 4 + 1), torch.ones(4))
    # The communicator still works after input errors (they are caught before anything is sent).
    t = torch.ones(2)
    world.all_reduce(t)
    assert t.tolist() == [float(n)] * 2


def test_the_python_llama_refuses_other_families(world):
    for name in ("olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b", "moe-tiny"):
        with pytest.raises(tessera.Error, match=rf"llama: preset '{name}' is .*: the Python Llama has no q/k norm, "
                                               r"explicit head size or experts"):
            tessera.llama.LlamaConfig.preset(name)
    assert tessera.llama.LlamaConfig.preset("llama3-1b").d == 2048  # a plain Llama is taken


def test_mesh_shape_error(world):
    n = world.size
    with pytest.raises(tessera.Error, match=rf"ProcessMesh: dp 3 x pp 1 x tp {n} = {3 * n} does not match the world "
                                           rf"size {n} \(rank {world.rank}\)"):
        tessera.ProcessMesh(world, 3, 1, n)


def test_python_side_errors_are_tessera_errors(world):
    with pytest.raises(tessera.Error, match="reduce op 'prod' is not one of sum, avg, max, min"):
        world.all_reduce(torch.ones(1), op="prod")
    with pytest.raises(tessera.Error, match="backend 'mpi' is not one of gloo, nccl"):
        tessera._C.init(backend="mpi", rank=0, world_size=1, store_port=1)
    with pytest.raises(tessera.Error, match=rf"tessera.init: already initialized in this process \(rank "
                                            rf"{world.rank} of {world.size}\)"):
        tessera.init()


def test_trainer_step_takes_tokens_and_targets_together(ctx):
    from tessera import train
    # Collective: every rank builds one. CPU settings whatever the machine (the context is Gloo's).
    trainer = train.Trainer(train.Config(model="tiny", steps=1, precision="fp32", fused_kernels=False), ctx)
    with pytest.raises(ValueError, match=r"Trainer.step: tokens without targets: pass both"):
        trainer.step(tokens=torch.zeros(8, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"Trainer.step: targets without tokens: pass both"):
        trainer.step(targets=torch.zeros(8, 16, dtype=torch.long))
    assert trainer.steps_done == 0


def test_timeout_is_a_comm_error(world, monkeypatch):
    # Last in this file, because a communication failure aborts every communicator of the
    # process (src/comm/watchdog/watchdog.h). TESSERA_EXIT_ON_ERROR=0 keeps the process alive
    # after it (else the watchdog ends it with exit code 3) so the abort can be checked.
    # Rank 0 waits for a message that rank 1 never sends; the op fails after the 1 s timeout
    # instead of hanging, and the world communicator is aborted with that reason.
    monkeypatch.setenv("TESSERA_EXIT_ON_ERROR", "0")
    sub = world.split(0, world.rank, "timeout_test")
    sub.timeout = 1.0
    if world.rank == 0:
        with pytest.raises(tessera.CommError, match=r"recv #\d+ on group 'timeout_test' \(rank 0 of \d+, recv 1 x float32 from 1\) failed after 1\.\d s") as e:
            sub.recv(torch.empty(1), 1)
        assert isinstance(e.value, tessera.Error)
        with pytest.raises(tessera.CommError, match=r"barrier #\d+ on group 'world'.*another communicator of this "
                                                    r"process failed: .*recv #0 on group 'timeout_test'"):
            world.barrier()
    else:
        time.sleep(5)  # stay connected until rank 0's recv has timed out (rather than seen us leave)
