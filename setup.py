"""Builds k3pack's C++ extension (_k3pack) with the project's CMake and
installs the python/k3pack package around it.

    /usr/bin/python3 -m pip install --no-build-isolation .        # venv / user
    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages .   # Debian system

Environment:
    K3PACK_BUILD_DIR   CMake build directory to use (default: <repo>/build when `make`
                       configured it, else <repo>/build-pip)
    K3PACK_CMAKE_ARGS  extra configure arguments (space separated)
    K3PACK_JOBS        parallel build jobs (default: CPU count)
    K3PACK_QUIET_BUILD =1: do not echo CMake's progress to the terminal

pip hides a build's output unless run with -v; CMake's progress lines are
echoed to the terminal (/dev/tty) as well, so a build of a few minutes does
not look hung. The wheel holds the extension, the `k3pack` binary (k3pack/bin/,
started by the `k3pack` console script) and the Python package.
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _open_terminal():
    """The terminal pip runs in, when pip captures our output; else None."""
    if os.environ.get("K3PACK_QUIET_BUILD") == "1" or sys.stdout.isatty():
        return None
    try:
        return open("/dev/tty", "w")
    except OSError:
        return None


def _run(cmd):
    """Runs a build step; its output goes to pip's log and, line by line, to
    the terminal when pip hides it."""
    tty = _open_terminal()
    line = "k3pack build: " + " ".join(shlex.quote(c) for c in cmd) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    if tty is None:
        subprocess.check_call(cmd)
        return
    with tty:
        tty.write(line)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:
            sys.stdout.write(line)
            tty.write("k3pack build: " + line)
            tty.flush()
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)


class CMakeBuildExt(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("K3PACK_BUILD_DIR")
        if not build_dir:
            build_dir = os.path.join(ROOT, "build")
            if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
                build_dir = os.path.join(ROOT, "build-pip")
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DK3_PYTHON=ON", "-DPython3_EXECUTABLE=" + sys.executable]
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            # A fresh build directory; an existing one keeps its generator and build type.
            args += ["-DCMAKE_BUILD_TYPE=Release"]
            if shutil.which("ninja"):
                args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("K3PACK_CMAKE_ARGS", ""))
        _run(args)
        jobs = os.environ.get("K3PACK_JOBS") or os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        _run(["cmake", "--build", build_dir, "--target", "_k3pack", "k3pack", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(ROOT, "python", "k3pack", "_k3pack" + suffix)
        if not os.path.exists(built):
            found = glob.glob(os.path.join(ROOT, "python", "k3pack", "_k3pack*.so"))
            raise RuntimeError("CMake did not produce %s (found: %s); is pybind11-dev installed?" % (built, found))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)
        # The CLI, for the `k3pack` console script (k3pack/_cli.py).
        bin_dir = os.path.join(os.path.dirname(dest), "bin")
        os.makedirs(bin_dir, exist_ok=True)
        shutil.copy2(os.path.join(build_dir, "k3pack"), os.path.join(bin_dir, "k3pack"))


setup(
    ext_modules=[Extension("k3pack._k3pack", sources=[])],
    cmdclass={"build_ext": CMakeBuildExt},
    # Keep setuptools' staging out of <repo>/build, which is `make`'s CMake tree.
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")}},
)
