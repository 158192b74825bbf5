#!/usr/bin/env python3
"""Command-level round trip between Hugging Face Llama directories and tessera, against an
independent reference (hf_llama.py: its own safetensors writer and a PyTorch forward written
with transformers' conventions). Real processes: tessera-convert, train_gpt and tessera_generate
under the launcher (mpirun or torchrun), Gloo on the CPU.

  roundtrip_test.py BUILD_DIR SOURCE_DIR LAUNCHER

1. Two tiny HF Llamas: GQA + untied head + llama3 rope scaling stored in bf16 over 3 files with
   an index; tied embeddings in float32 in one file.
2. import-hf, then train_gpt --checkpoint-dir (and --init-from-hf) in 1x1x1, 2x1x2, 1x2x2 and
   2x1x1 FSDP (and 1x1x4: kv heads replicated over tp): the loss of step 1 (before any update)
   equals the reference's on train_gpt's synthetic batch, within fp32 tolerance.
3. tessera_generate on the HF directory (1 rank) and on the imported checkpoint (tp 2): greedy
   ids equal the reference's argmax path, every step's logits the reference's; the same
   reference with interleaved (GPT-J) rotary pairs is far off (the test sees the convention).
4. train_gpt fine-tunes an import 3 steps in 2x1x2 (and FSDP, tp 4 over 2 kv heads, and pp 2
   with tied embeddings)
   with --save-hf-at-end (and --save-hf-every 2: step-2/): the live export is byte-identical to
   export-hf of its checkpoint, and
   the exported model's reference logits equal tessera's logits of the checkpoint.
5. export -> import -> export (bf16, sharded with an index) is byte-identical; tokenizer files
   travel along.
6. Bad inputs: each refused with the exit status and a message naming the field or tensor.
7. The MoE families (tiny Qwen3-MoE in dp 2 x tp 2, Mixtral in FSDP over 2, from hf_families.py):
   train_gpt --init-from-hf's step-1 loss as the reference's; the live export after 2 steps
   byte-identical to export-hf of the run's checkpoint (expert tensors gathered one at a time).
Prints "roundtrip: OK" and exits 0, or the first failure and exits 1."""
import filecmp
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_families as F  # noqa: E402
import hf_llama as H  # noqa: E402

BUILD, SOURCE, LAUNCHER = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
TRAIN = os.path.join(BUILD, "bin", "train_gpt")
GENERATE = os.path.join(BUILD, "bin", "tessera_generate")
CONVERT = os.path.join(SOURCE, "tools", "tessera-convert")
ENV = dict(os.environ, TESSERA_BACKEND="gloo", OMP_NUM_THREADS="1", TESSERA_TIMEOUT_S="60",
           TESSERA_BUILD_DIR=BUILD, PET_MONITOR_INTERVAL="0.1")
LOSS_TOL = 2e-5        # relative, the step-1 loss (fp32 sums over 128 tokens)
LOGIT_TOL = 2e-4       # absolute, logits of std ~2
LAYOUTS = [("1x1x1", []), ("2x1x2", []), ("1x2x2", []), ("2x1x1", ["--dp-mode", "fsdp"])]
WORK = tempfile.mkdtemp(prefix="tessera-hf-")


def fail(msg):
    print("roundtrip: FAIL:", msg)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def run(argv, n=1, expect=0, timeout=240):
    """argv on n ranks (under the launcher: train_gpt always, others for n > 1); the output; its
    exit status must be `expect`."""
    launched = n > 1 or argv[0] == TRAIN
    if launched and LAUNCHER == "mpirun":
        argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)] + argv
    elif launched:
        argv = ["torchrun", "-r", "1", "-t", "1", f"--master_port={free_port()}", f"--nproc_per_node={n}",
                "--no_python"] + argv
    p = subprocess.run(argv, cwd=WORK, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    ok = p.returncode == expect if expect is not None else p.returncode != 0
    if not ok:
        print(p.stdout[-6000:])
        fail(f"{' '.join(argv)}: exit status {p.returncode}, expected {expect}")
    return p.stdout


def path(*p):
    return os.path.join(WORK, *p)


def step1_loss(jsonl):
    import json
    for line in open(jsonl):
        r = json.loads(line)
        if r.get("event") == "step" and r["step"] == 1:
            return r["loss"]
    fail(f"{jsonl}: no step 1")


def ref_loss(c, w, batch, forward=H.forward):
    tokens, targets = H.synthetic_batch(1234, 0, batch, c["vocab_size"], c["max_position_embeddings"])
    logits = forward(c, w, tokens)
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))


def close(a, b, tol, what):
    err = float((a - b).abs().max())
    if err > tol:
        fail(f"{what}: max difference {err:.3g} > {tol:.3g}")
    return err


def train(ckpt, n, layout, extra, name, steps=1):
    log = path(name + ".jsonl")
    run([TRAIN, "--layout", layout, "--steps", str(steps), "--batch", "4", "--log-jsonl", log, *extra,
         *(["--checkpoint-dir", ckpt] if ckpt else [])], n=n)
    return step1_loss(log)


def generate_logits(model_dir, prompt, n_new, ranks):
    out = path("logits.safetensors")
    text = run([GENERATE, model_dir, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(n_new),
                "--logits-out", out], n=ranks)
    ids = [int(i) for i in [ln for ln in text.splitlines() if ln.startswith("ids: ")][0][5:].split(",")]
    logits = H.read_safetensors(out)["prompt.0"]
    return ids, logits


def ref_step_logits(c, w, prompt, ids, rope="half"):
    return torch.stack([H.forward(c, w, torch.tensor([prompt + ids[:k]]), rope)[0, -1] for k in range(len(ids))])


def main():
    models = {}
    for variant, dtype, shards in (("gqa_untied", "BF16", 3), ("tied", "F32", 1)):
        c = H.config(variant)
        stored = H.write_model(path("hf_" + variant), c, H.random_weights(c, seed=7), dtype, shards)
        models[variant] = (c, {n: torch.from_numpy(a) for n, a in stored.items()})
    with open(path("hf_gqa_untied", "tokenizer.json"), "w") as f:
        f.write('{"model": {"type": "BPE"}}\n')

    # 2. import, then every layout's first loss against the reference.
    for variant, (c, w) in models.items():
        run([CONVERT, "import-hf", path("hf_" + variant), path("ck_" + variant)])
        want = ref_loss(c, w, 4)
        # gqa: also tp 4 over its 2 kv heads (each kv head replicated on 2 ranks)
        for layout, flags in LAYOUTS + ([("1x1x4", [])] if variant == "gqa_untied" else []):
            n = eval(layout.replace("x", "*"))
            shutil.copytree(path("ck_" + variant), path("run"), dirs_exist_ok=False)
            got = train(path("run"), n, layout, flags, f"{variant}_{layout}")
            shutil.rmtree(path("run"))
            if abs(got - want) > LOSS_TOL * want:
                fail(f"{variant} {layout} {flags}: step-1 loss {got} vs the reference's {want}")
        layout, flags = ("1x2x2", []) if variant == "tied" else ("2x1x1", ["--dp-mode", "fsdp"])
        got = train(None, eval(layout.replace("x", "*")), layout, flags + ["--init-from-hf", path("hf_" + variant)],
                    f"{variant}_init")
        if abs(got - want) > LOSS_TOL * want:
            fail(f"{variant} --init-from-hf {layout}: step-1 loss {got} vs the reference's {want}")
        print(f"roundtrip: {variant}: step-1 loss {want:.6f} in every layout and from --init-from-hf")

    # 3. greedy generation and its logits, from the HF directory and from the checkpoint on tp 2.
    prompt = [5, 17, 42, 99]
    for variant, (c, w) in models.items():
        want_ids = H.greedy(c, w, prompt, 6)
        for model_dir, ranks in ((path("hf_" + variant), 1), (path("ck_" + variant), 2)):
            ids, logits = generate_logits(model_dir, prompt, 6, ranks)
            if ids != want_ids:
                fail(f"{variant} {model_dir} tp {ranks}: greedy ids {ids}, the reference's {want_ids}")
            err = close(logits, ref_step_logits(c, w, prompt, ids), LOGIT_TOL, f"{variant} tp {ranks} logits")
        wrong = float((logits - ref_step_logits(c, w, prompt, ids, "interleaved")).abs().max())
        if wrong < 100 * LOGIT_TOL:
            fail(f"{variant}: the interleaved-rotary reference is only {wrong} off: the test cannot see the layout")
        print(f"roundtrip: {variant}: greedy {ids} as the reference, logits within {err:.2g} "
              f"(interleaved rotary: {wrong:.2g} off)")

    # 4. fine-tune and export live vs offline; the exported model's logits.
    for variant, layout, flags in (("gqa_untied", "2x1x2", []), ("gqa_untied", "2x1x1", ["--dp-mode", "fsdp"]),
                                   ("gqa_untied", "1x1x4", []), ("tied", "1x2x2", [])):
        tag = f"{variant}_{layout}{'_fsdp' if flags else ''}"
        run_dir, live, offline = path("ft_" + tag), path("live_" + tag), path("off_" + tag)
        shutil.copytree(path("ck_" + variant), run_dir)
        every = ["--save-hf-every", "2", "--save-hf-dir", path("every_" + tag)]
        train(run_dir, eval(layout.replace("x", "*")), layout,
              flags + every + ["--lr", "1e-2", "--save-hf-at-end", live, "--save-hf-dtype", "fp32"], "ft_" + tag,
              steps=3)
        c_every, w_every = H.read_model(path("every_" + tag, "step-2"))
        if sorted(os.listdir(path("every_" + tag))) != ["step-2"] or sorted(w_every) != sorted(models[variant][1]):
            fail(f"{tag}: --save-hf-every 2 over 3 steps: {sorted(os.listdir(path('every_' + tag)))}")
        run([CONVERT, "export-hf", run_dir, offline, "--dtype", "fp32"])
        for f in sorted(os.listdir(offline)):
            if not filecmp.cmp(os.path.join(live, f), os.path.join(offline, f), shallow=False):
                fail(f"{tag}: {f} of the live export differs from export-hf's")
        c2, w2 = H.read_model(offline)
        if w2["model.norm.weight"].equal(models[variant][1]["model.norm.weight"]):
            fail(f"{tag}: the fine-tuned model equals the imported one (no training?)")
        ids, logits = generate_logits(run_dir, prompt, 4, 1)
        err = close(logits, ref_step_logits(c2, w2, prompt, ids), LOGIT_TOL, f"{tag}: exported model's logits")
        print(f"roundtrip: {tag}: live export = export-hf, byte for byte; exported logits within {err:.2g}")
    if not os.path.exists(path("off_gqa_untied_2x1x2", "tokenizer.json")):
        fail("export-hf did not copy the imported model's tokenizer.json")

    # 5. export -> import -> export, bf16, sharded with an index.
    a, b = path("bf_a"), path("bf_b")
    run([CONVERT, "export-hf", path("ft_gqa_untied_2x1x2"), a, "--max-shard-bytes", "40000"])
    run([CONVERT, "import-hf", a, path("ck_again")])
    run([CONVERT, "export-hf", path("ck_again"), b, "--max-shard-bytes", "40000"])
    files = sorted(os.listdir(a))
    if "model.safetensors.index.json" not in files or files != sorted(os.listdir(b)):
        fail(f"sharded exports: {files} vs {sorted(os.listdir(b))}")
    for f in files:
        if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False):
            fail(f"export -> import -> export: {f} differs")
    print(f"roundtrip: export -> import -> export byte-identical ({len(files)} files)")

    # 6. bad inputs.
    c = H.config("tied")
    w = H.random_weights(c)
    bad = [(dict(attention_bias=True), {}, "attention_bias"), (dict(mlp_bias=True), {}, "mlp_bias"),
           (dict(hidden_act="gelu"), {}, "hidden_act is 'gelu'"),
           (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), {}, "rope_type is 'yarn'"),
           (dict(head_dim=32), {}, "self_attn.k_proj.weight' has shape [64, 64], the config gives [128, 64]"),
           (dict(kv_lora_rank=512), {}, "kv_lora_rank is set: multi-head latent attention"),
           ({}, dict(drop="model.layers.1.mlp.up_proj.weight"), "1 missing: model.layers.1.mlp.up_proj.weight"),
           ({}, dict(bias=True), "q_proj.bias' (a bias"),
           ({}, dict(shape=True), "has shape [64, 32], the config gives [64, 64]")]
    for k, (over, tensors, want) in enumerate(bad):
        d = path(f"bad{k}")
        ww = dict(w)
        extra = [("model.layers.0.self_attn.q_proj.bias", torch.zeros(64).numpy())] if tensors.get("bias") else []
        ww.pop(tensors.get("drop", ""), None)
        if tensors.get("shape"):
            ww["model.layers.0.self_attn.q_proj.weight"] = ww["model.layers.0.self_attn.q_proj.weight"][:, :32]
        H.write_model(d, H.config("tied", **over), ww, "F32", 1, extra)
        out = run([CONVERT, "import-hf", d, path(f"bad_ck{k}")], expect=1)
        if want not in out:
            fail(f"import-hf of a bad model ({want}): {out[-500:]}")
        out = run([GENERATE, d, "--prompt-ids", "1,2"], expect=1)
        if want not in out:
            fail(f"tessera_generate of a bad model ({want}): {out[-500:]}")
    gpt = path("gpt_ck")
    run([TRAIN, "--steps", "1", "--checkpoint-dir", gpt, "--log-jsonl", ""])
    for argv, rc, want in (([CONVERT, "export-hf", gpt, path("x")], 1, "only the Llama"),
                           ([CONVERT, "export-hf", path("ck_tied"), path("x"), "--dtype", "fp16"], 2, "--dtype"),
                           ([CONVERT, "import-hf", path("hf_tied")], 2, "takes two directories"),
                           ([CONVERT, "convert", "a", "b"], 2, "unknown command"),
                           ([CONVERT, "import-hf", path("nothing"), path("y")], 1, "nothing"),
                           # issue 52: never over a checkpoint (it replaced it, config and all)
                           ([CONVERT, "import-hf", path("hf_tied"), path("ck_gqa_untied")], 1,
                            "already holds a checkpoint"),
                           ([TRAIN, "--model", "llama-tiny", "--init-from-hf", path("hf_tied"), "--steps", "1"], 1,
                            "of another model"),
                           ([TRAIN, "--save-hf-every", "2", "--steps", "1", "--model", "llama-tiny"], 2,
                            "--save-hf-dir"),
                           ([TRAIN, "--model", "moe-tiny", "--save-hf-at-end", path("x"), "--steps", "1"], 2,
                            "moe.sharedFfn is 64 (shared experts)")):
        out = run(argv, expect=rc)
        if want not in out:
            fail(f"{' '.join(argv)}: the message lacks '{want}': {out[-500:]}")
    print(f"roundtrip: {len(bad) + 8} bad inputs refused, each naming what is wrong")
    families()
    shutil.rmtree(WORK)
    print("roundtrip: OK")


def families():
    """7. The MoE families through train_gpt: --init-from-hf's step-1 loss, the live export."""
    F.write(path("fam"))
    for fam, layout, flags in (("qwen3_moe", "2x1x2", []), ("mixtral", "2x1x1", ["--dp-mode", "fsdp"])):
        c, w = H.read_model(path("fam", fam))
        run_dir, live, offline = path("famck_" + fam), path("famlive_" + fam), path("famoff_" + fam)
        got = train(run_dir, eval(layout.replace("x", "*")), layout, flags + [
            "--init-from-hf", path("fam", fam), "--lr", "1e-2", "--save-hf-at-end", live, "--save-hf-dtype", "fp32"],
            "fam_" + fam, steps=2)
        want = ref_loss(c, w, 4, F.forward)
        if abs(got - want) > LOSS_TOL * want:
            fail(f"{fam} {layout}: step-1 loss {got}, the reference's {want}")
        run([CONVERT, "export-hf", run_dir, offline, "--dtype", "fp32"])
        for f in sorted(os.listdir(offline)):
            if not filecmp.cmp(os.path.join(live, f), os.path.join(offline, f), shallow=False):
                fail(f"{fam}: {f} of the live export differs from export-hf's")
        if H.read_model(offline)[1]["model.norm.weight"].equal(w["model.norm.weight"]):
            fail(f"{fam}: the fine-tuned model equals the imported one (no training?)")
        print(f"roundtrip: {fam} {layout}{' fsdp' if flags else ''}: step-1 loss {got:.6f} as the reference; "
              f"live export = export-hf, byte for byte")


if __name__ == "__main__":
    main()
