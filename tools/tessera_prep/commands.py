"""The subcommands: train-tokenizer, prepare, inspect and decode (argument parsing is in cli.py)."""
import collections
import multiprocessing
import os
import sys
import time

import numpy as np

from . import LOG_PREFIX, PrepError, inputs, readers, tokenizers
from .formats import LlmcWriter, MegatronWriter, choose_dtype
from .progress import Progress, human


def _files(n):
    return f"{n} input file{'' if n == 1 else 's'}"


def log(message):
    print(f"{LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def train_tokenizer(args):
    sources = inputs.expand(args.inputs)
    prefix_dir = os.path.dirname(args.model_prefix)
    if prefix_dir:
        os.makedirs(prefix_dir, exist_ok=True)
    log(f"training a SentencePiece BPE tokenizer, vocabulary {args.vocab_size}, "
        f"on the lines of {_files(len(sources))}")
    start = time.monotonic()
    used, size = tokenizers.train(inputs.lines(sources), args.model_prefix, args.vocab_size,
                                  args.input_sentence_size)
    log(f"trained on {used} sentences in {time.monotonic() - start:.1f}s -> "
        f"{args.model_prefix}.model ({size} bytes), {args.model_prefix}.vocab")
    if args.verify:
        tok = tokenizers.load(args.model_prefix + ".model")
        count = 0
        for where, text in inputs.documents(sources):
            if tok.decode_bytes(tok.encode(text)) != text.encode("utf-8"):
                raise PrepError(f"{where}: decode(encode(text)) differs from the text with "
                                f"{args.model_prefix}.model (does it contain U+2581?)")
            count += 1
        log(f"verified: decode(encode(text)) == text for all {count} documents")
    return 0


# Tokenization, in this process or a pool: chunks of documents go out, token arrays come back
# in order; at most a few chunks are in flight, so memory stays bounded on any corpus size.
_worker_tokenizer = None


def _init_worker(spec):
    global _worker_tokenizer
    _worker_tokenizer = tokenizers.load(spec)


def _encode_chunk(texts):
    return [_worker_tokenizer.encode(t) for t in texts]


def _chunks(docs, max_docs=32, max_chars=1 << 20):
    chunk, chars = [], 0
    for _, text in docs:
        chunk.append(text)
        chars += len(text)
        if len(chunk) >= max_docs or chars >= max_chars:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _tokenized(docs, tok, spec, workers):
    if workers <= 1:
        for _, text in docs:
            yield tok.encode(text)
        return
    with multiprocessing.Pool(workers, initializer=_init_worker, initargs=(spec,)) as pool:
        pending = collections.deque()
        for chunk in _chunks(docs):
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) > 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def prepare(args):
    tok = tokenizers.load(args.tokenizer)
    sources = inputs.expand(args.inputs)
    dtype = choose_dtype(args.format, args.dtype, tok.vocab_size)
    out_dir = os.path.dirname(args.output)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    if args.format == "megatron":
        writer = MegatronWriter(args.output, dtype)
    else:
        writer = LlmcWriter(args.output, dtype, args.shard_tokens)
    log(f"preparing {args.format} dataset {args.output} from {_files(len(sources))}, "
        f"tokenizer {tok.name} (vocabulary {tok.vocab_size}, EOD {'off' if args.no_eod else tok.eod}), "
        f"dtype {dtype}")
    progress = Progress(inputs.known_count(sources), enabled=not args.quiet)
    if not args.no_eod and tok.eod < 0:
        raise PrepError(f"{tok.name} names no end-of-document token (tokenizer_config.json's eos_token, config.json's "
                        "eos_token_id): give --no-eod")
    eod = np.array([tok.eod], dtype=np.int32)
    documents = skipped = 0
    with writer:
        for ids in _tokenized(inputs.documents(sources), tok, args.tokenizer, args.workers):
            if ids.size == 0:
                skipped += 1
                progress.update(1, 0)
                continue
            if not args.no_eod:
                ids = np.concatenate([ids, eod])
            writer.add_document(ids)
            documents += 1
            progress.update(1, ids.size)
        if documents == 0:
            raise PrepError(f"no tokens: all {skipped} input documents are empty")
        paths = writer.finish()
    progress.close()
    log(f"done: {documents} documents, {skipped} skipped (empty), {writer.tokens} tokens in "
        f"{progress.elapsed():.1f}s ({human(progress.rate())} tokens/s) -> {', '.join(paths)}")
    return 0


def inspect(args):
    ds = readers.open_dataset(args.path, args.dtype)
    lo, hi = readers.min_max(ds)
    print(f"format: {ds.format}")
    code = f" (code {ds.code})" if ds.format == "megatron" else ""
    print(f"dtype: {ds.dtype}{code}")
    if ds.format == "megatron":
        print(f"sequences: {ds.sequences}")
        print(f"documents: {ds.documents}")
        print(f"document_indices: {ds.index_entries}")
    else:
        if ds.format == "llmc":
            print(f"shards: {len(ds.files)}")
        if args.eod is not None:
            print(f"documents: {sum(1 for _ in readers.flat_documents(ds, args.eod))} (split at EOD {args.eod})")
        else:
            print("documents: unknown (no document index; give --eod ID to count)")
    print(f"tokens: {ds.total_tokens}")
    print(f"min_id: {'-' if lo is None else lo}")
    print(f"max_id: {'-' if hi is None else hi}")
    print("files: " + ", ".join(f"{p} ({os.path.getsize(p)} bytes)" for p in ds.files))
    return 0


def decode(args):
    ds = readers.open_dataset(args.path, args.dtype)
    tok = tokenizers.load(args.tokenizer)
    if args.document < 0:
        raise PrepError(f"--document {args.document}: must be >= 0")
    if ds.format == "megatron":
        ids = ds.document(args.document)
    else:
        ids = next((d for i, d in enumerate(readers.flat_documents(ds, tok.eod)) if i == args.document), None)
        if ids is None:
            raise PrepError(f"{args.path}: no document {args.document} (documents split at EOD {tok.eod})")
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= tok.vocab_size):
        raise PrepError(f"{args.path}: document {args.document} holds token ids "
                        f"{ids.min()}..{ids.max()}, outside {tok.name}'s vocabulary of {tok.vocab_size}")
    sys.stdout.buffer.write(tok.decode_bytes(ids))
    sys.stdout.buffer.flush()
    return 0
