"""Tests for tools/tessera-prep: byte layouts against an independent writer, inspect's validation,
end-to-end preparation of Brown corpus texts (exact round trips), and scripts/setup's outputs.

Run with Debian's interpreter: /usr/bin/python3 -m pytest -q tests/tools/test_prep.py. Needs
data/brown (or $TESSERA_DATA_DIR/brown) from scripts/setup.
"""
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "tessera-prep"
PYTHON = "/usr/bin/python3"
BROWN = Path(os.environ.get("TESSERA_DATA_DIR", REPO / "data")) / "brown"
SP4096 = BROWN / "brown_sp4096.model"
BROWN_DATASET = BROWN / "brown_sp4096_text_document"
SLICE = ["ca01", "cg22", "cj10", "cn29", "cr09"]  # press, belles lettres, learned, fiction, humor

sys.path.insert(0, str(REPO / "tools"))
from tessera_prep.formats import LlmcWriter, MegatronWriter  # noqa: E402


def brown():
    """data/brown, failing (not skipping) the test when scripts/setup has not prepared it."""
    for path in (BROWN / "PREPARED", BROWN / "text" / "ca01.txt", SP4096,
                 Path(f"{BROWN_DATASET}.bin"), Path(f"{BROWN_DATASET}.idx")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run scripts/setup (it prepares the Brown corpus)", pytrace=False)
    return BROWN


def prep(*args, ok=True):
    proc = subprocess.run([PYTHON, str(TOOL), *map(str, args)], capture_output=True)
    if ok:
        assert proc.returncode == 0, f"tessera-prep {args} failed:\n{proc.stderr.decode()}"
    return proc


def inspect(path, *extra):
    out = prep("inspect", path, *extra).stdout.decode()
    return dict(line.split(": ", 1) for line in out.splitlines())


# --- an independent writer, straight from the byte layouts ---------------------------------

def ref_megatron(prefix, docs, code, char):
    """Megatron .bin/.idx, one sequence per document; char is the struct code of a token."""
    n, size = len(docs), struct.calcsize("<" + char)
    lengths = [len(d) for d in docs]
    pointers = [sum(lengths[:i]) * size for i in range(n)]
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{char}", *d))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, n, n + 1))
        f.write(struct.pack(f"<{n}i", *lengths) + struct.pack(f"<{n}q", *pointers))
        f.write(struct.pack(f"<{n + 1}q", *range(n + 1)))


def ref_llmc(prefix, docs, shard_tokens, magic, version, char):
    flat = [t for d in docs for t in d]
    paths = []
    for k, start in enumerate(range(0, len(flat), shard_tokens)):
        shard = flat[start:start + shard_tokens]
        paths.append(f"{prefix}_{k:06d}.bin")
        with open(paths[-1], "wb") as f:
            f.write(struct.pack("<256i", magic, version, len(shard), *[0] * 253))
            f.write(struct.pack(f"<{len(shard)}{char}", *shard))
    return paths


DOCS16 = [[1, 2, 3], [300, 7], [65535, 0, 42, 9, 9], [5], [17, 18, 19, 20, 21, 22, 23]]
DOCS32 = [[70000, 1], [2**31 - 1, 0, 3], [12], [4, 5, 6, 7, 8, 9]]
LAYOUTS = {  # name: (documents, writer factory, reference writer)
    "megatron-uint16": (DOCS16, lambda p: MegatronWriter(p, "uint16"), lambda p, d: ref_megatron(p, d, 8, "H")),
    "megatron-int32": (DOCS32, lambda p: MegatronWriter(p, "int32"), lambda p, d: ref_megatron(p, d, 4, "i")),
    "llmc-uint16": (DOCS16, lambda p: LlmcWriter(p, "uint16", 4), lambda p, d: ref_llmc(p, d, 4, 20240520, 1, "H")),
    "llmc-uint32": (DOCS32, lambda p: LlmcWriter(p, "uint32", 5), lambda p, d: ref_llmc(p, d, 5, 20240801, 7, "I")),
}


def both(tmp_path, name):
    """Writes the layout with tessera-prep's writer (prefix 'prep') and the reference ('ref')."""
    docs, make, ref = LAYOUTS[name]
    with make(str(tmp_path / "prep")) as writer:
        for d in docs:
            writer.add_document(d)
        written = writer.finish()
    ref(str(tmp_path / "ref"), docs)
    return docs, [Path(p) for p in written]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_writer_matches_reference_bytes(tmp_path, name):
    _, written = both(tmp_path, name)
    refs = sorted(tmp_path.glob("ref*"))
    assert [p.name.replace("prep", "ref") for p in sorted(written)] == [p.name for p in refs]
    if name.startswith("llmc"):
        assert len(refs) > 2, "documents should have been split across shards"
    for mine, theirs in zip(sorted(written), refs):
        assert mine.read_bytes() == theirs.read_bytes(), f"{mine.name} differs from {theirs.name}"
    assert not list(tmp_path.glob("*.tmp*")), "temporary files left behind"


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_inspect_counts(tmp_path, name):
    docs, _ = both(tmp_path, name)
    flat = [t for d in docs for t in d]
    path = tmp_path / "ref" if name.startswith("megatron") else tmp_path / "ref_*.bin"
    info = inspect(path)
    assert info["format"] == name.split("-")[0]
    assert info["dtype"].split()[0] == name.split("-")[1]
    assert int(info["tokens"]) == len(flat)
    assert (int(info["min_id"]), int(info["max_id"])) == (min(flat), max(flat))
    if name.startswith("megatron"):
        assert (int(info["sequences"]), int(info["documents"]), int(info["document_indices"])) == \
            (len(docs), len(docs), len(docs) + 1)
        assert inspect(tmp_path / "ref.idx") == info  # either file names the dataset too
    else:
        assert int(info["shards"]) == len(list(tmp_path.glob("ref_*.bin")))


def _patch(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


S16 = len(DOCS16)
MEGATRON_CORRUPTIONS = {  # name: (how to damage ref.idx / ref.bin, the file named, words expected)
    "magic": (lambda d: _patch(d / "ref.idx", 0, b"XMIDIDX"), "ref.idx", "wrong magic"),
    "version": (lambda d: _patch(d / "ref.idx", 9, struct.pack("<Q", 2)), "ref.idx", "unknown version 2"),
    "dtype": (lambda d: _patch(d / "ref.idx", 17, b"\x06"), "ref.idx", "unsupported dtype code 6"),
    "dtype-unknown": (lambda d: _patch(d / "ref.idx", 17, b"\x0b"), "ref.idx", "unknown dtype code 11"),
    "truncated-idx": (lambda d: (d / "ref.idx").write_bytes((d / "ref.idx").read_bytes()[:-5]), "ref.idx", "truncated"),
    "truncated-bin": (lambda d: (d / "ref.bin").write_bytes((d / "ref.bin").read_bytes()[:-2]), "ref.bin", "truncated"),
    "pointer": (lambda d: _patch(d / "ref.idx", 34 + 4 * S16 + 8 * (S16 - 1), struct.pack("<q", 1 << 20)),
                "ref.idx", "beyond the end of"),
    "docs-start": (lambda d: _patch(d / "ref.idx", 34 + 12 * S16, struct.pack("<q", 1)), "ref.idx", "do not start at 0"),
    "docs-order": (lambda d: _patch(d / "ref.idx", 34 + 12 * S16 + 16, struct.pack("<q", 0)), "ref.idx", "decrease"),
    "docs-end": (lambda d: _patch(d / "ref.idx", 34 + 12 * S16 + 8 * S16, struct.pack("<q", S16 - 1)),
                 "ref.idx", f"not at S={S16}"),
}


def _fails(path, file_name, words, *extra):
    proc = prep("inspect", path, *extra, ok=False)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 2, f"inspect accepted a damaged dataset: {err}"
    assert len(err.splitlines()) == 1 and file_name in err and words in err, err


@pytest.mark.parametrize("name", sorted(MEGATRON_CORRUPTIONS))
def test_inspect_rejects_damaged_megatron(tmp_path, name):
    both(tmp_path, "megatron-uint16")
    damage, file_name, words = MEGATRON_CORRUPTIONS[name]
    damage(tmp_path)
    _fails(tmp_path / "ref", file_name, words)


LLMC_CORRUPTIONS = {
    "size": (lambda p: p.write_bytes(p.read_bytes() + b"\0\0"), "size mismatch"),
    "count": (lambda p: _patch(p, 8, struct.pack("<i", 3)), "size mismatch"),
    "version": (lambda p: _patch(p, 4, struct.pack("<i", 2)), "unknown version 2"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated"),
}


@pytest.mark.parametrize("name", sorted(LLMC_CORRUPTIONS))
def test_inspect_rejects_damaged_llmc(tmp_path, name):
    both(tmp_path, "llmc-uint16")
    shard = tmp_path / "ref_000001.bin"
    damage, words = LLMC_CORRUPTIONS[name]
    damage(shard)
    _fails(shard, "ref_000001.bin", words)
    _fails(tmp_path / "ref_*.bin", "ref_000001.bin", words)


def test_inspect_raw_tokens(tmp_path):
    raw = tmp_path / "train.bin"
    np.array([5, 1, 900, 7], dtype="<u2").tofile(raw)
    _fails(raw, "train.bin", "--dtype")
    info = inspect(raw, "--dtype", "uint16")
    assert (info["format"], info["tokens"], info["min_id"], info["max_id"]) == ("raw", "4", "1", "900")


# --- end to end on Brown texts ---------------------------------------------------------------

@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Five Brown texts copied into a directory: (directory, [text of each, in order])."""
    src = brown() / "text"
    d = tmp_path_factory.mktemp("brown_slice")
    for name in SLICE:
        shutil.copy(src / f"{name}.txt", d / f"{name}.txt")
    return d, [(d / f"{n}.txt").read_text(encoding="utf-8") for n in SLICE]


@pytest.fixture(scope="module")
def sp512(texts, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("sp512") / "sp512"
    prep("train-tokenizer", texts[0], "--vocab-size", 512, "--model-prefix", prefix)
    return Path(f"{prefix}.model")


def documents(prefix):
    """Each document's token ids, read straight from the .bin/.idx with numpy."""
    idx = Path(f"{prefix}.idx").read_bytes()
    code, s = idx[17], struct.unpack_from("<Q", idx, 18)[0]
    lengths = np.frombuffer(idx, "<i4", s, 34)
    tokens = np.fromfile(f"{prefix}.bin", {8: "<u2", 4: "<i4"}[code]).astype(np.int64)
    return np.split(tokens, np.cumsum(lengths)[:-1])


def test_byte_level_round_trip(texts, tmp_path):
    d, originals = texts
    prep("prepare", d, "--tokenizer", "byte", "--output", tmp_path / "b")
    docs = documents(tmp_path / "b")
    assert len(docs) == len(originals)
    for k, (ids, text) in enumerate(zip(docs, originals)):
        assert ids[-1] == 256 and bytes(ids[:-1].astype(np.uint8)) == text.encode("utf-8")
        assert prep("decode", tmp_path / "b", "--tokenizer", "byte", "--document", k).stdout.decode() == text


@pytest.mark.parametrize("model", ["sp512", "sp4096"])
def test_sentencepiece_round_trip(texts, sp512, tmp_path, model):
    import sentencepiece
    d, originals = texts
    path = sp512 if model == "sp512" else SP4096
    prep("prepare", d, "--tokenizer", path, "--output", tmp_path / "s", "--workers", 2)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    docs = documents(tmp_path / "s")
    assert len(docs) == len(originals) and max(int(ids.max()) for ids in docs) < sp.get_piece_size()
    for k, (ids, text) in enumerate(zip(docs, originals)):
        assert ids[-1] == sp.eos_id() and sp.decode(ids[:-1].tolist()) == text, f"document {k} differs"
        assert prep("decode", tmp_path / "s", "--tokenizer", path, "--document", k).stdout.decode() == text


def test_llmc_and_options_hold_the_same_tokens(texts, tmp_path):
    d, originals = texts
    prep("prepare", d, "--tokenizer", "byte", "--output", tmp_path / "m")
    expected = np.concatenate(documents(tmp_path / "m"))
    prep("prepare", d, "--tokenizer", "byte", "--output", tmp_path / "l", "--format", "llmc", "--shard-tokens", 20000)
    shards = sorted(tmp_path.glob("l_*.bin"))
    assert len(shards) == -(-expected.size // 20000)
    got = np.concatenate([np.fromfile(p, "<u2", offset=1024) for p in shards])
    assert np.array_equal(got, expected)
    assert inspect(tmp_path / "l_*.bin", "--eod", 256)["documents"].split()[0] == str(len(originals))
    assert prep("decode", tmp_path / "l_*.bin", "--tokenizer", "byte", "--document", 3).stdout.decode() == originals[3]
    prep("prepare", d, "--tokenizer", "byte", "--output", tmp_path / "w", "--dtype", "int32", "--no-eod")
    assert inspect(tmp_path / "w")["dtype"] == "int32 (code 4)"
    assert np.array_equal(np.concatenate(documents(tmp_path / "w")), expected[expected != 256])


def test_jsonl_gives_the_same_tokens(texts, tmp_path):
    d, originals = texts
    prep("prepare", d, "--tokenizer", SP4096, "--output", tmp_path / "t")
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(originals))
    (tmp_path / "docs.jsonl").write_text(lines)
    with gzip.open(tmp_path / "docs.jsonl.gz", "wt") as f:
        f.write(lines)
    for name in ("docs.jsonl", "docs.jsonl.gz"):
        prep("prepare", tmp_path / name, "--tokenizer", SP4096, "--output", tmp_path / "j")
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"j{ext}").read_bytes() == (tmp_path / f"t{ext}").read_bytes(), name


def test_jsonl_without_text_is_an_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    proc = prep("prepare", bad, "--tokenizer", "byte", "--output", tmp_path / "x", ok=False)
    assert proc.returncode == 2
    assert f"{bad}:2" in proc.stderr.decode() and '"text"' in proc.stderr.decode()
    assert not list(tmp_path.glob("x*")), "a failed prepare left files behind"


def test_directory_order_hidden_and_empty(tmp_path):
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    (root / ".git").mkdir()
    for rel, text in {"b.txt": "second", "a/c.txt": "first", "a/.hidden": "no", ".git/x": "no",
                      "a/empty.txt": ""}.items():
        (root / rel).write_text(text)
    proc = prep("prepare", root, "--tokenizer", "byte", "--output", tmp_path / "o")
    assert "2 documents, 1 skipped" in proc.stderr.decode()
    docs = [bytes(ids[:-1].astype(np.uint8)) for ids in documents(tmp_path / "o")]
    assert docs == [b"first", b"second"]


def test_train_tokenizer_is_deterministic(texts, sp512, tmp_path):
    prep("train-tokenizer", texts[0], "--vocab-size", 512, "--model-prefix", tmp_path / "again")
    assert (tmp_path / "again.model").read_bytes() == sp512.read_bytes()
    assert (tmp_path / "again.vocab").read_bytes() == sp512.with_suffix(".vocab").read_bytes()


# --- what scripts/setup left in data/brown ---------------------------------------------------

def test_setup_outputs():
    root = brown()
    assert len(list((root / "text").glob("c[a-r][0-9][0-9].txt"))) == 500
    stamp = (root / "PREPARED").read_text()
    assert re.search(r"tarball_sha256=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2", stamp)
    info = inspect(BROWN_DATASET)
    assert info["format"] == "megatron" and info["dtype"] == "uint16 (code 8)"
    assert (int(info["sequences"]), int(info["documents"]), int(info["document_indices"])) == (500, 500, 501)
    assert int(info["tokens"]) > 1_000_000 and 0 <= int(info["min_id"]) and int(info["max_id"]) < 4096
    for k, name in ((0, "ca01"), (499, "cr09")):
        text = (root / "text" / f"{name}.txt").read_text()
        assert prep("decode", BROWN_DATASET, "--tokenizer", SP4096, "--document", k).stdout.decode() == text


# --- Hugging Face tokenizer.json (npm's @huggingface/tokenizers under Node.js) --------------

def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def hf_tokenizer(path, eos=True):
    """A byte-level BPE tokenizer.json written by hand: the 256 byte symbols (ids 0-255 in byte
    order), merges t+h, th+e, Ġ+c, a+t (ids 256-259), and the special token <|end|> (id 260),
    the EOS of tokenizer_config.json."""
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "c"), ("a", "t")]
    for k, (a, b) in enumerate(merges):
        vocab[a + b] = 256 + k
    end = {"id": 260, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [end], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]}}
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps(tok))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"} if eos else {}))
    return path / "tokenizer.json"


def test_hf_tokenizer_json_bpe(tmp_path):
    tok = hf_tokenizer(tmp_path / "tok")
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the cat")
    (texts / "b.txt").write_text("théâtre <|end|> at\n")
    prep("prepare", texts, "--tokenizer", tok, "--output", tmp_path / "h", "--workers", 2)
    docs = documents(tmp_path / "h")
    # "the cat" -> "the" "Ġc" "at" by the merges, then the EOS (the special token's id) appended.
    assert docs[0].tolist() == [257, 258, 259, 260]
    # Non-ASCII bytes stay byte symbols; the special token in the text is one id.
    assert 260 in docs[1].tolist()[:-1] and docs[1][-1] == 260
    assert prep("decode", tmp_path / "h", "--tokenizer", tok, "--document", 0).stdout.decode() == "the cat"
    info = inspect(tmp_path / "h")
    assert info["documents"] == "2"


def test_hf_tokenizer_json_errors(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the cat")
    noeos = hf_tokenizer(tmp_path / "noeos", eos=False)
    err = prep("prepare", texts, "--tokenizer", noeos, "--output", tmp_path / "x", ok=False).stderr.decode()
    assert "names no end-of-document token" in err and "--no-eod" in err
    prep("prepare", texts, "--tokenizer", noeos, "--output", tmp_path / "y", "--no-eod")
    assert documents(tmp_path / "y")[0].tolist() == [257, 258, 259]
    bad = tmp_path / "bad" / "tokenizer.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    err = prep("prepare", texts, "--tokenizer", bad, "--output", tmp_path / "z", ok=False).stderr.decode()
    assert "tokenizer.json" in err and "error" in err
    err = prep("prepare", texts, "--tokenizer", tmp_path / "missing.json", "--output", tmp_path / "w",
               ok=False).stderr.decode()
    assert "no such tokenizer.json" in err
