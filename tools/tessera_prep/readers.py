"""Validating readers for the datasets inspect and decode look at (memory-mapped, no whole-file reads).

open_dataset(PATH) detects the format: a Megatron prefix (PREFIX.bin + PREFIX.idx) or either of
its files, llm.c shards (one file or a glob; detected by their magic), or a raw token file such
as nanoGPT's train.bin (no header; needs a dtype). Every structural problem raises PrepError
naming the file and what is wrong; token values are only scanned by min_max().
"""
import glob
import os
import struct

import numpy as np

from . import PrepError
from .formats import (LLMC_BY_MAGIC, LLMC_HEADER_BYTES, LLMC_KINDS, MEGATRON_CODES,
                      MEGATRON_MAGIC, MEGATRON_VERSION)

_HEADER = len(MEGATRON_MAGIC) + 8 + 1 + 8 + 8  # magic, version, dtype code, S, D
_CHUNK = 1 << 24  # tokens per slice when scanning


def _map(path, dtype, offset=0, count=None):
    """A read-only memmap of `count` items of dtype at `offset` (empty arrays need no mapping)."""
    if count is None:
        count = (os.path.getsize(path) - offset) // np.dtype(dtype).itemsize
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


class TokenFile:
    """One file's token array: `path`, `tokens` (a memmap), `header` (bytes before the tokens)."""

    def __init__(self, path, dtype, header):
        self.path, self.header = path, header
        self.tokens = _map(path, np.dtype(dtype).newbyteorder("<"), header)


class Megatron:
    format = "megatron"

    def __init__(self, prefix):
        self.prefix = prefix
        self.idx_path, self.bin_path = prefix + ".idx", prefix + ".bin"
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                raise PrepError(f"{path}: no such file (a Megatron dataset needs {prefix}.bin and .idx)")
        self._read_index()
        self.files = [self.idx_path, self.bin_path]
        self.token_files = [TokenFile(self.bin_path, self.dtype, 0)]
        self._check_extents()
        self._check_documents()

    def _read_index(self):
        idx, size = self.idx_path, os.path.getsize(self.idx_path)
        with open(idx, "rb") as f:
            head = f.read(_HEADER)
        if head[:len(MEGATRON_MAGIC)] != MEGATRON_MAGIC and not MEGATRON_MAGIC.startswith(head):
            raise PrepError(f"{idx}: wrong magic {head[:9]!r} (expected {MEGATRON_MAGIC!r}): not a Megatron index")
        if size < _HEADER:
            raise PrepError(f"{idx}: truncated: {size} bytes, shorter than the {_HEADER}-byte header")
        version, code, s, d = struct.unpack("<QBQQ", head[9:])
        if version != MEGATRON_VERSION:
            raise PrepError(f"{idx}: unknown version {version} (expected {MEGATRON_VERSION})")
        if code not in MEGATRON_CODES:
            raise PrepError(f"{idx}: unknown dtype code {code}")
        self.code, self.dtype = code, MEGATRON_CODES[code]
        if not np.issubdtype(np.dtype(self.dtype), np.integer):
            raise PrepError(f"{idx}: unsupported dtype code {code} ({self.dtype}): tokens must be integers")
        need = _HEADER + 12 * s + 8 * d
        if size < need:
            raise PrepError(f"{idx}: truncated: {size} bytes, but S={s} sequences and D={d} "
                            f"document indices need {need}")
        if size > need:
            raise PrepError(f"{idx}: {size - need} unexpected trailing bytes after the document indices")
        self.sequences, self.index_entries = s, d
        self.lengths = _map(idx, "<i4", _HEADER, s)
        self.pointers = _map(idx, "<i8", _HEADER + 4 * s, s)
        self.document_indices = _map(idx, "<i8", _HEADER + 12 * s, d)

    def _check_extents(self):
        itemsize, bin_size = np.dtype(self.dtype).itemsize, os.path.getsize(self.bin_path)
        lengths, pointers = self.lengths.astype(np.int64), np.asarray(self.pointers)
        bad = np.flatnonzero(lengths < 0)
        if bad.size:
            raise PrepError(f"{self.idx_path}: sequence {bad[0]} has negative length {lengths[bad[0]]}")
        bad = np.flatnonzero((pointers < 0) | (pointers % itemsize != 0))
        if bad.size:
            raise PrepError(f"{self.idx_path}: sequence {bad[0]} pointer {pointers[bad[0]]} is negative "
                            f"or not a multiple of the {itemsize}-byte token size")
        ends = pointers + lengths * itemsize
        expected = np.concatenate([[0], np.cumsum(lengths * itemsize)[:-1]]) if self.sequences else pointers
        total = int(lengths.sum()) * itemsize
        contiguous = bool(np.array_equal(pointers, expected))
        beyond = np.flatnonzero(ends > bin_size)
        if beyond.size and contiguous:
            raise PrepError(f"{self.bin_path}: truncated: {bin_size} bytes, but {self.idx_path} "
                            f"describes {total} bytes of tokens")
        if beyond.size:
            i = beyond[0]
            raise PrepError(f"{self.idx_path}: sequence {i} points at bytes {pointers[i]}..{ends[i]}, "
                            f"beyond the end of {self.bin_path} ({bin_size} bytes)")
        if not contiguous:
            i = np.flatnonzero(pointers != expected)[0]
            raise PrepError(f"{self.idx_path}: sequence {i} pointer {pointers[i]} does not follow "
                            f"the sequence before it (expected {expected[i]})")
        if total != bin_size:
            raise PrepError(f"{self.bin_path}: {bin_size} bytes, but {self.idx_path} describes {total} "
                            f"bytes of tokens (mismatched .bin and .idx?)")
        self.total_tokens = total // itemsize

    def _check_documents(self):
        docs, idx = np.asarray(self.document_indices), self.idx_path
        if docs.size == 0 or docs[0] != 0:
            raise PrepError(f"{idx}: document indices do not start at 0")
        if docs.size > 1 and np.any(np.diff(docs) < 0):
            i = int(np.flatnonzero(np.diff(docs) < 0)[0]) + 1
            raise PrepError(f"{idx}: document indices decrease at entry {i} ({docs[i - 1]} then {docs[i]})")
        if docs[-1] != self.sequences:
            raise PrepError(f"{idx}: document indices end at {docs[-1]}, not at S={self.sequences}")
        self.documents = self.index_entries - 1

    def document(self, k):
        """Document k's tokens (its sequences concatenated)."""
        if not 0 <= k < self.documents:
            raise PrepError(f"{self.prefix}: no document {k} (it holds {self.documents})")
        first, last = int(self.document_indices[k]), int(self.document_indices[k + 1])
        tokens = self.token_files[0].tokens
        itemsize = np.dtype(self.dtype).itemsize
        parts = [tokens[p // itemsize: p // itemsize + n]
                 for p, n in zip(self.pointers[first:last], self.lengths[first:last])]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)


class Flat:
    """llm.c shards or raw token files: tokens one after another, no document index."""

    def __init__(self, fmt, dtype, token_files):
        self.format, self.dtype, self.token_files = fmt, dtype, token_files
        self.files = [t.path for t in token_files]
        self.total_tokens = sum(t.tokens.size for t in token_files)
        self.sequences = self.documents = None


def _llmc(path):
    size = os.path.getsize(path)
    if size < LLMC_HEADER_BYTES:
        raise PrepError(f"{path}: truncated: {size} bytes, shorter than the {LLMC_HEADER_BYTES}-byte llm.c header")
    magic, version, count = np.fromfile(path, dtype="<i4", count=3)
    if int(magic) not in LLMC_BY_MAGIC:
        raise PrepError(f"{path}: wrong magic {magic} (llm.c shards have {' or '.join(str(v[0]) for v in LLMC_KINDS.values())})")
    dtype, want = LLMC_BY_MAGIC[int(magic)]
    if version != want:
        raise PrepError(f"{path}: unknown version {version} for magic {magic} (expected {want})")
    itemsize = np.dtype(dtype).itemsize
    if count < 0 or size != LLMC_HEADER_BYTES + int(count) * itemsize:
        raise PrepError(f"{path}: size mismatch: the header says {count} {dtype} tokens "
                        f"({LLMC_HEADER_BYTES + int(count) * itemsize} bytes with the header), the file has {size}")
    return dtype, TokenFile(path, dtype, LLMC_HEADER_BYTES)


def _raw(path, dtype):
    size, itemsize = os.path.getsize(path), np.dtype(dtype).itemsize
    if size % itemsize:
        raise PrepError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
    return TokenFile(path, dtype, 0)


def _magic(path):
    with open(path, "rb") as f:
        head = f.read(len(MEGATRON_MAGIC))
    if head == MEGATRON_MAGIC:
        return "megatron"
    if len(head) >= 4 and struct.unpack("<i", head[:4])[0] in LLMC_BY_MAGIC:
        return "llmc"
    return None


def open_dataset(path, dtype=None):
    """The dataset at PATH (see the module docstring); dtype is for raw token files."""
    if os.path.isfile(path + ".idx") and os.path.isfile(path + ".bin"):
        return Megatron(path)
    if os.path.isfile(path):
        stem, ext = os.path.splitext(path)
        if ext in (".idx", ".bin") and os.path.isfile(stem + ".idx") and os.path.isfile(stem + ".bin"):
            return Megatron(stem)
        if _magic(path) == "megatron":
            return Megatron(stem)  # an .idx whose .bin is missing: Megatron() names it
        files = [path]
    else:
        files = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not files:
            raise PrepError(f"{path}: no such file, Megatron prefix (.bin + .idx) or matching shards")
    kinds = {p: _magic(p) for p in files}
    if all(k == "llmc" for k in kinds.values()):
        opened = [_llmc(p) for p in files]
        dtypes = {d for d, _ in opened}
        if len(dtypes) > 1:
            raise PrepError(f"{path}: shards mix token types {sorted(dtypes)}")
        return Flat("llmc", opened[0][0], [t for _, t in opened])
    if dtype is None:
        odd = next(p for p, k in kinds.items() if k != "llmc")
        raise PrepError(f"{odd}: no Megatron or llm.c magic; for a raw token file give --dtype")
    return Flat("raw", dtype, [_raw(p, dtype) for p in files])


def min_max(dataset):
    """(min, max) token id over the whole dataset, scanned in slices; (None, None) when empty."""
    lo = hi = None
    for tf in dataset.token_files:
        for start in range(0, tf.tokens.size, _CHUNK):
            part = tf.tokens[start:start + _CHUNK]
            a, b = int(part.min()), int(part.max())
            lo, hi = (a, b) if lo is None else (min(lo, a), max(hi, b))
    return lo, hi


def flat_documents(dataset, eod):
    """For llm.c / raw data: the token arrays between EOD tokens (EOD kept), across files."""
    carry = []
    for tf in dataset.token_files:
        tokens, start = tf.tokens, 0
        for end in np.flatnonzero(tokens == eod):
            carry.append(np.asarray(tokens[start:end + 1]))
            yield np.concatenate(carry)
            carry, start = [], end + 1
        if start < tokens.size:
            carry.append(np.asarray(tokens[start:]))
    if carry:
        yield np.concatenate(carry)
