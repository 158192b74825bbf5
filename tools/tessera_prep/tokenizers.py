"""Tokenizers: byte-level, SentencePiece and Hugging Face tokenizer.json, plus SentencePiece BPE
training.

`load("byte")` gives the byte tokenizer: a token per UTF-8 byte (id = byte value), EOD = 256,
BOS = 257, vocabulary 258. `load("x.model")` gives a SentencePiece model; its EOD is the model's
eos id. sentencepiece is imported only when a model is used or trained, so byte tokenization and
inspect work without it. `load("dir/tokenizer.json")` gives a Hugging Face tokenizer (BPE and the
other models the file format has) run by the npm package @huggingface/tokenizers under Node.js
(hf_tokenizer.mjs; no Debian package reads tokenizer.json, and PyPI's tokenizers is not reachable
from our machines); its EOD is tokenizer_config.json's eos_token (else config.json's
eos_token_id beside it), and documents are encoded with the tokenizer's special tokens (Llama 3:
<|begin_of_text|> first), as transformers encodes them.

Training settings make decode(encode(text)) == text exactly for any UTF-8 text that does not
itself contain U+2581 (SentencePiece's whitespace mark): no normalization, no whitespace
folding, no dummy prefix, byte fallback for unseen characters ("\n", "\t", non-ASCII), digits
split. Training is deterministic: sentences in input order, no shuffling, a fixed seed.
"""
import io
import os

import numpy as np

from . import PrepError


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise PrepError("SentencePiece tokenizers need the sentencepiece module "
                        "(Debian: apt-get install python3-sentencepiece; run scripts/setup)") from None
    return sentencepiece


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; 256 ends a document, 257 begins one."""

    name = "byte"
    vocab_size = 258
    eod = 256
    bos = 257

    def encode(self, text):
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode_bytes(self, ids):
        ids = np.asarray(ids)
        ids = ids[ids < 256]  # the specials carry no text
        return ids.astype(np.uint8).tobytes()


class SentencePieceTokenizer:
    """A trained SentencePiece model (.model file)."""

    def __init__(self, path):
        spm = _sentencepiece()
        if not os.path.isfile(path):
            raise PrepError(f"{path}: no such SentencePiece model")
        self.processor = spm.SentencePieceProcessor()
        try:
            self.processor.Load(path)
        except (OSError, RuntimeError) as e:
            raise PrepError(f"{path}: not a SentencePiece model ({e})") from None
        self.name = path
        self.vocab_size = self.processor.GetPieceSize()
        self.eod = self.processor.eos_id()
        self.bos = self.processor.bos_id()
        if self.eod < 0:
            raise PrepError(f"{path}: the model has no end-of-sentence piece (eos_id = -1) to end documents with")

    def encode(self, text):
        return np.asarray(self.processor.EncodeAsIds(text), dtype=np.int32)

    def decode_bytes(self, ids):
        specials = {self.eod, self.bos}
        ids = [int(i) for i in ids if int(i) not in specials]
        return self.processor.DecodeIds(ids).encode("utf-8")


class HfJsonTokenizer:
    """A Hugging Face tokenizer.json, encoded by hf_tokenizer.mjs in a Node.js process of its own
    (one per tessera-prep worker), one JSON line per request."""

    SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_tokenizer.mjs")
    PACKAGE = os.path.join(os.path.dirname(SCRIPT), "node_modules", "@huggingface", "tokenizers")

    def __init__(self, path):
        import shutil
        import subprocess
        if not os.path.isfile(path):
            raise PrepError(f"{path}: no such tokenizer.json")
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None or not os.path.isdir(self.PACKAGE):
            raise PrepError(f"--tokenizer {path}: Hugging Face tokenizer.json files are read by the npm package "
                            "@huggingface/tokenizers under Node.js" + (", which is not installed" if node is None else
                                                                        f", not installed in {os.path.dirname(self.PACKAGE)}")
                            + " (scripts/setup installs both)")
        self.name = path
        self._proc = subprocess.Popen([node, self.SCRIPT, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, encoding="utf-8", bufsize=1)
        info = self._ask({"info": True})
        self.vocab_size, self.eod, self.bos = info["vocab_size"], info["eos_id"], info["bos_id"]
        if self.eod < 0:
            self.eod = self._config_eos(path)

    @staticmethod
    def _config_eos(path):
        """config.json's eos_token_id beside the tokenizer (the first of a list), else -1."""
        import json
        cfg = os.path.join(os.path.dirname(path), "config.json")
        if not os.path.isfile(cfg):
            return -1
        eos = json.load(open(cfg)).get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) and eos else eos
        return eos if isinstance(eos, int) else -1

    def _ask(self, request):
        import json
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise PrepError(f"{self.name}: the Node.js tokenizer process ended (exit status {self._proc.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise PrepError(f"{self.name}: {answer['error']}")
        return answer

    def encode(self, text):
        return np.asarray(self._ask({"encode": text})["ids"], dtype=np.int32)

    def decode_bytes(self, ids):
        return self._ask({"decode": [int(i) for i in ids if int(i) not in (self.eod, self.bos)]})["text"].encode("utf-8")

    def __del__(self):
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=10)


def load(spec):
    """`byte`, the path of a SentencePiece .model, or of a Hugging Face tokenizer.json."""
    if spec == "byte":
        return ByteTokenizer()
    if spec.endswith(".json"):
        return HfJsonTokenizer(spec)
    if not spec.endswith(".model") and not os.path.isfile(spec):
        raise PrepError(f"--tokenizer {spec}: expected 'byte', a SentencePiece .model file or a Hugging Face "
                        "tokenizer.json")
    return SentencePieceTokenizer(spec)


def train(sentences, model_prefix, vocab_size, input_sentence_size=2_000_000, threads=1):
    """Trains a BPE model on an iterator of sentences (lines); writes PREFIX.model and PREFIX.vocab.

    Returns (sentences used, model size in bytes). The model is written through SentencePiece's
    model_writer, so no temporary text file is needed.
    """
    spm = _sentencepiece()
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(1)
    used = [0]

    def counted():
        for s in sentences:
            if used[0] >= input_sentence_size:
                return
            used[0] += 1
            yield s

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=counted(), model_writer=model,
            model_type="bpe", vocab_size=vocab_size,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=False, byte_fallback=True, character_coverage=1.0,
            split_digits=True, shuffle_input_sentence=False,
            input_sentence_size=input_sentence_size, max_sentence_length=1 << 16,
            num_threads=threads, minloglevel=2,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    except RuntimeError as e:
        raise PrepError(f"SentencePiece training failed: {str(e).strip()}") from None
    data = model.getvalue()
    _write_atomic(model_prefix + ".model", data)
    proc = spm.SentencePieceProcessor()
    proc.LoadFromSerializedProto(data)
    vocab = "".join(f"{proc.IdToPiece(i)}\t{proc.GetScore(i):g}\n" for i in range(proc.GetPieceSize()))
    _write_atomic(model_prefix + ".vocab", vocab.encode("utf-8"))
    return used[0], len(data)


def _write_atomic(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
