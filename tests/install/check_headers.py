#!/usr/bin/env python3
"""Checks tessera's installed headers: every header a public header includes with quotes is
installed too (so no public header includes an internal one), and every installed header is
reached from <tessera/tessera.h> (so compiling that one include compiles them all).

usage: check_headers.py PREFIX/include
Exit 0 when both hold; otherwise 1, naming each offending header and include."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
headers = {p.relative_to(root).as_posix() for p in (root / "tessera").rglob("*.h")}
problems = []
if "tessera/tessera.h" not in headers:
    problems.append(f"{root}/tessera/tessera.h is not installed")
graph = {}
for h in sorted(headers):
    graph[h] = include.findall((root / h).read_text())
    for inc in graph[h]:
        if inc not in headers:
            problems.append(f"{h} includes \"{inc}\", which is not installed (internal or missing)")
seen, todo = set(), ["tessera/tessera.h"]
while todo:
    h = todo.pop()
    if h in seen or h not in graph:
        continue
    seen.add(h)
    todo.extend(graph[h])
for h in sorted(headers - seen):
    problems.append(f"{h} is installed but not reached from tessera/tessera.h")
for p in problems:
    print("check_headers:", p)
print(f"check_headers: {len(headers)} installed headers, {len(problems)} problems")
sys.exit(1 if problems else 0)
