"""The command blocks of a Markdown file, their doc-test markers, and the flags that shrink them.

A block is a fenced block (``` or ~~~). Commands: sh, bash, shell and console (its `$ ` lines)
blocks. A python block is a program when marked `python N` (run under torchrun) or `file NAME`
(written for the blocks after it); otherwise it is a fragment, listed and not run. Other
languages (cpp, cmake, toml, output) are not commands.

Markers are HTML comments on the lines just above the fence, one or more:
  <!-- doc-test: skip (REASON) -->     not run anywhere; REASON is required
  <!-- doc-test: gpu N (REASON) -->    needs N GPUs (default 1): run by scripts/gpu-test, not on the CPU
  <!-- doc-test: python N -->          this python block runs under torchrun on N ranks
  <!-- doc-test: file NAME -->         this block's text is NAME for the later blocks of the same file
  <!-- doc-test: needs NAME ... -->    fixtures (tests/docs/fixtures.py) placed in its directory first
  <!-- doc-test: args FLAGS -->        flags appended to its train_gpt runs after the automatic ones
  <!-- doc-test: continues -->         runs in the directory the block above it left, not a fresh one
"""
import dataclasses
import re
import shlex

COMMAND_LANGS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
KINDS = {"skip", "gpu", "python", "file", "needs", "args", "continues"}

# Presets swapped for the smallest of their family; and what else a CPU run cannot take.
BIG_LLAMA = {"llama3-1b", "llama3-8b"}
BIG_GPT = {"small", "735m"}
TRAINERS = {"train_gpt", "train_llama.py", "my_trainer"}


class MarkerError(Exception):
    pass


@dataclasses.dataclass
class Block:
    doc: str            # the file, relative to the repository root
    line: int           # the line of the opening fence (1-based)
    lang: str
    text: str
    markers: dict       # kind -> (args, reason)

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    def kind(self):
        """skip | gpu | file | python | run | fragment | none (not a command block)."""
        for k in ("skip", "gpu", "file"):
            if k in self.markers:
                return k
        if "python" in self.markers:
            return "python"
        if self.lang in COMMAND_LANGS:
            return "run"
        return "fragment" if self.lang in ("python", "py") else "none"

    def gpus(self):
        args = self.markers.get("gpu", ("", ""))[0]
        return int(args) if args else 1

    def ranks(self):
        return int(self.markers["python"][0])

    def arg_list(self, kind):
        return shlex.split(self.markers.get(kind, ("", ""))[0])


def parse_marker(text, where):
    m = re.match(r"(\w[\w-]*)\s*(.*?)\s*(?:\((.*)\))?$", text)
    if not m or m.group(1) not in KINDS:
        raise MarkerError(f"{where}: unknown doc-test marker '{text}' (one of {', '.join(sorted(KINDS))})")
    kind, args, reason = m.group(1), m.group(2), (m.group(3) or "").strip()
    if kind == "skip" and not reason:
        raise MarkerError(f"{where}: 'doc-test: skip' needs a reason in parentheses")
    if kind == "gpu" and args and not args.isdigit():
        raise MarkerError(f"{where}: 'doc-test: gpu {args}': the GPU count must be a number")
    if kind == "python" and not args.isdigit():
        raise MarkerError(f"{where}: 'doc-test: python N' needs the rank count")
    if kind in ("file", "needs", "args") and not args:
        raise MarkerError(f"{where}: 'doc-test: {kind}' needs its argument")
    return kind, (args, reason)


def read_blocks(path, rel):
    """Every fenced block of the Markdown file `path` (named `rel` in reports)."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        markers, k = {}, i - 1
        while k >= 0 and MARKER.match(lines[k]):
            kind, value = parse_marker(MARKER.match(lines[k]).group(1), f"{rel}:{k + 1}")
            markers[kind] = value
            k -= 1
        i += 1
        body = []
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence))
                                      and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i])
            i += 1
        blocks.append(Block(rel, start + 1, lang, "\n".join(body) + "\n", markers))
        i += 1
    return blocks


def logical_lines(block):
    """The block's shell lines with their continuations joined; a console block's `$ ` lines only."""
    out, cur, keep = [], "", block.lang != "console"
    for raw in block.text.split("\n"):
        line = raw
        if block.lang == "console" and not cur:
            keep = line.startswith("$ ")
            line = line[2:] if keep else line
        if not keep:
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


def segments(line):
    """(start, end) of each simple command of a shell line: split at unquoted ;, & and |, and
    ended by an unquoted comment."""
    spans, start, i, quote, depth = [], 0, 0, None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "$" and line[i + 1:i + 2] == "(":
            depth += 1
            i += 1
        elif c == ")" and depth:
            depth -= 1
        elif not depth and c == "#" and (i == 0 or line[i - 1].isspace()):
            break
        elif c == "&" and (line[i - 1:i] in ("<", ">") or line[i + 1:i + 2] == ">"):
            pass  # a redirection: 2>&1, &>
        elif not depth and c in ";&|":
            spans.append((start, i))
            while i + 1 < len(line) and line[i + 1] in ";&|":
                i += 1
            start = i + 1
        i += 1
    spans.append((start, i))
    return spans


def value_of(tokens, *flags):
    """The last value of any of `flags` (`--f v` or `--f=v`) in tokens, else None."""
    found = None
    for k, t in enumerate(tokens):
        for f in flags:
            if t == f and k + 1 < len(tokens):
                found = tokens[k + 1]
            elif t.startswith(f + "="):
                found = t[len(f) + 1:]
    return found


def shrink_flags(tokens, cpu):
    """Flags appended to one command so that it runs in seconds: the trainers' steps, model,
    precision and sequence; the tokenizer's vocabulary; the generator's new tokens."""
    names = [t.rsplit("/", 1)[-1] for t in tokens]
    if TRAINERS & set(names):
        flags = ["--steps", "2", "--warmup", "0", "--eval-batches", "1"]
        model = value_of(tokens, "--model")
        if model in BIG_LLAMA:
            flags += ["--model", "llama-tiny"]
        elif model in BIG_GPT:
            flags += ["--model", "tiny"]
        if cpu and value_of(tokens, "--precision") == "bf16":
            flags += ["--precision", "fp32"]
        seq = value_of(tokens, "--seq-len", "--seq-length")
        if seq and seq.isdigit() and int(seq) > 64:
            flags += ["--seq-len", "64"]
        return flags
    if "tessera-prep" in names and "train-tokenizer" in tokens:
        return ["--vocab-size", "1000"]
    if "tessera-generate" in names:
        return ["--max-new-tokens", "4"]
    return []


def shrink_line(line, extra, cpu):
    """`line` with the shrinking flags (and a trainer's `extra`) after each command that takes them."""
    out, last = [], 0
    for a, b in segments(line):
        seg = line[a:b]
        try:
            tokens = shlex.split(seg)
        except ValueError:
            tokens = []
        flags = shrink_flags(tokens, cpu)
        if flags and TRAINERS & {t.rsplit("/", 1)[-1] for t in tokens}:
            flags += extra
        end = a + len(seg.rstrip())
        out.append(line[last:end] + "".join(" " + shlex.quote(f) for f in flags))
        last = end
    out.append(line[last:])
    return "".join(out)
