"""Documents from the command line's INPUT arguments, in order.

An INPUT is a text file (one document), a directory (every regular, non-hidden file below it,
recursively, sorted by path, one document each) or a `.jsonl` / `.jsonl.gz` file (one document
per line, from the line's "text" field). Text is read as bytes and decoded as strict UTF-8, so
a document's text is exactly its file's contents (no newline translation).
"""
import gzip
import json
import os

from . import PrepError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


class Source:
    """One input file: `kind` is "text" (the whole file is one document) or "jsonl"."""

    def __init__(self, path, kind):
        self.path = path
        self.kind = kind


def _hidden(name):
    return name.startswith(".")


def _walk(root):
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not _hidden(d)]
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not _hidden(name) and os.path.isfile(path):
                found.append(path)
    return sorted(found)


def expand(paths):
    """The INPUT arguments as a list of Sources, in document order."""
    sources = []
    for path in paths:
        if os.path.isdir(path):
            files = _walk(path)
            if not files:
                raise PrepError(f"{path}: directory holds no (non-hidden) files")
            sources.extend(Source(p, "text") for p in files)
        elif os.path.isfile(path):
            kind = "jsonl" if path.endswith(JSONL_SUFFIXES) else "text"
            sources.append(Source(path, kind))
        elif os.path.exists(path):
            raise PrepError(f"{path}: not a regular file or directory")
        else:
            raise PrepError(f"{path}: no such file or directory")
    return sources


def known_count(sources):
    """The number of documents when it is known without reading them (no JSONL), else None."""
    if any(s.kind == "jsonl" for s in sources):
        return None
    return len(sources)


def _decode(data, where):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepError(f"{where}: not valid UTF-8 at byte {e.start}") from None


def _jsonl_documents(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                where = f"{path}:{lineno}"
                line = _decode(raw, where)
                if not line.strip():
                    continue  # blank lines (a trailing newline, say) hold no document
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise PrepError(f"{where}: invalid JSON ({e.msg})") from None
                text = record.get("text") if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise PrepError(f'{where}: no string "text" field')
                yield text
    except (OSError, EOFError) as e:  # gzip errors (BadGzipFile is an OSError) included
        raise PrepError(f"{path}: cannot read ({e})") from None


def documents(sources):
    """Yields (where, text) for every document, in order; `where` names file (and line)."""
    for source in sources:
        if source.kind == "jsonl":
            for i, text in enumerate(_jsonl_documents(source.path)):
                yield f"{source.path}#{i}", text
        else:
            try:
                with open(source.path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise PrepError(f"{source.path}: cannot read ({e.strerror})") from None
            yield source.path, _decode(data, source.path)


def lines(sources):
    """Yields every non-empty line (without its newline) of every document, for training."""
    for _, text in documents(sources):
        for line in text.split("\n"):
            if line:
                yield line
