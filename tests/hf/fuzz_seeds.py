#!/usr/bin/env python3
"""Seeds for tests/hf/fuzz_safetensors.cpp: valid safetensors files (raw inputs) and valid headers
in the structured form (u16 data size + JSON), plus a libFuzzer dictionary of the format's words.
usage: fuzz_seeds.py CORPUS_DIR DICT_FILE (run by tests/data/run_fuzz.sh for hf.fuzz)."""
import json
import os
import struct
import sys

out, dictfile = sys.argv[1], sys.argv[2]
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def header(tensors, metadata=None, pad=True):
    """(JSON text, data size) for tensors [(name, dtype, shape)] laid out in order."""
    h, at = {}, 0
    if metadata is not None:
        h["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(h).encode()
    if pad:
        text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return text, at


def raw(tensors, metadata=None, pad=True):
    text, size = header(tensors, metadata, pad)
    return struct.pack("<Q", len(text)) + text + bytes((7 * i + 3) % 256 for i in range(size))


def structured(tensors, metadata=None):
    text, size = header(tensors, metadata, pad=False)
    return struct.pack("<H", size) + text


cases = {
    "every_dtype": [("t." + d, d, [2, 3]) for d in SIZES],
    "llama_like": [("model.embed_tokens.weight", "BF16", [8, 4]), ("model.norm.weight", "BF16", [4]),
                   ("lm_head.weight", "F32", [8, 4])],
    "scalar_and_empty": [("s", "F32", []), ("e", "F16", [0, 3]), ("z", "I64", [0])],
    "one": [("w", "F32", [1])],
}
seeds = {}
for name, tensors in cases.items():
    seeds["raw_" + name] = raw(tensors, {"format": "pt"})
    seeds["raw_nopad_" + name] = raw(tensors, None, pad=False)
    seeds["json_" + name] = structured(tensors, {"format": "pt", "step": "1"})
seeds["raw_empty"] = raw([])
seeds["json_null_metadata"] = struct.pack("<H", 0) + b'{"__metadata__": null}'
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

words = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"format"', '"pt"', "null", "[]", "{}",
         "18446744073709551615", "9223372036854775807", "-1", "1e3", "0.5", '"\\u00e9"', '"\\ud800"']
words += ['"%s"' % d for d in SIZES] + ['"F8_E4M3"', '"U16"']
with open(dictfile, "w") as f:
    for i, w in enumerate(words):
        f.write('w%d="%s"\n' % (i, w.replace("\\", "\\\\").replace('"', '\\"')))
print("run_fuzz: wrote %d seeds" % len(seeds))
