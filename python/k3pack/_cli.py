"""The `k3pack` console entry point of the wheel: runs the k3pack binary
that `pip install` built and installed beside this package (k3pack/bin/),
or $K3PACK_BIN, or a checkout's build/k3pack."""

import os
import sys


def _binary():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("K3PACK_BIN"), os.path.join(here, "bin", "k3pack"),
                  os.path.join(os.path.dirname(os.path.dirname(here)), "build", "k3pack")]
    for path in candidates:
        if path and os.path.isfile(path):
            if not os.access(path, os.X_OK):
                try:  # a wheel unpacked without its mode bits
                    os.chmod(path, 0o755)
                except OSError:
                    continue
            return path
    return None


def main():
    binary = _binary()
    if binary is None:
        sys.stderr.write("k3pack: the k3pack binary was not installed with the Python package; "
                         "reinstall with `pip install .` from a checkout, or set K3PACK_BIN\n")
        return 1
    os.execv(binary, [binary] + sys.argv[1:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
