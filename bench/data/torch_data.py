#!/usr/bin/python3
"""PyTorch users' ways of reading a Megatron dataset (numpy + torch only, no tessera), measured as
bench/data/data_bench.cpp measures tessera, on the same file; bench/data/run.sh runs both.

    /usr/bin/python3 bench/data/torch_data.py --data PREFIX [--name LABEL] [--seq-len 1024] [--batch 8]
        [--steps 1000] [--warm 50] [--repeats 5] [--seq-passes 3] [--loader-steps 200] [--work-ms 2]
        [--build-repeats 5] [--workers 2] [--cold] [--only seq,build,sample,loader]

The reader is Megatron-LM's IndexedDataset as megatron/core/datasets/indexed_dataset.py has it:
the .idx header read with struct, its lengths/pointers/document indices np.frombuffer views of an
np.memmap of the .idx, the tokens np.frombuffer views of an np.memmap of the .bin.

Systems and measurements (one JSON line each on stdout, human lines on stderr):
  pytorch-memmap          seq_read[_cold]: every sequence in order as
                          torch.from_numpy(get(i).astype(np.int64)) (a new tensor per document);
  numpy-memmap-chunked    seq_read: the .bin as one token stream in 1 M-token chunks copied into a
                          reused int64 buffer (numpy's best case; ignores document boundaries);
                          build: reading the .idx and building one epoch's GPT sample index
  pytorch-dataloader-w0   sample_read: DataLoader(GptDataset, batch_size=B, num_workers=0),
                          next() per step (B x __getitem__ + default_collate)
  pytorch-dataloader-wN   sample_read (no work: the workers' rate) and loader_next (work_ms of
                          fake work per step: how long next() blocks the trainer), num_workers=N
  nanogpt-memmap          sample_read: nanoGPT's get_batch (np.memmap opened per batch, B random
                          offsets, torch.stack of x and of y)
GptDataset is Megatron's GPTDataset packing, vectorised: documents shuffled per epoch (Megatron's
_build_document_index shuffles the epochs' concatenation; here each epoch is shuffled on its own),
laid end to end, sample k = the seq_len + 1 tokens from token k * seq_len (sample_index by
searchsorted instead of Megatron's C++ helper; no EOD appended), samples visited in a random
permutation (shuffle_index); __getitem__ concatenates the pieces with dataset.get() as Megatron's
_query_document_sample_shuffle_indices does and returns an int64 tensor of seq_len + 1 tokens.
Statistics as data_bench.cpp: warm-up steps, --repeats runs of --steps steps, per run mean / p50 /
p99 (nearest rank) us per step, medians over the runs; tokens/s = B * (seq_len + 1) / mean.
Timing: time.perf_counter.
"""
import argparse
import ctypes
import json
import math
import mmap
import os
import struct
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
           8: np.uint16}


class IndexedDataset:
    """Megatron-LM's IndexedDataset (mmap mode): PREFIX.idx + PREFIX.bin."""

    def __init__(self, prefix):
        if prefix.endswith((".bin", ".idx")):
            prefix = prefix[:-4]
        self.idx_path, self.bin_path = prefix + ".idx", prefix + ".bin"
        with open(self.idx_path, "rb") as stream:
            assert stream.read(9) == _INDEX_HEADER, f"{self.idx_path}: not a Megatron index"
            version = struct.unpack("<Q", stream.read(8))[0]
            assert version == 1, f"{self.idx_path}: version {version}"
            code = struct.unpack("<B", stream.read(1))[0]
            self.dtype = _DTYPES[code]
            self.dtype_size = np.dtype(self.dtype).itemsize
            sequence_count = struct.unpack("<Q", stream.read(8))[0]
            document_count = struct.unpack("<Q", stream.read(8))[0]
            offset = stream.tell()
        self._idx_mmap = np.memmap(self.idx_path, mode="r", order="C")
        idx_buffer = memoryview(self._idx_mmap)
        self.sequence_lengths = np.frombuffer(idx_buffer, dtype=np.int32, count=sequence_count, offset=offset)
        self.sequence_pointers = np.frombuffer(idx_buffer, dtype=np.int64, count=sequence_count,
                                               offset=offset + self.sequence_lengths.nbytes)
        self.document_indices = np.frombuffer(
            idx_buffer, dtype=np.int64, count=document_count,
            offset=offset + self.sequence_lengths.nbytes + self.sequence_pointers.nbytes)
        self._bin_mmap = np.memmap(self.bin_path, mode="r", order="C")
        self._bin_buffer = memoryview(self._bin_mmap)

    def __len__(self):
        return len(self.sequence_lengths)

    def get(self, idx, offset=0, length=None):
        pointer, size = self.sequence_pointers[idx], self.sequence_lengths[idx]
        if length is None:
            length = size - offset
        pointer += offset * self.dtype_size
        return np.frombuffer(self._bin_buffer, dtype=self.dtype, count=length, offset=pointer)


class GptDataset(Dataset):
    """Megatron GPTDataset-style samples of seq_len + 1 tokens (see the module docstring)."""

    def __init__(self, indexed, seq_len, num_epochs=1, seed=1234):
        self.indexed, self.seq_len = indexed, seq_len
        rng = np.random.RandomState(seed)
        n = len(indexed)
        self.document_index = np.concatenate([rng.permutation(n) for _ in range(num_epochs)])
        lengths = indexed.sequence_lengths.astype(np.int64)[self.document_index]
        starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        total = int(starts[-1])
        self.samples_per_epoch = (int(lengths[: n].sum()) - 1) // seq_len
        num_samples = (total - 1) // seq_len
        tok = np.arange(num_samples + 1, dtype=np.int64) * seq_len
        doc = np.searchsorted(starts, tok, side="right") - 1
        self.sample_index = np.stack([doc, tok - starts[doc]], axis=1)
        self.shuffle_index = rng.permutation(num_samples)

    def __len__(self):
        return len(self.shuffle_index)

    def __getitem__(self, idx):
        idx = self.shuffle_index[idx]
        doc_beg, off_beg = self.sample_index[idx]
        doc_end, off_end = self.sample_index[idx + 1]
        if doc_beg == doc_end:
            parts = [self.indexed.get(self.document_index[doc_beg], offset=off_beg, length=off_end - off_beg + 1)]
        else:
            parts = []
            for i in range(doc_beg, doc_end + 1):
                offset = 0 if i > doc_beg else off_beg
                length = None if i < doc_end else off_end + 1
                parts.append(self.indexed.get(self.document_index[i], offset=offset, length=length))
        return torch.from_numpy(np.array(np.concatenate(parts), dtype=np.int64))


# ---------------------------------------------------------------------------------------------
def percentile(v, p):
    s = sorted(v)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]


def step_stats(runs_us):
    means = [sum(r) / len(r) for r in runs_us]
    med = lambda v: float(np.median(v))  # noqa: E731
    return {"us_mean": med(means), "us_p50": med([percentile(r, 50) for r in runs_us]),
            "us_p99": med([percentile(r, 99) for r in runs_us]), "us_max": med([max(r) for r in runs_us]),
            "us_mean_all": [round(m, 3) for m in means]}


def emit(args, system, measurement, **members):
    row = {"system": system, "dataset": args.name, "measurement": measurement}
    row.update({k: (round(v, 3) if isinstance(v, float) else v) for k, v in members.items()})
    print(json.dumps(row), flush=True)


def human(system, args, text):
    print(f"[{system} {args.name}] {text}", file=sys.stderr, flush=True)


def spin(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def evict(path):
    """Writes back and drops path's cached pages (fsync + POSIX_FADV_DONTNEED)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path):
    """The fraction of path's pages in the page cache (mincore over a fresh mapping)."""
    size = os.path.getsize(path)
    if size == 0:
        return float("nan")
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    try:
        arr = np.frombuffer(m, dtype=np.uint8)  # a view: no page is touched
        page = mmap.PAGESIZE
        pages = (size + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        rc = libc.mincore(ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(size), vec)
        del arr
        return float("nan") if rc else sum(b & 1 for b in vec) / pages
    finally:
        m.close()


PER_DOC = "per document: torch.from_numpy(get(i).astype(np.int64))"


def sequential_pass(ds):
    """Every sequence in order as a new int64 tensor (what a per-document PyTorch loop does)."""
    t0 = time.perf_counter()
    for i in range(len(ds)):
        torch.from_numpy(ds.get(i).astype(np.int64))
    return time.perf_counter() - t0


def chunked_pass(ds, buf):
    """The .bin as one stream in chunks of len(buf) tokens, widened into the reused int64 `buf`
    (numpy's best case: no per-document calls, no allocation)."""
    tokens = np.frombuffer(ds._bin_buffer, dtype=ds.dtype)
    t0 = time.perf_counter()
    for a in range(0, len(tokens), len(buf)):
        piece = tokens[a:a + len(buf)]
        np.copyto(buf[:len(piece)], piece)
        torch.from_numpy(buf[:len(piece)])
    return time.perf_counter() - t0


def bench_sequential(args):
    system = "pytorch-memmap"
    if args.cold:
        for f in (args.prefix + ".bin", args.prefix + ".idx"):
            evict(f)
        resident = resident_fraction(args.prefix + ".bin")
        t0 = time.perf_counter()
        ds = IndexedDataset(args.prefix)
        open_s = time.perf_counter() - t0
        s = sequential_pass(ds)
        tokens = int(ds.sequence_lengths.sum(dtype=np.int64))
        nbytes = tokens * ds.dtype_size
        human(system, args, f"seq_read_cold: {tokens / s / 1e6:.1f} M tokens/s ({nbytes / s / 1e6:.0f} MB/s of the "
                            f"file; {resident * 100:.1f}% cached before)")
        emit(args, system, "seq_read_cold", tokens=tokens, file_bytes=nbytes, tokens_per_s=round(tokens / s),
             file_MB_per_s=nbytes / s / 1e6, pass_ms=s * 1e3, open_ms=open_s * 1e3, resident_before=resident,
             what=PER_DOC)
        del ds
    ds = IndexedDataset(args.prefix)
    tokens = int(ds.sequence_lengths.sum(dtype=np.int64))
    buf = np.empty(1 << 20, dtype=np.int64)
    for system, what, one_pass in (
            (system, PER_DOC, lambda: sequential_pass(ds)),
            ("numpy-memmap-chunked", "the .bin as one stream, 1 M-token chunks into a reused int64 buffer",
             lambda: chunked_pass(ds, buf))):
        one_pass()  # warm-up
        passes = [one_pass() for _ in range(args.seq_passes)]
        s = float(np.median(passes))
        human(system, args, f"seq_read: {tokens / s / 1e6:.1f} M tokens/s ({len(ds)} documents, {tokens / 1e6:.2f} "
                            f"M tokens, median of {len(passes)} passes of {s * 1e3:.2f} ms; {what})")
        emit(args, system, "seq_read", documents=len(ds), tokens=tokens, token_bytes=ds.dtype_size,
             tokens_per_s=round(tokens / s), pass_ms=s * 1e3, passes=len(passes),
             tokens_per_s_all=[round(tokens / x) for x in passes], what=what)


def bench_build(args):
    build, getitem = [], []
    for r in range(args.build_repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        ds = GptDataset(IndexedDataset(args.prefix), args.seq_len)
        t1 = time.perf_counter()
        torch.stack([ds[i] for i in range(args.batch)])
        t2 = time.perf_counter()
        if r:
            build.append((t1 - t0) * 1e3)
            getitem.append((t2 - t1) * 1e3)
    human("pytorch-memmap", args, f"build: IndexedDataset + one epoch's GPT index {np.median(build):.3f} ms, first "
                                  f"batch {np.median(getitem):.3f} ms ({ds.samples_per_epoch} samples per epoch)")
    emit(args, "pytorch-memmap", "build", build_ms=float(np.median(build)), first_batch_ms=float(np.median(getitem)),
         repeats=len(build), build_ms_all=[round(x, 4) for x in build])


def time_steps(args, fn, steps, warm, repeats, work_ms=0.0):
    """Per-step µs of fn() over `repeats` runs of `steps` steps after `warm` warm-up steps."""
    for _ in range(warm):
        fn()
        spin(work_ms)
    runs = []
    for _ in range(repeats):
        us = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            us.append((time.perf_counter() - t0) * 1e6)
            spin(work_ms)
        runs.append(us)
    return step_stats(runs)


def report_steps(args, system, measurement, st, steps, repeats, **extra):
    tokens = args.batch * (args.seq_len + 1)
    work = f" with {extra['work_ms']} ms of work per step" if "work_ms" in extra else ""
    human(system, args, f"{measurement}{work} B={args.batch} T={args.seq_len}: mean {st['us_mean']:.1f} us, p50 "
                        f"{st['us_p50']:.1f} us, p99 {st['us_p99']:.1f} us per step, "
                        f"{tokens / st['us_mean']:.2f} M tokens/s")
    emit(args, system, measurement, batch=args.batch, seq_len=args.seq_len, **extra,
         us_mean=st["us_mean"], us_p50=st["us_p50"], us_p99=st["us_p99"], us_max=st["us_max"],
         tokens_per_s=round(tokens / st["us_mean"] * 1e6), steps=steps, repeats=repeats, us_mean_all=st["us_mean_all"])


def samples_needed(args, loader_runs=1):
    steps = args.warm + args.repeats * args.steps + loader_runs * (args.warm + args.loader_steps) * 3
    return steps * args.batch


def make_dataset(args):
    indexed = IndexedDataset(args.prefix)
    one = GptDataset(indexed, args.seq_len)
    epochs = max(1, math.ceil(samples_needed(args) / one.samples_per_epoch))
    return one if epochs == 1 else GptDataset(indexed, args.seq_len, num_epochs=epochs)


def bench_samples(args, ds):
    # DataLoader, no workers: the main process reads each batch when asked.
    it = iter(DataLoader(ds, batch_size=args.batch, shuffle=False, num_workers=0, drop_last=True))
    st = time_steps(args, lambda: next(it), args.steps, args.warm, args.repeats)
    report_steps(args, "pytorch-dataloader-w0", "sample_read", st, args.steps, args.repeats)

    # nanoGPT's get_batch over the same .bin as one token stream (train.py, as it is).
    bin_path, dtype, batch_size, block_size = args.prefix + ".bin", ds.indexed.dtype, args.batch, args.seq_len

    def get_batch():
        data = np.memmap(bin_path, dtype=dtype, mode="r")  # recreated every batch, as nanoGPT does
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
        return x, y

    st = time_steps(args, get_batch, args.steps, args.warm, args.repeats)
    report_steps(args, "nanogpt-memmap", "sample_read", st, args.steps, args.repeats)


def bench_loader(args, ds):
    # DataLoader with worker processes: the rate they keep up (no work), and how long next()
    # blocks a trainer that works work_ms per step. A fresh DataLoader (and workers) per run.
    n = args.workers
    system = f"pytorch-dataloader-w{n}"
    repeats = min(args.repeats, 3)
    for work in (args.work_ms, 0.0):
        runs = []
        for r in range(repeats):
            start = (args.warm + args.repeats * args.steps + r * (args.warm + args.loader_steps)) * args.batch
            sub = torch.utils.data.Subset(ds, range(start % len(ds), len(ds)))
            it = iter(DataLoader(sub, batch_size=args.batch, shuffle=False, num_workers=n, drop_last=True))
            st = time_steps(args, lambda: next(it), args.loader_steps, args.warm, 1, work_ms=work)
            runs.append(st)
            it = None  # lets the workers go
        st = {k: float(np.median([x[k] for x in runs])) for k in ("us_mean", "us_p50", "us_p99", "us_max")}
        st["us_mean_all"] = [round(x["us_mean"], 3) for x in runs]
        if work > 0:
            report_steps(args, system, "loader_next", st, args.loader_steps, repeats, work_ms=work)
        else:
            report_steps(args, system, "sample_read", st, args.loader_steps, repeats, work_ms=0.0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="Megatron dataset PREFIX (or PREFIX.bin / PREFIX.idx)")
    p.add_argument("--name", default="")
    p.add_argument("--vocab", type=int, default=0, help="unused (tessera checks token ids; kept for a common CLI)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--warm", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seq-passes", type=int, default=3)
    p.add_argument("--loader-steps", type=int, default=200)
    p.add_argument("--work-ms", type=float, default=2.0)
    p.add_argument("--build-repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--only", default="seq,build,sample,loader")
    args = p.parse_args()
    args.prefix = args.data[:-4] if args.data.endswith((".bin", ".idx")) else args.data
    args.name = args.name or args.data
    only = set(args.only.split(","))
    torch.set_num_threads(1)
    if "seq" in only:
        bench_sequential(args)
    if "build" in only:
        bench_build(args)
    if only & {"sample", "loader"}:
        ds = make_dataset(args)
        if "sample" in only:
            bench_samples(args, ds)
        if "loader" in only and args.workers > 0:
            bench_loader(args, ds)


if __name__ == "__main__":
    main()
