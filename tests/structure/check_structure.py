#!/usr/bin/env python3
"""The shape the code keeps (docs/design.md): checked from the sources, no build needed.

- files: no source file under src/, include/, apps/ or python/src/ over 400 lines; app mains
  (apps/*.cpp) at most 150;
- functions: no C++ function body in those folders over 80 lines (lambdas count in theirs);
- contracts: a header's opening comment (before its first #include) at most 15 lines;
- layers: an include goes only down the layers below (a folder may include itself and lower ones;
  models never reach the pipeline, data-parallel wrappers, hf or train; hf never train);
- public headers (include/tessera/) include no internal header (src/);
- the Python package imports no module that imports it back (no import circle).

usage: check_structure.py ROOT   (exit 0: all hold; 1: each violation printed)
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
problems = []

# Layers, lowest first: a file of layer i may include files of layers <= i (same layer: same folder).
LAYERS = [
    ["common"], ["comm"], ["data", "fp8", "checkpoint"], ["kernels"], ["nn", "optim"],
    ["parallel/tensor", "parallel/context", "parallel/process_mesh", "parallel/grad_norm", "parallel/param"],
    ["models", "parallel/pipeline", "parallel/data_parallel"], ["hf"], ["plan"], ["train"],
]
# Pairs of one layer that must not include each other either way: the models know no wrapper and
# no pipeline, and the wrappers and the pipeline are independent of each other (train/ composes them).
APART = [("models", "parallel/pipeline"), ("models", "parallel/data_parallel"),
         ("parallel/pipeline", "parallel/data_parallel")]
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def layer_of(rel):
    """(layer index, group) of a path relative to src/ or include/tessera/, or None."""
    if rel is None:
        return None
    best = None
    for i, groups in enumerate(LAYERS):
        for g in groups:
            if rel == g or rel.startswith(g + "/") or rel.startswith(g + "."):
                if best is None or len(g) > len(best[1]):
                    best = (i, g)
    return best


def rel_of(path):
    for base in (ROOT / "include" / "tessera", ROOT / "src"):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            pass
    return None


def code_files():
    for base in ("src", "include", "apps", "python/src"):
        for p in sorted((ROOT / base).rglob("*")):
            if p.suffix in SOURCES:
                yield p


def check_lengths():
    for p in code_files():
        n = len(p.read_text().splitlines())
        if n > 400:
            problems.append(f"{p.relative_to(ROOT)}: {n} lines (at most 400)")
    for p in sorted((ROOT / "apps").rglob("*.cpp")):
        n = len(p.read_text().splitlines())
        if p.parent == ROOT / "apps" and n > 150:
            problems.append(f"{p.relative_to(ROOT)}: {n} lines (an app's main file: at most 150)")


def check_openings():
    for p in code_files():
        if p.suffix != ".h":
            continue
        n = 0
        for line in p.read_text().splitlines():
            if line.startswith("#pragma"):
                continue
            if not line.startswith("//"):
                break
            n += 1
        if n > 15:
            problems.append(f"{p.relative_to(ROOT)}: an opening comment of {n} lines (at most 15: the contract; "
                            "the reasoning goes in docs/design/)")


def strip_code(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_lengths(text):
    """[(first line, lines)] of the bodies of functions at namespace or class scope."""
    code = strip_code(text)
    stack, out, line = [], [], 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            if any(kind == "fn" for kind, _ in stack):
                stack.append(("inner", line))
                continue
            head = code[max(0, i - 400):i]
            head = re.split(r"[;{}]", head)[-1]
            is_fn = ")" in head and not re.search(r"\b(namespace|class|struct|union|enum)\b", head) \
                and not re.search(r"=\s*$", head.strip()) and "(" in head
            stack.append(("fn" if is_fn else "scope", line))
        elif c == "}" and stack:
            kind, start = stack.pop()
            if kind == "fn":
                out.append((start, line - start + 1))
    return out


def check_functions():
    for p in code_files():
        for start, n in function_lengths(p.read_text()):
            if n > 80:
                problems.append(f"{p.relative_to(ROOT)}:{start}: a function of {n} lines (at most 80)")


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def target_of(inc):
    """A quoted include's path relative to src/ or include/tessera/, or None (a system or test file)."""
    if inc.startswith("tessera/") and (ROOT / "include" / inc).exists():
        return inc[len("tessera/"):], "public"
    if (ROOT / "src" / inc).exists():
        return inc, "internal"
    return None


def check_includes():
    for p in code_files():
        me = rel_of(p)
        mine = layer_of(me)
        public = p.is_relative_to(ROOT / "include")
        for inc in INCLUDE.findall(p.read_text()):
            t = target_of(inc)
            if t is None:
                continue
            rel, kind = t
            if public and kind == "internal":
                problems.append(f"{p.relative_to(ROOT)}: a public header includes the internal \"{inc}\"")
            theirs = layer_of(rel)
            if mine is None or theirs is None:
                continue
            if theirs[0] > mine[0]:
                problems.append(f"{p.relative_to(ROOT)}: includes \"{inc}\" of a higher layer ({theirs[1]} above {mine[1]})")
            if (mine[1], theirs[1]) in APART or (theirs[1], mine[1]) in APART:
                problems.append(f"{p.relative_to(ROOT)}: includes \"{inc}\" ({mine[1]} and {theirs[1]} stay apart)")


def check_python():
    pkg = ROOT / "python" / "tessera"
    mods = {}
    for p in sorted(pkg.rglob("*.py")):
        name = ".".join(p.relative_to(pkg.parent).with_suffix("").parts)
        name = name[: -len(".__init__")] if name.endswith(".__init__") else name
        mods[name] = p
    graph = {}
    for name, p in mods.items():
        package = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for m in re.finditer(r"^\s*from\s+(\.+)([\w.]*)\s+import\s+([\w, ()*]+)", p.read_text(), re.M):
            base = package.split(".")
            base = base[: len(base) - (len(m.group(1)) - 1)]
            target = ".".join(base + ([m.group(2)] if m.group(2) else []))
            if target in mods and target != name:
                deps.add(target)
            for sub in re.findall(r"\w+", m.group(3)):
                if f"{target}.{sub}" in mods:
                    deps.add(f"{target}.{sub}")
        graph[name] = deps
    # A package's __init__ importing its own modules is how a package is made, not a circle.
    state = {}

    def visit(n, path):
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if n.startswith(d + ".") or d.startswith(n + "."):
                continue
            if state.get(d) == 1:
                problems.append("python import circle: " + " -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


check_lengths()
check_openings()
check_functions()
check_includes()
check_python()
for p in problems:
    print("check_structure:", p)
print(f"check_structure: {len(problems)} problems")
sys.exit(1 if problems else 0)
