"""The inputs a documented command expects a reader to have, made small for tests/docs/doc_blocks.py.

A block asks for them with `<!-- doc-test: needs NAME ... -->`; each is made once per run under
the run's fixtures/ folder and copied into the block's directory (a block may change them: a
checkpoint it resumes, a corpus it prepares). The names are the paths the docs use:

  corpus/                60 Brown texts (data/brown/text), the "text files" of the quick starts
  Llama-3.2-1B/          a tiny Hugging Face Llama: config.json + model.safetensors written by
                         tests/hf/hf_llama.py (tied, vocabulary 512), a byte-level BPE tokenizer.json
                         and tokenizer_config.json (EOS <|end|>, id 256): what the HF quick start imports
  ckpt/                  a train_gpt checkpoint of llama-tiny after 2 steps on the Brown corpus
                         (vocabulary 4096: its SentencePiece model encodes the prompts)
  run.toml               a TOML file of train_gpt flags (tiny, pp 2, tp 2)
  web/ code/             Megatron datasets of 20 Brown texts each (byte tokens), for a blend
  fineweb_train_*.bin    llm.c shards of the same texts (byte tokens)
  train.bin              a raw uint16 token file of them
  prog                   a tessera program: build/examples/collectives_demo
"""
import json
import os
import shutil
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class Fixtures:
    def __init__(self, root, build, env):
        self.root, self.build, self.env = root, build, env
        os.makedirs(root, exist_ok=True)
        self.made = {}

    def names(self):
        return sorted(MAKERS)

    def place(self, name, into):
        """Copies fixture `name` (made on first use) into the directory `into`."""
        if name not in MAKERS:
            raise KeyError(f"unknown fixture '{name}' (known: {', '.join(sorted(MAKERS))})")
        src = self._made(name)
        for rel in src:
            a, b = os.path.join(self.root, name.strip("/").replace("*", "_"), rel), os.path.join(into, rel)
            os.makedirs(os.path.dirname(b) or ".", exist_ok=True)
            if os.path.islink(a):
                os.symlink(os.readlink(a), b)
            elif os.path.isdir(a):
                shutil.copytree(a, b, symlinks=True)
            else:
                shutil.copy2(a, b)

    def _made(self, name):
        if name not in self.made:
            where = os.path.join(self.root, name.strip("/").replace("*", "_"))
            shutil.rmtree(where, ignore_errors=True)
            os.makedirs(where)
            MAKERS[name](self, where)
            self.made[name] = sorted(os.listdir(where))
        return self.made[name]

    def run(self, argv, cwd, env=None):
        r = subprocess.run(argv, cwd=cwd, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"making a fixture: {' '.join(map(str, argv))} exited {r.returncode}:\n"
                               + "\n".join(r.stdout.splitlines()[-30:]))
        return r.stdout

    def texts(self, first, count):
        src = os.path.join(REPO, "data", "brown", "text")
        if not os.path.isdir(src):
            raise RuntimeError(f"{src} is missing: scripts/setup prepares data/brown")
        return [os.path.join(src, f) for f in sorted(os.listdir(src))[first:first + count]]

    def prep(self, cwd, *args):
        self.run([sys.executable, os.path.join(REPO, "tools", "tessera-prep"), *map(str, args), "--quiet"], cwd)


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def make_corpus(fx, where):
    os.makedirs(os.path.join(where, "corpus"))
    for t in fx.texts(0, 60):
        shutil.copy(t, os.path.join(where, "corpus"))


def byte_level_tokenizer(folder):
    """A byte-level BPE tokenizer.json without merges: the 256 byte symbols are ids 0-255 (GPT-2's
    byte -> character table), <|end|> is 256 and tokenizer_config.json's EOS."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    end = {"id": 256, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [end], "normalizer": None,
           "pre_tokenizer": level, "post_processor": None, "decoder": level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": {chars[b]: b for b in range(256)}, "merges": []}}
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|end|>"}, f)


def make_hf_llama(fx, where):
    sys.path.insert(0, os.path.join(REPO, "tests", "hf"))
    import hf_llama as H
    folder = os.path.join(where, "Llama-3.2-1B")
    c = H.config("tied", vocab_size=512, max_position_embeddings=128, bos_token_id=256, eos_token_id=256)
    H.write_model(folder, c, H.random_weights(c, seed=3), "F32")
    byte_level_tokenizer(folder)


def make_ckpt(fx, where):
    """One rank started as torchrun would (its variables), so no launcher is needed."""
    env = dict(fx.env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    fx.run([os.path.join(fx.build, "bin", "train_gpt"), "--model", "llama-tiny", "--steps", "2",
            "--data", os.path.join(REPO, "data", "brown", "brown_sp4096_text_document"), "--vocab-size", "4096",
            "--eod-token", "2", "--checkpoint-dir", "ckpt", "--log-jsonl", ""], where, env)


def make_run_toml(fx, where):
    with open(os.path.join(where, "run.toml"), "w") as f:
        f.write("# train_gpt's flags, one a line (rank 0 prints a run's whole resolved config in this form)\n"
                'model = "tiny"\npp = 2\ntp = 2\n')


def make_dataset(name, first):
    def make(fx, where):
        fx.prep(where, "prepare", *fx.texts(first, 20), "--tokenizer", "byte", "--output",
                f"{name}/{name}_text_document")
    return make


def make_shards(fx, where):
    fx.prep(where, "prepare", *fx.texts(140, 20), "--tokenizer", "byte", "--format", "llmc",
            "--output", "fineweb_train")


def make_raw(fx, where):
    import numpy as np
    ids = []
    for t in fx.texts(160, 20):
        with open(t, "rb") as f:
            ids.extend(f.read())
        ids.append(256)
    np.asarray(ids, dtype=np.uint16).tofile(os.path.join(where, "train.bin"))


def make_prog(fx, where):
    os.symlink(os.path.join(fx.build, "examples", "collectives_demo"), os.path.join(where, "prog"))


MAKERS = {"corpus/": make_corpus, "Llama-3.2-1B/": make_hf_llama, "ckpt/": make_ckpt, "run.toml": make_run_toml,
          "web/": make_dataset("web", 100), "code/": make_dataset("code", 120), "fineweb_train_*.bin": make_shards,
          "train.bin": make_raw, "prog": make_prog}
