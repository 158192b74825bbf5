"""Runs a tool under an interpreter that has its modules.

The tools start with `#!/usr/bin/env python3`, which on many machines is not Debian's
/usr/bin/python3 (pyenv, conda, a venv) and then lacks numpy, sentencepiece or matplotlib that
scripts/setup installs for /usr/bin/python3. require() re-executes the tool there when a module
is missing here and present there, and otherwise exits with a message naming the module.
"""
import importlib.util
import os
import sys

DEBIAN_PYTHON = "/usr/bin/python3"


def require(tool, modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    here = os.path.realpath(sys.executable)
    if os.path.exists(DEBIAN_PYTHON) and os.path.realpath(DEBIAN_PYTHON) != here \
            and not os.environ.get("TESSERA_TOOL_REEXEC"):
        os.environ["TESSERA_TOOL_REEXEC"] = "1"
        os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(sys.argv[0])] + sys.argv[1:])
    sys.exit(f"{tool}: needs the Python module(s) {', '.join(missing)}, missing in {sys.executable}"
             f" (scripts/setup installs them for {DEBIAN_PYTHON})")
