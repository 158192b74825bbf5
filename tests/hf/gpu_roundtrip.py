#!/usr/bin/env python3
"""tessera <-> transformers on the GPU machine (it has transformers; our CPU machines do not):

  python3 tests/hf/gpu_roundtrip.py --build build-gpu [--work DIR] [--gpus N]

A. tessera -> transformers: train_gpt trains tiny Llamas a few steps (tied without scaling;
   untied with Llama 3 rope scaling and GQA) on tp 2 (1 GPU if only one), exports them with
   --save-hf-at-end (fp32) and tessera-convert export-hf (bf16);
   LlamaForCausalLM.from_pretrained loads each: its logits on the export's weights equal
   tessera's (tessera_generate --logits-out on the checkpoint), its greedy continuation equals
   tessera's, and the bf16 export loads with torch_dtype bfloat16.
B. transformers -> tessera: a random LlamaForCausalLM (GQA, untied, llama3 rope scaling) saved
   with save_pretrained (safetensors) is imported (tessera-convert import-hf) and read directly
   (tessera_generate on the HF directory): greedy ids and step logits equal transformers', on 1
   GPU and on tp 2; train_gpt --init-from-hf fine-tunes it 2 steps on tp 2 with FSDP off and on,
   and its export loads in transformers again; export -> from_pretrained of the unchanged import
   gives transformers' own logits.
The transformers reference runs on the CPU in float32 (no TF32). Prints PASS/FAIL per check and
exits 1 when any failed. Needs torch, transformers (and safetensors, which it brings).
"""
import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile

import torch

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--build", required=True, help="the GPU build directory (train_gpt, tessera_generate, tessera_convert)")
ap.add_argument("--work", help="scratch directory (default: a temporary one, removed when all passed)")
ap.add_argument("--gpus", type=int, default=min(2, max(1, torch.cuda.device_count())))
args = ap.parse_args()

import transformers  # noqa: E402

BUILD = os.path.abspath(args.build)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN, GENERATE = os.path.join(BUILD, "bin", "train_gpt"), os.path.join(BUILD, "bin", "tessera_generate")
CONVERT = os.path.join(ROOT, "tools", "tessera-convert")
WORK = args.work or tempfile.mkdtemp(prefix="tessera-gpu-hf-")
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, TESSERA_BUILD_DIR=BUILD, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
           NVSHMEM_DISABLE_NVLS="1")
TOL = 1e-3  # logits (tessera on the GPU in fp32 vs transformers on the CPU)
failures = []
torch.backends.cuda.matmul.allow_tf32 = False


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run(argv, n=1, launch=False):
    if n > 1 or launch:
        argv = ["torchrun", "--standalone", f"--master_port={port()}", f"--nproc_per_node={n}", "--no_python"] + argv
    p = subprocess.run(argv, cwd=WORK, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout[-4000:])
        raise SystemExit(f"{' '.join(argv)}: exit status {p.returncode}")
    return p.stdout


def from_pretrained(path, dtype):
    """LlamaForCausalLM.from_pretrained in `dtype` (transformers 5 names the argument dtype)."""
    try:
        return transformers.LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()
    except TypeError:
        return transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=dtype).eval()


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, s = e["data_offsets"]
        dt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[e["dtype"]]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + s]), dtype=dt).reshape(e["shape"]).float()
    return out


def tessera_generate(model_dir, prompt, n_new, gpus):
    out = os.path.join(WORK, "logits.safetensors")
    text = run([GENERATE, model_dir, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(n_new),
                "--logits-out", out], n=gpus)
    ids = [int(i) for i in [ln for ln in text.splitlines() if ln.startswith("ids: ")][0][5:].split(",")]
    return ids, read_safetensors(out)["prompt.0"]


def transformers_reference(model, prompt, n_new):
    """Greedy ids (argmax of full forwards, and model.generate) and each step's logits."""
    ids, steps = list(prompt), []
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            steps.append(logits)
            ids.append(int(logits.argmax()))
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=0)[0, len(prompt):].tolist()
    return ids[len(prompt):], gen, torch.stack(steps)


def compare(tag, model_dir_or_ckpt, hf_model, prompt, gpus, n_new=8):
    want, gen, want_logits = transformers_reference(hf_model, prompt, n_new)
    check(gen == want, f"{tag}: transformers' generate() = its argmax path {want}")
    ids, logits = tessera_generate(model_dir_or_ckpt, prompt, n_new, gpus)
    check(ids == want, f"{tag}: tessera greedy {ids} = transformers' {want}")
    err = float((logits - want_logits).abs().max()) if ids == want else float("inf")
    check(err < TOL * max(1.0, float(want_logits.abs().max())), f"{tag}: step logits within {err:.2e}")


def part_a():
    variants = {"tied": ["--model", "llama-tiny", "--seq-len", "64"],
                "untied_scaled": ["--model", "llama3-1b", "--hidden-size", "128", "--layers", "2", "--heads", "4", "--kv-heads",
                                  "2", "--ffn", "256", "--vocab", "1024", "--seq-len", "64", "--untie-embeddings"]}
    tp = min(2, args.gpus)
    for tag, model in variants.items():
        ck, live, bf = (os.path.join(WORK, f"a_{tag}_{x}") for x in ("ckpt", "hf32", "hf16"))
        run([TRAIN, *model, "--tp", str(tp), "--steps", "3", "--batch", "4", "--lr", "1e-2", "--checkpoint-dir", ck,
             "--save-hf-at-end", live, "--save-hf-dtype", "fp32", "--log-jsonl", ""], n=tp, launch=True)
        run([CONVERT, "export-hf", ck, bf])
        m = from_pretrained(live, torch.float32)
        compare(f"A {tag}: tessera-trained -> transformers (fp32)", ck, m, [3, 14, 15, 92, 65], tp)
        m16 = from_pretrained(bf, torch.bfloat16)
        saved = json.load(open(os.path.join(bf, "config.json")))
        check(m16.dtype == torch.bfloat16 and saved["torch_dtype"] == "bfloat16",
              f"A {tag}: the bf16 export loads as bfloat16")


def part_b():
    kw = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
              tie_word_embeddings=False)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    try:
        cfg = transformers.LlamaConfig(rope_scaling=scaling, **kw)
    except TypeError:  # transformers 5
        cfg = transformers.LlamaConfig(rope_parameters=dict(scaling, rope_theta=500000.0), **kw)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init: sharper attention, every convention shows
        for p in model.parameters():
            p.mul_(8.0 if p.dim() == 2 else 1.0).add_(0.1 * torch.randn_like(p) if p.dim() == 1 else 0)
    hf = os.path.join(WORK, "b_hf")
    model.save_pretrained(hf)  # safetensors (transformers' default)
    prompt = [7, 99, 300, 12]
    compare("B: transformers-saved dir read by tessera (1 GPU)", hf, model, prompt, 1)
    ck = os.path.join(WORK, "b_ckpt")
    run([CONVERT, "import-hf", hf, ck])
    compare(f"B: imported checkpoint on tp {min(2, args.gpus)}", ck, model, prompt, min(2, args.gpus))
    back = os.path.join(WORK, "b_back")
    run([CONVERT, "export-hf", ck, back, "--dtype", "fp32"])
    again = from_pretrained(back, torch.float32)
    x = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        same = torch.equal(again(x).logits, model(x).logits)
    check(same, "B: import -> export (fp32) -> from_pretrained gives transformers' own logits exactly")
    tp = min(2, args.gpus)
    for mode in ("ddp", "fsdp"):
        out = os.path.join(WORK, f"b_ft_{mode}")
        layout = ["--tp", str(tp)] if mode == "ddp" else ["--dp-mode", "fsdp"]
        run([TRAIN, "--init-from-hf", hf, *layout, "--seq-len", "64", "--steps", "2", "--batch", "4", "--lr", "1e-3",
             "--save-hf-at-end", out, "--save-hf-dtype", "fp32", "--log-jsonl", ""], n=tp, launch=True)
        ft = from_pretrained(out, torch.float32)
        with torch.no_grad():
            moved = float((ft(x).logits - model(x).logits).abs().max())
        check(0 < moved < 1e3, f"B: --init-from-hf fine-tuned ({mode}) export loads; logits moved by {moved:.3g}")


part_a()
part_b()
print(f"gpu_roundtrip: {len(failures)} failed" + (f": {failures}" if failures else ", all passed"))
if not failures and not args.work:
    shutil.rmtree(WORK)
sys.exit(1 if failures else 0)
