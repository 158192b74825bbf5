"""The RESULT lines benchmark runs print (bench/common/timing.h, bench/torch_anchor.py,
bench/ddp/torch_ddp.py): one "RESULT {json}" per run on rank 0, possibly behind torchrun's
"[defaultN]:" prefix. Shared by the combiners (bench/ddp/combine.py, bench/combine_parallel.py)."""
import json
import os
import re
import sys


def read_results(path):
    """Every RESULT object in the log at `path`; an unreadable line is reported on stderr and skipped."""
    found = []
    with open(path, errors="replace") as f:
        for line in f:
            line = re.sub(r"^\[\w+\d*\]:", "", line.strip())
            if line.startswith("RESULT "):
                try:
                    found.append(json.loads(line[len("RESULT "):]))
                except ValueError:
                    print("%s: unreadable RESULT line in %s: %s" % (os.path.basename(sys.argv[0]), path, line),
                          file=sys.stderr)
    return found
