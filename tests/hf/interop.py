#!/usr/bin/env python3
"""An independent safetensors writer and reader (json, struct and numpy only: no safetensors
package, no torch), for test_hf's interop test.

  interop.py write FILE   writes one tensor of every dtype (values: the pattern of
                          tests/hf/hf_testing.h), F16 first and the header unpadded, so that
                          some tensors lie misaligned in the file
  interop.py check PATH   reads a checkpoint tessera wrote (a directory with
                          model.safetensors.index.json or model.safetensors) and checks the
                          layout (header padded to 8, tensors tiling the data, the index's
                          weight_map and total_size) and every value against the pattern
Prints "interop: OK ..." and exits 0, or prints the problem and exits 1."""
import json
import os
import struct
import sys

import numpy as np

# safetensors dtype -> (numpy dtype of the stored bits, element size)
DTYPES = {
    "F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
    "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
    "U8": (np.uint8, 1), "BOOL": (np.bool_, 1),
}


def pattern(name, dtype, numel):
    """The values of hf_testing.h's pattern(), as float64 (bool and integers exactly)."""
    k = (np.arange(numel, dtype=np.int64) * 7 + len(name) % 11) % 11
    if dtype in ("F64", "F32", "F16", "BF16"):
        return (k - 5) / 2.0
    if dtype == "U8":
        return k.astype(np.float64)
    if dtype == "BOOL":
        return (k % 2).astype(np.float64)
    return (k - 5).astype(np.float64)


def encode(dtype, values):
    if dtype == "BF16":  # the top half of the float32 bits: exact for these values
        return (values.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return values.astype(np.dtype(DTYPES[dtype][0]).newbyteorder("<")).tobytes()


def decode(dtype, raw):
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4").astype(np.float64)
    return np.frombuffer(raw, np.dtype(DTYPES[dtype][0]).newbyteorder("<")).astype(np.float64)


def write(path):
    tensors = [("h.F16", "F16", [3]), ("w.F32", "F32", [2, 3]), ("b.BF16", "BF16", [2, 2]),
               ("x.F64", "F64", [3]), ("i.I64", "I64", [2]), ("j.I32", "I32", [3]), ("k.I16", "I16", [1]),
               ("c.I8", "I8", [5]), ("u.U8", "U8", [4]), ("m.BOOL", "BOOL", [3]), ("s.F32", "F32", []),
               ("e.F32", "F32", [0, 4])]
    header, data = {"__metadata__": {"format": "pt", "writer": "interop.py"}}, b""
    for name, dtype, shape in tensors:
        blob = encode(dtype, pattern(name, dtype, int(np.prod(shape, dtype=np.int64))))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    print("interop: OK wrote %d tensors to %s" % (len(tensors), path))


def check_file(path, fail):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if (8 + n) % 8:
        fail("%s: the data starts at %d, not a multiple of 8" % (path, 8 + n))
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    end = 0
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, stop = e["data_offsets"]
        if begin != end:
            fail("%s: tensor %s starts at %d, the previous one ended at %d" % (path, name, begin, end))
        end = stop
        size = DTYPES[e["dtype"]][1]
        if (8 + n + begin) % size:
            fail("%s: tensor %s is not aligned to its %d-byte elements" % (path, name, size))
        numel = int(np.prod(e["shape"], dtype=np.int64))
        if stop - begin != numel * size:
            fail("%s: tensor %s: %d bytes for shape %s" % (path, name, stop - begin, e["shape"]))
        got = decode(e["dtype"], data[begin:stop])
        if not np.array_equal(got, pattern(name, e["dtype"], numel)):
            fail("%s: tensor %s holds %s" % (path, name, got[:8]))
    if end != len(data):
        fail("%s: %d bytes of data, the tensors cover %d" % (path, len(data), end))
    return {name: e["data_offsets"][1] - e["data_offsets"][0] for name, e in header.items()}


def check(path):
    problems = []
    fail = problems.append
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        sizes = {}
        for file in sorted(set(index["weight_map"].values())):
            for name, size in check_file(os.path.join(path, file), fail).items():
                if index["weight_map"].get(name) != file:
                    fail("%s holds %s, which the index maps to %s" % (file, name, index["weight_map"].get(name)))
                sizes[name] = size
        if set(sizes) != set(index["weight_map"]):
            fail("the index lists %s, the files hold %s" % (sorted(index["weight_map"]), sorted(sizes)))
        if index["metadata"]["total_size"] != sum(sizes.values()):
            fail("total_size %d, the tensors have %d bytes" % (index["metadata"]["total_size"], sum(sizes.values())))
        files = len(set(index["weight_map"].values()))
    else:
        sizes = check_file(os.path.join(path, "model.safetensors"), fail)
        files = 1
    for p in problems:
        print("interop: FAIL:", p)
    if problems:
        sys.exit(1)
    print("interop: OK checked %d tensors in %d files" % (len(sizes), files))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    (write if sys.argv[1] == "write" else check)(sys.argv[2])
