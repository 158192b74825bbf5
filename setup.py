"""pip install for tessera's Python package: builds libtessera and tessera._C with CMake
against the running interpreter's torch, then packs them with python/tessera/*.py.

No network is needed when the build tools are already installed (they are, via scripts/setup):

    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages .   # Debian's python
    python3 -m pip install --no-build-isolation .                                    # in a venv

(--no-build-isolation: use the installed setuptools instead of fetching one; Debian marks its
system Python externally managed, hence --break-system-packages or a venv made with
--system-site-packages so that torch is visible.) CMake options: TESSERA_CMAKE_ARGS, e.g.
"-DTESSERA_WITH_CUDA=OFF"; build directory: TESSERA_PIP_BUILD_DIR (default build/pip; an
existing, configured build directory such as build/ is reused with its options, which saves a
full rebuild).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(tessera VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("TESSERA_PIP_BUILD_DIR", os.path.join(ROOT, "build", "pip"))
        prefix = os.path.abspath(self.build_lib)
        args = ["cmake", "-S", ROOT, "-B", build, f"-DTESSERA_PYTHON={sys.executable}"]
        fresh = not os.path.exists(os.path.join(build, "CMakeCache.txt"))
        if fresh:  # an existing build dir (e.g. TESSERA_PIP_BUILD_DIR=build) keeps its options
            args += ["-DTESSERA_BUILD_TESTS=OFF", "-DTESSERA_BUILD_EXAMPLES=OFF"]
        try:
            import torch.utils
            args.append(f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}")
        except ImportError:
            sys.exit("tessera: torch must be importable by this interpreter (the module is built against it)")
        if fresh and shutil.which("ninja"):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("TESSERA_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        subprocess.check_call(["cmake", "--build", build, "--target", "tessera_python",
                               "--parallel", str(os.cpu_count() or 2)])
        if not os.path.exists(os.path.join(build, "python", "tessera")):
            sys.exit("tessera: CMake skipped the Python module (see its 'tessera: Python module' message)")
        subprocess.check_call(["cmake", "--install", build, "--component", "python", "--prefix", prefix])


setup(
    name="tessera",
    version=version(),
    description="Distributed training runtime (DDP, FSDP, TP, PP) in C++ on LibTorch, NCCL and Gloo",
    packages=["tessera", "tessera.nn"],
    package_dir={"": "python"},
    ext_modules=[Extension("tessera._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    zip_safe=False,
)
