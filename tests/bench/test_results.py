"""bench/results and its writer (bench/results.py): the committed files validate against the row schema, name no
hardware, stay within 30 and docs/performance.md is what the generator writes from them; the writer keeps the
latest run of each (run, machine) pair, scales rows within a run, folds bench/cp's logs and train_gpt's JSONL
logs into schema rows."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import results  # noqa: E402
from results_lib import page, schema, suite  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
DOC = os.path.join(ROOT, "docs", "performance.md")


def test_committed_results_and_page():
    problems = page.check(RESULTS, DOC)
    assert not problems, "\n".join(problems + ["(bench/results.py render, then bench/results.py docs)"])


def test_hardware_in_names():
    for bad in ("scale_4gpu_llama3_8b", "fp8_cast_bench_h100", "cp_2gpu_h200", "fp8_loss_cpu_llama_tiny",
                "llama_1gpu", "nvidia_h200", "run.4-gpus"):
        assert schema.HARDWARE_NAME.search(bad), bad
    for good in ("single_gpu", "gpt735m", "llama_curves.llama3-1b", "fp8.loss-cublaslt", "hf_memory", "scale"):
        assert not schema.HARDWARE_NAME.search(good), good
    assert schema.RENTED_KIND.search("on nvidia-z100-x3") and not schema.RENTED_KIND.search("4 x NVIDIA H200")


def row(system, gpus, tps, ms=100.0, **kw):
    return dict(system=system, gpus=gpus, tokens_per_s=tps, step_ms=ms, **kw)


def test_put_run_keeps_the_latest_run_of_each_name_and_machine(tmp_path):
    d = str(tmp_path)
    base = dict(run="r", title="t", command="c", rows=[row("tessera-single", 1, 2048.0, 1000.0, mfu=0.5)])
    defaults = dict(model="llama3-1b", seq_len=2048, precision="bf16")
    suite.put_run(d, "scale", dict(base, machine="1 x A", date="d1"), defaults)
    suite.put_run(d, "scale", dict(base, machine="1 x B", date="d2"), defaults)
    md, problems = suite.put_run(d, "scale", dict(base, machine="1 x A", date="d3"), defaults)
    doc = json.load(open(os.path.join(d, "scale.json")))
    assert [(r["machine"], r["date"]) for r in doc["runs"]] == [("1 x A", "d3"), ("1 x B", "d2")]
    r = doc["runs"][0]["rows"][0]
    assert list(r)[:len(schema.FIELDS)] == list(schema.FIELDS) and not problems
    assert (r["layout"], r["global_batch"], r["tokens_per_s_per_gpu"], r["machine"]) == ("single", 1, 2048, "1 x A")
    assert r["flop_convention"] == schema.FLOP_CONVENTIONS["llama"] and "| tessera-single |" in md
    assert open(os.path.join(d, "scale.md")).read() == suite.render(doc)
    _, problems = suite.put_run(d, "scale", dict(base, run="bad", machine="1 x A"), {})
    assert any("without model" in p for p in problems), problems


def write_log(path, *objs):
    with open(path, "w") as f:
        f.write("".join("noise\nRESULT %s\n" % json.dumps(o) for o in objs))


def test_gpt_command(tmp_path):
    logs, out = tmp_path / "logs", str(tmp_path / "out")
    logs.mkdir()
    write_log(logs / "pytorch-single.log", dict(mode="single", world=1, batch=4, seq_len=64, step_ms=10.0,
                                                tokens_per_s=25600, peak_mem_GiB=1.0, mfu_vs_989=0.1))
    write_log(logs / "pytorch-ddp.log", dict(mode="ddp", world=2, batch=8, seq_len=64, step_ms=11.0,
                                             tokens_per_s=46545, peak_mem_GiB=1.1))
    write_log(logs / "tessera-train-ddp.log", dict(system="x", mode="2x1x1 ddp", gpus=2, batch=8, seq_len=64,
                                                   step_ms=10.0, tokens_per_s=51200, peak_mem_gib=1.0))
    rc = results.main(["gpt", *sorted(str(p) for p in logs.iterdir()), "--suite", "scale", "--run", "tiny",
                       "--results", out, "--machine", "2 x NVIDIA H200", "--command", "c", "--model", "llama-tiny",
                       "--precision", "fp32", "--reference", "pytorch=pytorch-single", "--vs-pytorch",
                       "tessera-train-", "--expect", "tessera-train-single"])
    run = json.load(open(os.path.join(out, "scale.json")))["runs"][0]
    rows = {r["system"]: r for r in run["rows"]}
    assert rc == 0 and run["missing"] == ["tessera-train-single"]
    assert rows["pytorch-ddp"]["scaling"] == round(46545 / (2 * 25600), 3) and rows["pytorch-single"]["mfu"] == 0.1
    assert rows["tessera-train-ddp"]["vs_pytorch"] == round(51200 / 46545, 3)
    assert (rows["pytorch-ddp"]["layout"], rows["pytorch-ddp"]["global_batch"]) == ("ddp 2", 8)
    assert rows["tessera-train-ddp"]["tokens_per_s_per_gpu"] == 25600


def test_from_jsonl_and_cp(tmp_path, capsys):
    jsonl = tmp_path / "tessera-llama-tiny-64-cp2.jsonl"
    cfg = dict(event="config", world=2, dp=1, pp=1, tp=1, dp_mode="fsdp", micro_batches=1, schedule="1f1b",
               sequence_parallel=False, seq_len=64, batch=1, precision="fp32", params=1e6, recompute="none")
    steps = [dict(event="step", step=i, step_ms=10.0 + i, loss=8.0, mfu=0.1, peak_mem_gib=1.0, bubble_ms_est=0,
                  dp_sync_ms_est=None, optimizer_ms=1.0) for i in range(1, 6)]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [cfg] + steps))
    assert results.main(["from-jsonl", str(jsonl), "tessera-x", "3"]) == 0
    got = json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])
    assert (got["seq_len"], got["step_ms"], got["tokens_per_s"]) == (64, 15.0, round(64 / 15.0 * 1e3))
    meta = dict(warm=3, steps=2, rc="0", seconds=5, limit=60, dp=1, cp=2, tp=1, seq_len=64)
    (tmp_path / "tessera-llama-tiny-64-cp2.log").write_text("CP_RUN %s\n" % json.dumps(meta))
    (tmp_path / "pytorch-llama-tiny-64-cp2.log").write_text("CP_RUN %s\n" % json.dumps(dict(meta, rc="1")) +
                                                            "torch_cp.py: FAILED on rank 0: boom\n")
    out = str(tmp_path / "out")
    assert results.main(["cp", str(tmp_path), "--results", out, "--machine", "2 x NVIDIA H200", "--command", "c"]) == 0
    run = json.load(open(os.path.join(out, "cp.json")))["runs"][0]
    (r,) = run["rows"]
    assert (run["run"], r["layout"], r["gpus"], r["seq_len"], r["global_batch"]) == ("cp2", "cp 2", 2, 64, 1)
    assert r["mfu"] >= r["mfu_causal"] >= 0 and r["flop_convention"] and run["missing"][0]["reason"] == "rank 0: boom"


def test_generator_is_deterministic():
    assert page.page(RESULTS) == page.page(RESULTS)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "results.py"), "docs", "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
