"""Dataset writers: Megatron-LM indexed datasets (.bin + .idx) and llm.c token shards.

Megatron (as megatron/core/datasets/indexed_dataset.py's IndexedDatasetBuilder writes it, one
sequence per document). PREFIX.bin: the token arrays back to back. PREFIX.idx, little-endian:
  9-byte magic b"MMIDIDX\\x00\\x00", u64 version 1, u8 dtype code, u64 sequence count S,
  u64 document count D, int32 lengths[S], int64 byte pointers[S], int64 document indices[D]
where document indices are [0] plus len(lengths) after every document, so D = documents + 1.

llm.c (dev/data/data_common.py's write_datafile): PREFIX_000000.bin, PREFIX_000001.bin, ...
each a header of 256 little-endian int32 (magic, version, token count, zeros) and then at most
`shard_tokens` tokens; a document may continue in the next shard. uint16 tokens: magic 20240520,
version 1; uint32 tokens: magic 20240801, version 7.

Both writers stream tokens to disk under temporary names and rename them into place in
finish(); abort() (or leaving a `with` block by an exception) removes them.
"""
import array
import os
import struct

import numpy as np

from . import PrepError

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
# Megatron's DType codes; only integer token types can be read back as tokens.
MEGATRON_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64",
                  6: "float64", 7: "float32", 8: "uint16"}
MEGATRON_WRITTEN = {"uint16": 8, "int32": 4}

LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
LLMC_KINDS = {"uint16": (20240520, 1), "uint32": (20240801, 7)}  # dtype -> (magic, version)
LLMC_BY_MAGIC = {magic: (dtype, version) for dtype, (magic, version) in LLMC_KINDS.items()}
LLMC_DEFAULT_SHARD_TOKENS = 100_000_000
MEGATRON_UINT16_VOCAB_LIMIT = 65500  # Megatron's optimal_dtype: uint16 below this size


def choose_dtype(fmt, requested, vocab_size):
    """The token dtype name for a format, a --dtype request (auto|uint16|int32|uint32), a vocab."""
    if fmt == "megatron":
        if requested == "auto":
            return "uint16" if vocab_size < MEGATRON_UINT16_VOCAB_LIMIT else "int32"
        if requested == "uint32":
            raise PrepError("--dtype uint32: Megatron has no uint32 dtype code; use int32")
        chosen = requested
    else:
        if requested == "auto":
            return "uint16" if vocab_size <= 65536 else "uint32"
        chosen = "uint32" if requested in ("int32", "uint32") else requested
    if chosen == "uint16" and vocab_size > 65536:
        raise PrepError(f"--dtype uint16: vocabulary of {vocab_size} ids does not fit in uint16")
    return chosen


def _tokens(ids, dtype):
    """ids as a little-endian array of dtype, refusing ids the dtype cannot hold."""
    ids = np.asarray(ids)
    info = np.iinfo(dtype)
    if ids.size and (int(ids.min()) < info.min or int(ids.max()) > info.max):
        raise PrepError(f"token id out of range for {np.dtype(dtype).name}: "
                        f"ids span {int(ids.min())}..{int(ids.max())}")
    return ids.astype(np.dtype(dtype).newbyteorder("<"), copy=False)


def _tmp(path):
    return f"{path}.tmp{os.getpid()}"


class _Writer:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


class MegatronWriter(_Writer):
    """MegatronWriter(prefix, "uint16"|"int32"): add_document(ids)..., then finish() -> paths."""

    def __init__(self, prefix, dtype="uint16"):
        dtype = np.dtype(dtype).name
        if dtype not in MEGATRON_WRITTEN:
            raise PrepError(f"Megatron writer: dtype {dtype} not supported (uint16 or int32)")
        self.dtype = dtype
        self.bin_path, self.idx_path = prefix + ".bin", prefix + ".idx"
        self._bin = open(_tmp(self.bin_path), "wb", buffering=1 << 20)
        self.lengths = array.array("q")
        self.document_indices = array.array("q", [0])
        self.tokens = 0

    def add_document(self, ids):
        """Appends one document (one sequence) of token ids, EOD included if wanted."""
        tokens = _tokens(ids, self.dtype)
        if tokens.size == 0:
            raise PrepError("Megatron writer: empty document (skip documents with no tokens)")
        if tokens.size > np.iinfo(np.int32).max:
            raise PrepError(f"Megatron writer: document of {tokens.size} tokens exceeds int32 lengths")
        self._bin.write(tokens.tobytes())
        self.lengths.append(tokens.size)
        self.document_indices.append(len(self.lengths))
        self.tokens += tokens.size

    def _index_bytes(self):
        itemsize = np.dtype(self.dtype).itemsize
        lengths = np.frombuffer(self.lengths, dtype=np.int64)
        pointers = np.zeros(len(lengths), dtype="<i8")
        np.cumsum(lengths[:-1] * itemsize, out=pointers[1:])
        header = (MEGATRON_MAGIC + struct.pack("<Q", MEGATRON_VERSION)
                  + struct.pack("<B", MEGATRON_WRITTEN[self.dtype])
                  + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(self.document_indices)))
        return b"".join([header, lengths.astype("<i4").tobytes(), pointers.tobytes(),
                         np.frombuffer(self.document_indices, dtype=np.int64).astype("<i8").tobytes()])

    def finish(self):
        """Writes the index and moves both files into place (the .idx last); returns their paths."""
        self._bin.close()
        with open(_tmp(self.idx_path), "wb") as f:
            f.write(self._index_bytes())
        os.replace(_tmp(self.bin_path), self.bin_path)
        os.replace(_tmp(self.idx_path), self.idx_path)
        return [self.bin_path, self.idx_path]

    def abort(self):
        self._bin.close()
        for path in (_tmp(self.bin_path), _tmp(self.idx_path)):
            if os.path.exists(path):
                os.remove(path)


class LlmcWriter(_Writer):
    """LlmcWriter(prefix, "uint16"|"uint32", shard_tokens): add_document(ids)..., finish() -> paths."""

    def __init__(self, prefix, dtype="uint16", shard_tokens=LLMC_DEFAULT_SHARD_TOKENS):
        dtype = np.dtype(dtype).name
        if dtype not in LLMC_KINDS:
            raise PrepError(f"llm.c writer: dtype {dtype} not supported (uint16 or uint32)")
        if not 0 < shard_tokens <= np.iinfo(np.int32).max:
            raise PrepError(f"--shard-tokens {shard_tokens}: must be in 1..{np.iinfo(np.int32).max}")
        self.prefix, self.dtype, self.shard_tokens = prefix, dtype, shard_tokens
        self.paths = []  # final names of the shards begun so far
        self._file = None
        self._count = 0  # tokens in the open shard
        self.tokens = 0

    def _header(self, count):
        magic, version = LLMC_KINDS[self.dtype]
        header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
        header[0], header[1], header[2] = magic, version, count
        return header.tobytes()

    def _open(self):
        self.paths.append(f"{self.prefix}_{len(self.paths):06d}.bin")
        self._file = open(_tmp(self.paths[-1]), "wb", buffering=1 << 20)
        self._file.write(self._header(0))  # rewritten with the count when the shard closes
        self._count = 0

    def _close(self):
        self._file.seek(0)
        self._file.write(self._header(self._count))
        self._file.close()
        self._file = None

    def add_document(self, ids):
        """Appends a document's tokens, starting a new shard whenever the open one is full."""
        tokens = _tokens(ids, self.dtype)
        while tokens.size:
            if self._file is None:
                self._open()
            take = min(tokens.size, self.shard_tokens - self._count)
            self._file.write(tokens[:take].tobytes())
            self._count += take
            self.tokens += take
            tokens = tokens[take:]
            if self._count == self.shard_tokens:
                self._close()

    def finish(self):
        """Closes the last shard and moves every shard into place; returns their paths."""
        if self._file is not None:
            self._close()
        for path in self.paths:
            os.replace(_tmp(path), path)
        return list(self.paths)

    def abort(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        for path in self.paths:
            if os.path.exists(_tmp(path)):
                os.remove(_tmp(path))
