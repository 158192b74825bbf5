"""tessera.hf: the Python Llama (tessera.llama.LlamaStage) from and to Hugging Face directories,
on 2 ranks, against tests/hf/hf_llama.py (an independent safetensors writer and reader, and a
PyTorch forward with transformers' conventions): loaded into tp 2, pp 2 and FSDP over dp 2 the
logits equal the reference's (fp32 tolerance); saved back from tp 2 the tensors are the source's
(fp32 exactly, bf16 rounded once); a config tessera cannot express, a family the Python Llama is
not (Qwen3-MoE: q/k norms, head size, experts) and a model of another shape are tessera.Error
naming the field."""
import json
import os
import shutil
import sys
import tempfile

import pytest
import torch

import tessera
from tessera import llama

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "hf"))
import hf_families as F  # noqa: E402
import hf_llama as H  # noqa: E402

TOL = dict(rtol=1e-4, atol=2e-4)
VARIANT = "gqa_untied"


@pytest.fixture(scope="module")
def hf_dir(world):
    """The tiny HF Llama (float32, 2 files with an index), written by rank 0 into a directory
    every rank of this launch names alike."""
    d = os.path.join(tempfile.gettempdir(), f"tessera-pyhf-{os.environ['MASTER_PORT']}")
    if world.rank == 0:
        c = H.config(VARIANT)
        H.write_model(d, c, H.random_weights(c, seed=3), "F32", 2)
    world.barrier()
    yield d
    world.barrier()
    if world.rank == 0:
        for p in (d, d + "-saved-fp32", d + "-saved-bf16"):
            shutil.rmtree(p, ignore_errors=True)


def reference(hf_dir, tokens):
    c, w = H.read_model(hf_dir)
    return H.forward(c, w, tokens)  # [b, T, V]


def tokens(cfg):
    return torch.randint(0, cfg.vocab, (2, cfg.seq_len), generator=torch.Generator().manual_seed(5))


def gathered_vocab(logits, tp):
    """[T, b, V/tp] shards over tp -> [b, T, V]."""
    out = torch.empty((tp.size,) + tuple(logits.shape))
    tp.all_gather(out, logits.detach().contiguous())
    return torch.cat(list(out), dim=-1).transpose(0, 1)


def test_config_maps_and_refuses(world, hf_dir, tmp_path):
    cfg = tessera.hf.config(hf_dir)
    assert (cfg.d, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, cfg.seq_len) == (64, 2, 4, 2, 96, 256, 32)
    assert cfg.rope_scaling == {"factor": 4.0, "low": 1.0, "high": 4.0, "original": 16} and not cfg.tied
    bad = tmp_path / f"bad{world.rank}"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(H.config(VARIANT, hidden_act="gelu")))
    with pytest.raises(tessera.Error, match="hidden_act is 'gelu'"):
        tessera.hf.config(bad)
    (bad / "config.json").write_text(json.dumps(F.tiny_config("qwen3_moe")))
    with pytest.raises(tessera.Error, match="the Python Llama has no q/k norm, explicit head size or experts"):
        tessera.hf.config(bad)


def test_load_tp2(world, hf_dir):
    mesh = tessera.mesh(tp=2, world=world)
    cfg = tessera.hf.config(hf_dir)
    stage = llama.LlamaStage(cfg, mesh)
    tessera.hf.load(stage, hf_dir, mesh)
    x = tokens(cfg)
    with torch.no_grad():
        got = gathered_vocab(stage(x), mesh.tp)
    torch.testing.assert_close(got, reference(hf_dir, x), **TOL)


def test_load_pp2(world, hf_dir):
    mesh = tessera.mesh(pp=2, world=world)
    cfg = tessera.hf.config(hf_dir)
    stage = llama.LlamaStage(cfg, mesh, stage=world.rank, pp=2)
    tessera.hf.load(stage, hf_dir, mesh)
    x = tokens(cfg)
    with torch.no_grad():
        if world.rank == 0:
            world.send(stage(x).contiguous(), 1)
        else:
            h = torch.empty(cfg.seq_len, 2, cfg.d)
            world.recv(h, 0)
            torch.testing.assert_close(stage(h).transpose(0, 1), reference(hf_dir, x), **TOL)


def test_load_fsdp_dp2(world, hf_dir):
    mesh = tessera.mesh(dp=2, world=world)
    cfg = tessera.hf.config(hf_dir)
    stage = llama.LlamaStage(cfg, mesh.tp, seed=99)  # other weights until loaded
    fsdp = tessera.FullyShardedDataParallel(stage, mesh.dp, units=stage.units())
    tessera.hf.load(fsdp, hf_dir, mesh)
    x = tokens(cfg)
    with torch.no_grad():
        got = fsdp(x).transpose(0, 1)
    torch.testing.assert_close(got, reference(hf_dir, x), **TOL)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_save_from_tp2(world, hf_dir, dtype):
    mesh = tessera.mesh(tp=2, world=world)
    cfg = tessera.hf.config(hf_dir)
    stage = llama.LlamaStage(cfg, mesh)
    tessera.hf.load(stage, hf_dir, mesh)
    out = hf_dir + f"-saved-{dtype}"
    tessera.hf.save(stage, out, mesh, dtype=dtype, base_config=hf_dir)
    ok = torch.ones(1)
    if world.rank == 0:
        c, want = H.read_model(hf_dir)
        c2, got = H.read_model(out)
        assert c2["torch_dtype"] == ("float32" if dtype == "fp32" else "bfloat16") and c2["bos_token_id"] == 1
        assert sorted(got) == sorted(want)
        for n in want:
            w = want[n] if dtype == "fp32" else want[n].to(torch.bfloat16).float()
            ok *= float(torch.equal(got[n], w))
    world.broadcast(ok, 0)
    assert ok.item() == 1.0, "the saved tensors differ from the source's"


def test_model_of_another_shape_is_refused(world, hf_dir):
    cfg = tessera.hf.config(hf_dir, ffn=128)
    stage = llama.LlamaStage(cfg, world.split(world.rank, 0, "alone"))
    with pytest.raises(tessera.Error, match="field ffn is 96"):
        tessera.hf.load(stage, hf_dir)
