"""bench/moe/file.py on made-up logs: train_gpt's JSONL rows (warm-ups left out, the median step, the fullest
peak), the anchor's RESULT lines, tessera over the anchor of the same routing only, the model the logs name
(OLMoE or the Qwen3-30B-A3B cut) in the run's title, config and notes, and a failed check failing the filing."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FILE = os.path.join(ROOT, "bench", "moe", "file.py")


def tessera_log(path, gpus, layers, step_ms, peak, load):
    """A train_gpt JSONL log: its config, then one step per entry of step_ms (the first three are warm-ups)."""
    with open(path, "w") as f:
        f.write(json.dumps(dict(event="config", world=gpus, batch=gpus, seq_len=4096, layers=layers,
                                params=1_000_000_000)) + "\n")
        for i, ms in enumerate(step_ms):
            f.write(json.dumps(dict(event="step", step=i + 1, loss=10.0 - i * 0.1, step_ms=ms, mfu=0.1 * 100.0 / ms,
                                    peak_mem_gib=peak + (0.5 if i == 1 else 0.0),
                                    moe_load_max_over_mean=load)) + "\n")


def anchor_log(path, system, gpus, real_ms, balanced_ms, peak):
    with open(path, "w") as f:
        for routing, ms in (("real", real_ms), ("balanced", balanced_ms)):
            name = system + ("-balanced" if routing == "balanced" else "")
            f.write("RESULT " + json.dumps(dict(system=name, gpus=gpus, ep=gpus, routing=routing, batch=gpus,
                                                seq_len=4096, step_ms=ms, tokens_per_s=round(gpus * 4096 / ms * 1e3),
                                                mfu=0.1, peak_mem_gib=peak, load_max_over_mean=1.0)) + "\n")


def file_run(tmp_path, settings, check=None):
    logs, results = tmp_path / "logs", tmp_path / "results"
    logs.mkdir()
    results.mkdir()
    (logs / "settings.txt").write_text(settings + "\n")
    (logs / "date.txt").write_text("2026-11-29 13:38 UTC\n")
    # warm-ups 900 ms, then 210 200 190 220 (median, upper: 210); the anchor at 300 (real) and 400 (balanced)
    tessera_log(logs / "tessera-ep4-fsdp.jsonl", 4, 24, [900, 900, 900, 210, 200, 190, 220], 30.0, 8.0)
    tessera_log(logs / "tessera-ep4-fsdp-balanced.jsonl", 4, 24, [900, 900, 900, 200, 200, 200], 28.0, 1.0)
    anchor_log(logs / "pytorch-ep4-fsdp.log", "pytorch-ep4-fsdp", 4, 300.0, 400.0, 40.0)
    if check is not None:
        (logs / "check.json").write_text(json.dumps(check))
    p = subprocess.run([sys.executable, FILE, str(logs), "--results", str(results), "--machine", "4 x NVIDIA H200",
                        "--command", "bench/moe/run.sh build-gpu LOGS"], capture_output=True, text=True)
    doc = json.loads((results / "moe.json").read_text()) if (results / "moe.json").exists() else None
    return p, doc


def test_rows_ratios_and_model(tmp_path):
    p, doc = file_run(tmp_path, "MODEL=qwen3-30b-a3b LAYERS=24 QK_NORM=per-head STEPS=12 NPROC=4")
    assert p.returncode == 0, p.stderr
    run = doc["runs"][0]
    assert run["run"] == "qwen3-30b-a3b"
    assert run["title"].startswith("Qwen3-30B-A3B shape (24 of 48 blocks) expert parallel over 4 GPUs")
    assert "128 experts top 8 of FFN 768" in run["config"] and "32 heads of 128" in run["config"]
    assert any("Qwen3's" in n for n in run["notes"]) and any("No correctness check" in n for n in run["notes"])
    rows = {r["system"]: r for r in run["rows"]}
    real, bal = rows["tessera-ep4-fsdp"], rows["tessera-ep4-fsdp-balanced"]
    assert real["step_ms"] == 210 and real["peak_mem_gib"] == 30.5 and real["layout"] == "ep 4 + fsdp 4"
    assert real["tokens_per_s"] == round(4 * 4096 / 210 * 1e3)
    # each against the anchor's row of its own routing: 300 ms real, 400 ms balanced
    assert abs(real["vs_pytorch"] - round(real["tokens_per_s"] / rows["pytorch-ep4-fsdp"]["tokens_per_s"], 3)) < 1e-9
    assert abs(real["vs_pytorch"] - 300 / 210) < 0.01 and abs(bal["vs_pytorch"] - 400 / 200) < 0.01
    assert real["mem_vs_pytorch"] == round(30.5 / 40.0, 3) and real["load_max_over_mean"] == 8.0


def test_olmoe_default_and_a_failed_check(tmp_path):
    check = dict(backend="NCCL, 2 GPUs", tolerance=1e-4, passed=False, losses={"check-ep1": [1.0], "check-ep2-ddp": [1.1]},
                 max_rel={"check-ep2-ddp": 0.1})
    p, doc = file_run(tmp_path, "LAYERS=16 QK_NORM=whole STEPS=12 NPROC=4", check)
    assert p.returncode == 1  # filed, but the filing fails with the check
    run = doc["runs"][0]
    assert run["run"] == "olmoe-1b-7b"
    assert run["title"].startswith("OLMoE-1B-7B shape expert parallel over 4 GPUs")
    assert "FAILED" in run["tables"][0]["title"]
