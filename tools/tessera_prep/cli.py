"""Command-line parsing for tessera-prep; errors print one line and exit 2 (bad input or data)."""
import argparse
import sys

from . import LOG_PREFIX, PrepError, commands
from .formats import LLMC_DEFAULT_SHARD_TOKENS

EPILOG = """\
INPUT: a text file (one document), a directory (each non-hidden file below it, sorted by path,
one document) or a .jsonl / .jsonl.gz file (one document per line, its "text" field).

examples:
  tessera-prep train-tokenizer data/text --vocab-size 4096 --model-prefix data/sp4096
  tessera-prep prepare data/text --tokenizer data/sp4096.model --output data/corpus_text_document
  tessera-prep prepare data/text --tokenizer Llama-3.2-1B/tokenizer.json --output data/corpus_llama3
  tessera-prep inspect data/corpus_text_document
  tessera-prep decode data/corpus_text_document --tokenizer data/sp4096.model --document 3
"""


def _positive(text):
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


def parser():
    p = argparse.ArgumentParser(
        prog="tessera-prep", description="Prepare tokenized training data for tessera.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train-tokenizer", help="train a SentencePiece BPE tokenizer on documents")
    t.add_argument("inputs", nargs="+", metavar="INPUT")
    t.add_argument("--vocab-size", type=_positive, required=True)
    t.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    t.add_argument("--input-sentence-size", type=_positive, default=2_000_000,
                   help="train on at most this many lines, the first ones (default 2000000)")
    t.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip checking decode(encode(text)) == text on every document")
    t.set_defaults(run=commands.train_tokenizer)

    r = sub.add_parser("prepare", help="tokenize documents into a Megatron or llm.c dataset")
    r.add_argument("inputs", nargs="+", metavar="INPUT")
    r.add_argument("--output", required=True, metavar="PREFIX",
                   help="megatron: PREFIX.bin + PREFIX.idx; llmc: PREFIX_000000.bin, ...")
    r.add_argument("--tokenizer", required=True, metavar="byte|MODEL|tokenizer.json",
                   help="'byte' (UTF-8 bytes, EOD 256, vocabulary 258), a SentencePiece .model or a Hugging Face "
                        "tokenizer.json (Node.js + npm's @huggingface/tokenizers; EOD: tokenizer_config.json's "
                        "eos_token)")
    r.add_argument("--format", choices=["megatron", "llmc"], default="megatron")
    r.add_argument("--no-eod", action="store_true", help="do not append EOD after each document")
    r.add_argument("--dtype", choices=["auto", "uint16", "int32", "uint32"], default="auto",
                   help="token type (auto: uint16 when the vocabulary fits)")
    r.add_argument("--shard-tokens", type=_positive, default=LLMC_DEFAULT_SHARD_TOKENS,
                   help=f"llmc: tokens per shard (default {LLMC_DEFAULT_SHARD_TOKENS})")
    r.add_argument("--workers", type=_positive, default=1, help="tokenizing processes (default 1)")
    r.add_argument("--quiet", action="store_true", help="no progress line")
    r.set_defaults(run=commands.prepare)

    i = sub.add_parser("inspect", help="validate a dataset and print what it holds")
    i.add_argument("path", metavar="PATH", help="Megatron prefix or file, llm.c shard(s) or glob, raw token file")
    i.add_argument("--dtype", choices=["uint16", "uint32", "int32"], help="token type of a raw token file")
    i.add_argument("--eod", type=int, help="llm.c/raw: count documents as runs ending in this id")
    i.set_defaults(run=commands.inspect)

    d = sub.add_parser("decode", help="print one document's text")
    d.add_argument("path", metavar="PATH")
    d.add_argument("--tokenizer", required=True, metavar="byte|MODEL|tokenizer.json")
    d.add_argument("--document", type=int, default=0, metavar="K", help="document index (default 0)")
    d.add_argument("--dtype", choices=["uint16", "uint32", "int32"], help="token type of a raw token file")
    d.set_defaults(run=commands.decode)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except PrepError as e:
        print(f"{LOG_PREFIX} error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{LOG_PREFIX} interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
