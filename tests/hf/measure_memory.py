#!/usr/bin/env python3
"""Peak memory of tessera's Hugging Face import and export at Llama 3 8B shapes (the lead runs it
on the 4-GPU machine; docs/training.md, "Hugging Face", states the bounds it checks):

  python3 tests/hf/measure_memory.py --build build-gpu --work /scratch/hf8b [--gpus 4] [--keep]

1. Writes a random HF Llama of the llama3-8b preset's shapes (bf16, files of at most 5 GB with
   an index: about 16 GB), one tensor at a time.
2. Runs, sampling every process's /proc/<pid>/status (RssAnon: the process's own memory;
   RssFile: mapped file pages, which the kernel can drop; VmHWM) and nvidia-smi every 0.2 s:
   a. tessera-convert import-hf     (bound: about 3 x the largest tensor in fp32: the embedding, 2.1 GB)
   b. tessera-convert export-hf     (bound: one tensor in fp32 + bf16, ~3.2 GB for the embedding)
   c. train_gpt --init-from-hf --tp 4 --save-hf-at-end   (each rank reads only its slices)
   d. train_gpt --init-from-hf --dp-mode fsdp (dp 4) --save-hf-at-end (one unit gathered at a time)
3. Prints a markdown table (peak RssAnon of the fullest process, their sum, peak RssFile, GPU
   memory used per GPU) and writes it with the raw numbers to <work>/hf_memory.{md,json}.
Disk: about 16 (HF) + 32 (import) + 16 (export) + 2 x 16 (train_gpt exports) GB; --keep keeps
them, else they are removed as soon as they are measured.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import torch

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--build", required=True)
ap.add_argument("--work", required=True)
ap.add_argument("--gpus", type=int, default=4)
ap.add_argument("--seq-len", type=int, default=512, help="train_gpt's training length (default 512)")
ap.add_argument("--keep", action="store_true")
args = ap.parse_args()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(args.build)
WORK = os.path.abspath(args.work)
os.makedirs(WORK, exist_ok=True)
ENV = dict(os.environ, TESSERA_BUILD_DIR=BUILD, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
           NVSHMEM_DISABLE_NVLS="1")
GB = 1e9
# llama3-8b (src/models/config.cpp)
D, LAYERS, HEADS, KV, FFN, VOCAB = 4096, 32, 32, 8, 14336, 128256


def write_random_hf(path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D, "intermediate_size": FFN,
           "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV, "vocab_size": VOCAB,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 128000,
           "eos_token_id": 128001}
    os.makedirs(path, exist_ok=True)
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"), indent=2)
    hd = D // HEADS
    shapes = [("model.embed_tokens.weight", (VOCAB, D))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (D,)), (p + "self_attn.q_proj.weight", (D, D)),
                   (p + "self_attn.k_proj.weight", (KV * hd, D)), (p + "self_attn.v_proj.weight", (KV * hd, D)),
                   (p + "self_attn.o_proj.weight", (D, D)), (p + "post_attention_layernorm.weight", (D,)),
                   (p + "mlp.gate_proj.weight", (FFN, D)), (p + "mlp.up_proj.weight", (FFN, D)),
                   (p + "mlp.down_proj.weight", (D, FFN))]
    shapes += [("model.norm.weight", (D,)), ("lm_head.weight", (VOCAB, D))]
    files, cur, size = [], [], 0
    for name, s in shapes:
        b = 2 * int(torch.tensor(s).prod())
        if cur and size + b > 5e9:
            files.append(cur)
            cur, size = [], 0
        cur.append((name, s))
        size += b
    files.append(cur)
    weight_map = {}
    for k, group in enumerate(files):
        fname = f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, s in group:
            n = 2 * int(torch.tensor(s).prod())
            header[name] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        text = json.dumps(header).encode()
        text += b" " * (-(8 + len(text)) % 8)
        with open(os.path.join(path, fname), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for name, s in group:
                t = (torch.randn(s) * 0.02).to(torch.bfloat16) if len(s) == 2 else torch.ones(s, dtype=torch.bfloat16)
                f.write(t.view(torch.int16).numpy().tobytes())
        print(f"wrote {fname}", flush=True)
    json.dump({"metadata": {"total_size": sum(2 * int(torch.tensor(s).prod()) for _, s in shapes)},
               "weight_map": weight_map}, open(os.path.join(path, "model.safetensors.index.json"), "w"))


def tree(root):
    """pids of `root` and its descendants."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def status(pid):
    vals = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmHWM", "Name"):
                vals[k] = v.strip() if k == "Name" else int(v.split()[0]) * 1024
    except OSError:
        pass
    return vals


def measure(name, argv):
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=WORK, env=ENV, stdout=open(os.path.join(WORK, name + ".log"), "w"),
                            stderr=subprocess.STDOUT)
    peak = {"anon_max": 0, "anon_sum": 0, "file_max": 0, "hwm_max": 0, "gpu_mib": []}
    done = threading.Event()

    def sample():
        while not done.is_set():
            st = [status(p) for p in tree(proc.pid)]
            st = [s for s in st if s.get("Name") in ("train_gpt", "tessera_convert")]
            if st:
                peak["anon_max"] = max(peak["anon_max"], max(s.get("RssAnon", 0) for s in st))
                peak["anon_sum"] = max(peak["anon_sum"], sum(s.get("RssAnon", 0) for s in st))
                peak["file_max"] = max(peak["file_max"], max(s.get("RssFile", 0) for s in st))
                peak["hwm_max"] = max(peak["hwm_max"], max(s.get("VmHWM", 0) for s in st))
            try:
                used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=5).stdout.split()
                used = [int(u) for u in used]
                peak["gpu_mib"] = [max(a, b) for a, b in zip(peak["gpu_mib"] or [0] * len(used), used)]
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.2)

    th = threading.Thread(target=sample)
    th.start()
    rc = proc.wait()
    done.set()
    th.join()
    peak["seconds"] = time.time() - t0
    peak["rc"] = rc
    print(f"{name}: exit {rc}, {peak['seconds']:.0f} s, RssAnon max {peak['anon_max'] / GB:.2f} GB "
          f"(sum {peak['anon_sum'] / GB:.2f}), RssFile max {peak['file_max'] / GB:.2f} GB, GPU MiB {peak['gpu_mib']}",
          flush=True)
    if rc != 0:
        sys.exit(f"{name} failed: see {WORK}/{name}.log")
    return peak


def port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun(n, argv):
    return ["torchrun", "--standalone", f"--master_port={port()}", f"--nproc_per_node={n}", "--no_python"] + argv


def drop(*paths):
    if not args.keep:
        for p in paths:
            shutil.rmtree(p, ignore_errors=True)


hf, ck, out = (os.path.join(WORK, x) for x in ("hf8b", "ck8b", "out8b"))
if not os.path.exists(os.path.join(hf, "model.safetensors.index.json")):
    write_random_hf(hf)
convert = os.path.join(ROOT, "tools", "tessera-convert")
train = os.path.join(BUILD, "bin", "train_gpt")
common = ["--init-from-hf", hf, "--seq-len", str(args.seq_len), "--steps", "1", "--batch", str(args.gpus),
          "--log-jsonl", ""]
rows = {}
rows["import-hf"] = measure("import", [convert, "import-hf", hf, ck])
rows["export-hf (bf16)"] = measure("export", [convert, "export-hf", ck, out])
drop(ck, out)
rows[f"train_gpt --tp {args.gpus} --save-hf-at-end"] = measure(
    "train_tp", torchrun(args.gpus, [train, *common, "--tp", str(args.gpus), "--save-hf-at-end", out + "_tp"]))
drop(out + "_tp")
rows[f"train_gpt fsdp dp {args.gpus} --save-hf-at-end"] = measure(
    "train_fsdp", torchrun(args.gpus, [train, *common, "--dp-mode", "fsdp", "--save-hf-at-end", out + "_fsdp"]))
drop(out + "_fsdp")
md = ["| command (llama3-8b shapes) | s | RssAnon max / sum GB | RssFile max GB | GPU MiB used (per GPU) |",
      "| --- | --- | --- | --- | --- |"]
for k, r in rows.items():
    md.append(f"| {k} | {r['seconds']:.0f} | {r['anon_max'] / GB:.2f} / {r['anon_sum'] / GB:.2f} | "
              f"{r['file_max'] / GB:.2f} | {', '.join(map(str, r['gpu_mib']))} |")
text = "\n".join(md) + "\n"
print(text)
open(os.path.join(WORK, "hf_memory.md"), "w").write(text)
json.dump(rows, open(os.path.join(WORK, "hf_memory.json"), "w"), indent=2)
