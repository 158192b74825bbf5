#!/usr/bin/env python3
"""tessera -> transformers for the Llama block's families, on the GPU machine (it has transformers;
our CPU machines do not):

  python3 tests/hf/gpu_families.py --build build-gpu [--work DIR]

For Qwen3, Mixtral, Qwen3-MoE and OLMoE: a tiny directory written by hf_families.py (an
independent writer) is imported (tessera-convert import-hf) and exported (export-hf, fp32);
tessera_generate continues a prompt greedily on the export and writes its step logits; each
transformers class loads the export (from_pretrained) and must give the same logits at those
positions (relative 1e-4) and the same argmax, on the CPU and, where there is one, on the GPU, in
float32 with eager attention. Prints one line per family and device; exits 1 when any failed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_families as F  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = [3, 17, 42, 5]


def tessera(build, work, family):
    """(export dir, tessera's greedy ids, its step logits [steps, vocab])."""
    env = dict(os.environ, TESSERA_BUILD_DIR=os.path.abspath(build))
    convert = os.path.join(SOURCE, "tools", "tessera-convert")
    ck, out, logits = (os.path.join(work, x, family) for x in ("ck", "out", "logits"))
    subprocess.run([convert, "import-hf", os.path.join(work, "in", family), ck], env=env, check=True,
                   capture_output=True)
    subprocess.run([convert, "export-hf", ck, out, "--dtype", "fp32"], env=env, check=True, capture_output=True)
    os.makedirs(os.path.dirname(logits), exist_ok=True)
    r = subprocess.run([os.path.join(build, "bin", "tessera_generate"), out, "--prompt-ids",
                        ",".join(map(str, PROMPT)), "--max-new-tokens", "6", "--logits-out", logits + ".safetensors"],
                       env=env, check=True, capture_output=True, text=True)
    ids = [int(x) for x in r.stdout.strip().splitlines()[-1].split("ids:")[1].split(",")]
    step_logits = next(iter(F.H.read_safetensors(logits + ".safetensors").values()))
    return out, ids, step_logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    work = a.work or tempfile.mkdtemp(prefix="tessera-gpu-families-")
    F.write(os.path.join(work, "in"))
    bad = 0
    for family in F.ARCH:
        out, ids, theirs = tessera(a.build, work, family)
        for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            m = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                logits = m.to(dev).eval()(torch.tensor([PROMPT + ids], device=dev)).logits[0].float().cpu()
            want = logits[len(PROMPT) - 1:len(PROMPT) - 1 + theirs.shape[0]]
            rel = ((want - theirs).abs().max() / theirs.abs().max()).item()
            ok = rel < 1e-4 and torch.equal(want.argmax(-1), theirs.argmax(-1))
            bad += not ok
            print(f"{'PASS' if ok else 'FAIL'} {family} {dev}: {type(m).__name__}, logits differ by {rel:.2e} "
                  f"(relative), greedy ids {ids}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
