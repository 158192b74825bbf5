"""tools/plot_run.py: the figure names its run and its series, and draws a decaying learning rate
on a log axis (issue 52: no title, legends named after the file, lr on a linear axis only); its
--help is the whole description with the defaults. The logs are written here, as train_gpt writes
them (a config record, step records, other events)."""
import json
import os
import subprocess
import sys

import pytest

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
sys.path.insert(0, TOOLS)
import plot_run  # noqa: E402

CONFIG = {"event": "config", "world": 4, "dp": 2, "pp": 1, "tp": 2, "dp_mode": "fsdp", "batch": 16, "seq_len": 64,
          "precision": "fp32", "params": 459328, "lr": "lr 0.003: warm-up over 2 steps, then cosine to 0 at step 10",
          "model": "llama d 64 layers 4 heads 4 kv heads 2 ffn 192 vocab 4096 T 64, rope positions"}


def write_log(path, lrs, config=True):
    with open(path, "w") as f:
        if config:
            f.write(json.dumps(CONFIG) + "\n")
        for s, lr in enumerate(lrs, 1):
            f.write(json.dumps({"event": "step", "step": s, "loss": 8.0 - 0.1 * s, "lr": lr, "tokens_per_s": 1000.0,
                                "valid_loss": 7.5 if s % 5 == 0 else None}) + "\n")
        f.write(json.dumps({"event": "summary", "steps": len(lrs)}) + "\n")
    return str(path)


def labels(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_one_run_is_named_in_the_title_and_its_series_in_the_legends(tmp_path):
    log = write_log(tmp_path / "train_gpt.jsonl", [3e-3 * min(1, s / 2) * (1 - s / 10) + 1e-6 for s in range(1, 11)])
    fig = plot_run.draw([(name, *plot_run.read(path)) for name, path in plot_run.runs_of([log])])
    title = fig._suptitle.get_text()
    assert title.startswith("train_gpt\n") and "llama d 64 layers 4" in title and "dp 2 x pp 1 x tp 2 (fsdp)" in title
    assert "batch 16 x T 64" in title and "cosine" in title and "0.5 M parameters" in title
    loss, lr, tput = fig.axes
    assert labels(loss) == ["training loss", "validation loss"]
    assert labels(lr) == ["learning rate"] and labels(tput) == ["tokens/s"]
    assert lr.get_yscale() == "log" and lr.get_title() == "learning rate (log scale)"


def test_runs_overlay_under_their_labels_and_a_constant_lr_stays_linear(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_log(tmp_path / "a" / "train_gpt.jsonl", [1e-3] * 6)
    b = write_log(tmp_path / "b" / "train_gpt.jsonl", [1e-3] * 6, config=False)
    c = write_log(tmp_path / "c.jsonl", [1e-3] * 6)
    runs = plot_run.runs_of([a, b, f"fsdp={c}"])
    assert [n for n, _ in runs] == ["a/train_gpt", "b/train_gpt", "fsdp"]
    fig = plot_run.draw([(name, *plot_run.read(path)) for name, path in runs])
    assert fig._suptitle.get_text() == "3 runs: a/train_gpt, b/train_gpt, fsdp"
    assert labels(fig.axes[0])[:2] == ["a/train_gpt: training loss", "a/train_gpt: validation loss"]
    assert labels(fig.axes[1]) == ["a/train_gpt", "b/train_gpt", "fsdp"]
    assert fig.axes[1].get_yscale() == "linear"
    assert plot_run.draw([(n, *plot_run.read(p)) for n, p in runs], lr_scale="log").axes[1].get_yscale() == "log"
    assert plot_run.draw([(n, *plot_run.read(p)) for n, p in runs], title="T")._suptitle.get_text() == "T"


def test_writes_the_png_and_refuses_a_log_without_steps(tmp_path, capsys):
    log = write_log(tmp_path / "run.jsonl", [1e-3, 5e-4])
    plot_run.main([log, "-o", str(tmp_path / "run.png"), "--smooth", "2"])
    assert (tmp_path / "run.png").stat().st_size > 10000
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "empty.jsonl").write_text(json.dumps(CONFIG) + "\n")
    with pytest.raises(SystemExit, match="no step records"):
        plot_run.main([str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "x.png")])


def test_help_is_the_whole_description_with_the_defaults():
    out = subprocess.run([sys.executable, os.path.join(TOOLS, "plot_run.py"), "--help"], stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    assert "one colour per run, so\nthat runs overlay." in out and "Needs\nmatplotlib" in out
    assert "(default 1: none)" in out and "default auto" in out
