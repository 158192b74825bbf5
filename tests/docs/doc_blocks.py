#!/usr/bin/env python3
"""The documentation's commands, run as written (issue 52): every command block of README.md,
docs/*.md (not docs/design/) and python/README.md runs on the CPU, each in a directory of its own
that looks like the repository root to it (scripts/, tools/, examples/, build/ -> the build tree,
data/brown/), and must exit 0 within the timeout. The block's words are
not changed: flags that shrink it are appended to its train_gpt / train_llama.py / tessera-prep
train-tokenizer / tessera-generate commands (blocks.py: 2 steps, the tiny model of the preset's
family, fp32, sequence 64, a 1000-token vocabulary, 4 new tokens) and the environment is set
around it (CPU and Gloo, OMP_NUM_THREADS=1, torchrun polling every 0.1 s, a free master port,
TESSERA_TIMEOUT_S=120; for Slurm blocks scripts/slurm-local is started and SLURM_CONF,
SLURM_OVERCOMMIT and SBATCH_OVERCOMMIT are set, as docs/multi-node.md tells a one-machine user; the
jobs a block submits must complete). Markers in the docs say what else a block needs or why it does not run here
(blocks.py lists them; fixtures.py the inputs a block can ask for).

  doc_blocks.py [--build DIR] [DOC[:LINE] ...]     the CPU blocks (what ctest -L docs runs)
  doc_blocks.py --gpu [--build DIR] [DOC ...]      the blocks marked gpu (scripts/gpu-test), each after
                                                   the blocks it continues (run on the CPU)
  doc_blocks.py --all ...                          both
  doc_blocks.py --list [DOC ...]                   every block, its kind and the script it would run

Each block is reported as DOC:LINE (its opening fence) with its time; a failure prints the script
as run and its output's last lines. Exit status: 1 when a block failed (or a marker is malformed),
77 when none failed but a block could not run on this machine (no root for Slurm, a launcher
missing), else 0. --work DIR keeps the blocks' directories there (default: a temporary folder,
removed); --timeout S per block (default 300).
"""
import argparse
import glob
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import blocks as B
from fixtures import MAKERS, Fixtures

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SLURM_WORDS = ("srun", "sbatch", "slurm-local")


def default_docs():
    docs = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
    return docs + ["python/README.md"]


def words(text):
    return set(text.replace("/", " ").replace("=", " ").split())


class Unrunnable(Exception):
    """The machine lacks what a block needs (not a failure of the docs)."""


class Runner:
    def __init__(self, args):
        self.args = args
        self.work = args.work or tempfile.mkdtemp(prefix="tessera-doc-blocks-")
        os.makedirs(self.work, exist_ok=True)
        self.fixtures = Fixtures(os.path.join(self.work, "fixtures"), args.build, self.env(cpu=True))
        self.slurm_conf, self.stop_slurm = None, False
        self.results = []  # (block, status, seconds, note)

    def env(self, cpu):
        e = dict(os.environ)
        e.update(TESSERA_BUILD_DIR=self.args.build, OMP_NUM_THREADS="1", PET_MONITOR_INTERVAL="0.1",
                 PET_MASTER_PORT=str(free_port()), TESSERA_TIMEOUT_S="120")
        if cpu:
            e.update(CUDA_VISIBLE_DEVICES="", TESSERA_BACKEND="gloo")
        return e

    def make_root(self, block):
        d = os.path.join(self.work, f"{block.doc.replace('/', '_')}-{block.line}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.join(d, "data"))
        for name in ("scripts", "tools", "examples", "bench"):
            os.symlink(os.path.join(REPO, name), os.path.join(d, name))
        os.symlink(self.args.build, os.path.join(d, "build"))
        os.symlink(os.path.join(REPO, "data", "brown"), os.path.join(d, "data", "brown"))
        return d

    def script(self, block, d, cpu):
        if "python" in block.markers:
            name = f"doc-{block.line}.py"
            with open(os.path.join(d, name), "w") as f:
                f.write(block.text)
            return (f"PYTHONPATH=build/python torchrun -r 1 -t 1 --standalone --nproc_per_node={block.ranks()} "
                    f"{name}\n")
        extra = block.arg_list("args")
        return "".join(B.shrink_line(line, extra, cpu) + "\n" for line in B.logical_lines(block))

    def check_machine(self, text):
        w = words(text)
        for tool in ("mpirun", "torchrun", "sbatch", "srun"):
            if tool in w and not shutil.which(tool):
                raise Unrunnable(f"{tool} is not installed here (scripts/setup installs it)")
        if "tessera-prep" in w and "tokenizer.json" in text and not shutil.which("node"):
            raise Unrunnable("tokenizer.json needs Node.js (scripts/setup installs it)")
        if w & set(SLURM_WORDS):
            self.slurm_up()

    def slurm_up(self):
        if self.slurm_conf:
            return
        if os.geteuid() != 0:
            raise Unrunnable("Slurm blocks need root (scripts/slurm-local)")
        local = os.path.join(REPO, "scripts", "slurm-local")
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if subprocess.run([local, "status"], **quiet).returncode != 0:  # not running: started here, stopped at the end
            r = subprocess.run([local, "start"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode in (3, 4):  # needs root; Slurm or munge not installed
                raise Unrunnable(f"scripts/slurm-local cannot start here: {r.stdout.strip()[-300:]}")
            if r.returncode != 0:
                raise RuntimeError(f"scripts/slurm-local start failed ({r.returncode}):\n{r.stdout[-1500:]}")
            self.stop_slurm = True
        out = subprocess.run([local, "env"], stdout=subprocess.PIPE, text=True).stdout
        self.slurm_conf = out.strip().split("=", 1)[1]

    def run(self, block, d, cpu):
        text = self.script(block, d, cpu)
        self.check_machine(text)
        env = self.env(cpu)
        if words(text) & set(SLURM_WORDS):
            env.update(SLURM_CONF=self.slurm_conf, SLURM_OVERCOMMIT="1", SBATCH_OVERCOMMIT="1")
        path = os.path.join(self.work, f"{os.path.basename(d)}.sh")
        with open(path, "w") as f:
            f.write("set -eo pipefail\n" + text)
        log = path[:-3] + ".log"
        t0, cpu0 = time.time(), cpu_seconds()
        with open(log, "w") as out:
            p = subprocess.Popen(["bash", path], cwd=d, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = p.wait(timeout=self.args.timeout)
            except subprocess.TimeoutExpired:
                rc = None
            end_group(p)
        output = open(log, errors="replace").read()
        jobs = [ln.split()[-1] for ln in output.split("\n") if ln.startswith("Submitted batch job ")]
        why = f"did not finish within {self.args.timeout} s" if rc is None else f"exit status {rc}"
        if rc == 0 and jobs:
            why = wait_jobs(jobs, env, t0 + self.args.timeout)
            rc = 1 if why else 0
        cancel_jobs(jobs, env)
        if rc == 0:
            return time.time() - t0, cpu_seconds() - cpu0
        tail = "\n".join(output.rstrip().split("\n")[-40:])
        jobs = "".join(f"--- {f}\n" + "\n".join(open(f, errors="replace").read().split("\n")[-20:])
                       for f in sorted(glob.glob(os.path.join(d, "*.out"))))
        raise RuntimeError(f"{why}\n--- the script, as run in {d}:\n{text}--- its output's last lines:\n{tail}\n{jobs}")

    def record(self, block, status, seconds=0.0, note=""):
        self.results.append((block, status, seconds, note))
        shown = f"{status} in {seconds:.1f} s" if status in ("ran", "FAILED") else status
        sep = " " if status == "ran" else ": "
        print(f"[docs] {block.where} {shown}{sep + note if note and status != 'FAILED' else ''}", flush=True)
        if status == "FAILED":
            print(note, flush=True)

    def finish(self):
        if self.stop_slurm:
            subprocess.run([os.path.join(REPO, "scripts", "slurm-local"), "stop"], stdout=subprocess.DEVNULL)
        if not self.args.work:
            shutil.rmtree(self.work, ignore_errors=True)


def cpu_seconds():
    """User + system time of the processes this one waited for (a block's launchers and ranks; not
    the Slurm jobs, which slurmd runs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def end_group(p):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        time.sleep(1 if sig == signal.SIGTERM else 0)
    p.wait()


def wait_jobs(ids, env, deadline):
    """Waits for the Slurm jobs a block submitted (`Submitted batch job N`): "" when each completed,
    else what became of the first that did not. Polled every 0.2 s (sbatch --wait's own polling adds
    up to 8 s to a job of 2)."""
    for job in ids:
        while True:
            out = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True).stdout
            state = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                break
            if time.time() > deadline:
                return f"Slurm job {job} did not end within the timeout ({state.get('JobState', out.strip())})"
            time.sleep(0.2)
        if state["JobState"] != "COMPLETED":
            return f"Slurm job {job}: {state['JobState']}, exit code {state.get('ExitCode')}"
    return ""


def cancel_jobs(ids, env):
    """The Slurm jobs a block submitted that might still run (it failed or timed out)."""
    if ids and shutil.which("scancel"):
        subprocess.run(["scancel", *ids], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, text=True).stdout
    except OSError:
        return 0
    return sum(1 for ln in out.split("\n") if ln.startswith("GPU "))


def plan(doc_blocks, mode, only, gpus):
    """The blocks to run, in order, as (block, on_cpu): the mode's own and, for a gpu block this
    machine has the GPUs for, the blocks it continues."""
    chosen = []
    for i, b in enumerate(doc_blocks):
        k = b.kind()
        want = (k in ("run", "python") and mode in ("cpu", "all")) or (k == "gpu" and mode in ("gpu", "all"))
        if not want or (only and b.line not in only) or (k == "gpu" and gpus < b.gpus()):
            continue
        chain, j = [b], i
        while "continues" in doc_blocks[j].markers and j > 0:
            j -= 1
            chain.insert(0, doc_blocks[j])
        for c in chain:
            if all(c is not x for x, _ in chosen):
                chosen.append((c, c.kind() != "gpu"))
    return sorted(chosen, key=lambda x: x[0].line)


def run_doc(r, doc, doc_blocks, mode, only):
    gpus = gpu_count() if mode != "cpu" else 0
    todo = plan(doc_blocks, mode, only, gpus)
    files, prev, unrunnable = {}, None, False
    for b in doc_blocks:
        k = b.kind()
        if k == "file":
            files[b.markers["file"][0]] = b.text
        if k == "gpu" and mode != "cpu" and gpus < b.gpus() and (not only or b.line in only):
            r.record(b, "not run", note=f"needs {b.gpus()} GPU(s), {gpus} here")
            continue
        if all(b is not x for x, _ in todo):
            if k in ("skip", "gpu", "fragment") and (not only or b.line in only) and mode != "gpu":
                note = {"skip": b.markers.get("skip", ("", ""))[1], "fragment": "python, not a program",
                        "gpu": f"{b.gpus()} GPU(s), for scripts/gpu-test ({b.markers.get('gpu', ('', ''))[1]})"}[k]
                r.record(b, k, note=note)
            continue
        cpu = next(c for x, c in todo if x is b)
        if "continues" in b.markers:
            if prev is None:
                r.record(b, "not run" if unrunnable else "FAILED", note="the block above it did not run")
                continue
            d = prev
        else:
            d = r.make_root(b)
        for name, text in files.items():
            if not os.path.exists(os.path.join(d, name)):
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
        t0 = time.time()
        try:
            for name in b.arg_list("needs"):
                r.fixtures.place(name, d)
            seconds, cpu_s = r.run(b, d, cpu)
            r.record(b, "ran", seconds, f"(CPU {cpu_s:.1f} s)")
            prev, unrunnable = d, False
        except Unrunnable as e:
            r.record(b, "not run", note=str(e))
            prev, unrunnable = None, True
        except Exception as e:  # noqa: BLE001 - any failure is the block's, reported with its output
            r.record(b, "FAILED", time.time() - t0, f"FAILED {b.where}: {e}")
            prev, unrunnable = None, False


def lint(all_blocks):
    """What the markers ask that cannot be: unknown fixtures, python N on another language, a first
    block that continues."""
    problems = []
    for doc, bs in all_blocks:
        for i, b in enumerate(bs):
            problems += [f"{b.where}: needs '{n}', which fixtures.py does not make (it makes: {', '.join(MAKERS)})"
                         for n in b.arg_list("needs") if n not in MAKERS]
            if "python" in b.markers and b.lang not in ("python", "py"):
                problems.append(f"{b.where}: 'doc-test: python N' on a {b.lang or 'plain'} block")
            if "continues" in b.markers and i == 0:
                problems.append(f"{b.where}: 'doc-test: continues', but no block is above it")
    return problems


def list_blocks(all_blocks):
    for doc, bs in all_blocks:
        for b in bs:
            k = b.kind()
            if k == "none":
                continue
            note = " ".join(f"{m}={a!r}" + (f" ({why})" if why else "") for m, (a, why) in b.markers.items())
            print(f"{b.where} {k} {note}")
            if k == "run":
                extra = b.arg_list("args")
                for line in B.logical_lines(b):
                    print("    " + B.shrink_line(line, extra, True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", nargs="*", help="DOC or DOC:LINE (default: README.md, docs/*.md, python/README.md)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="the build tree (default: build/)")
    ap.add_argument("--work", help="keep the blocks' directories, scripts and logs here (default: removed)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per block (default 300)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--gpu", action="store_const", dest="mode", const="gpu", help="the blocks marked gpu")
    mode.add_argument("--all", action="store_const", dest="mode", const="all", help="the CPU and the gpu blocks")
    mode.add_argument("--list", action="store_const", dest="mode", const="list", help="list, run nothing")
    a = ap.parse_args()
    a.build, mode = os.path.abspath(a.build), a.mode or "cpu"
    wanted = {}
    for spec in a.docs or default_docs():
        doc, _, line = spec.partition(":")
        wanted.setdefault(doc, set()).update({int(line)} if line else set())
    try:
        all_blocks = [(doc, B.read_blocks(os.path.join(REPO, doc), doc)) for doc in wanted]
    except (B.MarkerError, OSError) as e:
        sys.exit(f"[docs] {e}")
    problems = lint(all_blocks)
    if problems:
        sys.exit("\n".join(f"[docs] {p}" for p in problems))
    if mode == "list":
        list_blocks(all_blocks)
        return 0
    r, t0 = Runner(a), time.time()
    try:
        for doc, bs in all_blocks:
            run_doc(r, doc, bs, mode, wanted[doc])
    finally:
        r.finish()
    count = lambda s: sum(1 for x in r.results if x[1] == s)  # noqa: E731
    ran = sum(x[2] for x in r.results if x[1] == "ran")
    print(f"[docs] {count('ran')} block(s) ran ({ran:.1f} s of {time.time() - t0:.1f} s, CPU {cpu_seconds():.1f} s); "
          f"{count('FAILED')} failed; "
          f"{count('not run')} not run here; {count('gpu')} for the GPU runner; {count('skip')} skipped; "
          f"{count('fragment')} python fragments")
    for b, status, _, _ in r.results:
        if status == "FAILED":
            print(f"[docs] FAILED: {b.where}")
    return 1 if count("FAILED") else 77 if count("not run") else 0


if __name__ == "__main__":
    sys.exit(main())
