#!/usr/bin/env python3
"""Seeds for tests/data/fuzz_formats.cpp: valid inputs for every token-format parser, and a libFuzzer
dictionary. usage: fuzz_seeds.py CORPUS_DIR DICT_FILE (run by tests/data/run_fuzz.sh)."""
import os, struct, sys

out, dictfile = sys.argv[1], sys.argv[2]

def megatron(code, lengths, pointers, doc_indices, bin_bytes):
    """The fuzz input: u64 .bin size, then the .idx (layout in src/data/formats.h)."""
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_indices))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_indices), *doc_indices)
    return struct.pack("<Q", bin_bytes) + idx

def contiguous(code, lengths, doc_indices, slack=0):
    size = 2 if code == 8 else 4
    pointers, p = [], 0
    for n in lengths:
        pointers.append(p)
        p += n * size
    return megatron(code, lengths, pointers, doc_indices, p + slack)

def llmc(tokens, wide):
    header = [20240801 if wide else 20240520, 7 if wide else 1, len(tokens)] + [0] * 253
    body = struct.pack("<%d%s" % (len(tokens), "I" if wide else "H"), *tokens)
    return struct.pack("<256i", *header) + body

seeds = {
    "megatron_u16_3seq": contiguous(8, [3, 0, 5], [0, 1, 3]),
    "megatron_u16_docs": contiguous(8, [1, 2, 3, 4], [0, 2, 2, 4], slack=6),
    "megatron_i32_4seq": contiguous(4, [2, 1, 4, 0], [0, 2, 4]),
    "megatron_i32_shared": megatron(4, [2, 2, 1], [0, 0, 4], [0, 3], 8),
    "megatron_empty": megatron(8, [], [], [0], 0),
    "llmc_u16": llmc([1, 2, 3, 50256, 65535], wide=False),
    "llmc_u32": llmc([7, 100000, 4294967295], wide=True),
    "llmc_u16_empty": llmc([], wide=False),
    "llmc_u32_empty": llmc([], wide=True),
    "raw_tokens": bytes(range(12)),
}
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

def esc(b):
    return "".join("\\x%02x" % c for c in b)

with open(dictfile, "w") as f:
    f.write('megatron_magic="%s"\n' % esc(b"MMIDIDX\0\0"))
    f.write('megatron_v1="%s"\n' % esc(struct.pack("<Q", 1)))
    f.write('llmc_magic16="%s"\n' % esc(struct.pack("<i", 20240520)))
    f.write('llmc_magic32="%s"\n' % esc(struct.pack("<i", 20240801)))
    f.write('llmc_v7="%s"\n' % esc(struct.pack("<i", 7)))
print("run_fuzz: wrote %d seeds" % len(seeds))
