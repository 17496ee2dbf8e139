"""Builds k3pack's C++ extension (_k3pack) with the project's CMake and
installs the python/k3pack package around it.

    /usr/bin/python3 -m pip install --no-build-isolation .        # venv / user
    /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages .   # Debian system

Environment:
    K3PACK_BUILD_DIR   CMake build directory to use (default: <repo>/build when `make`
                       configured it, else <repo>/build-pip)
    K3PACK_CMAKE_ARGS  extra configure arguments (space separated)
    K3PACK_JOBS        parallel build jobs (default: CPU count)
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
        subprocess.check_call(args)
        jobs = os.environ.get("K3PACK_JOBS") or str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_k3pack", "-j", jobs])
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(ROOT, "python", "k3pack", "_k3pack" + suffix)
        if not os.path.exists(built):
            found = glob.glob(os.path.join(ROOT, "python", "k3pack", "_k3pack*.so"))
            raise RuntimeError("CMake did not produce %s (found: %s); is pybind11-dev installed?" % (built, found))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)


setup(
    ext_modules=[Extension("k3pack._k3pack", sources=[])],
    cmdclass={"build_ext": CMakeBuildExt},
    # Keep setuptools' staging out of <repo>/build, which is `make`'s CMake tree.
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")}},
)
