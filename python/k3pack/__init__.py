"""k3pack: Kimi-K3 GGUF checkpoints -> SGLang-compatible expert pack, manifest,
non-routed weight streaming and expert store, from Python.

The heavy lifting is C++ (the `_k3pack` extension built by CMake into this
folder); this package adds Python-shaped wrappers. Arrays are zero-copy,
read-only numpy views whose base keeps the C++ file mapping alive.

Errors are raised as the Python exception SGLang raises for the same
condition (ValueError, KeyError, FileNotFoundError, ...), with SGLang's text
as the message; a k3pack hint, when there is one, is attached as a note
(visible in tracebacks) and as the `k3pack_hint` attribute.

Every path argument, positional or keyword, may be a str or an os.PathLike
(pathlib.Path, ...), as SGLang's `str | os.PathLike[str]` parameters are.

torch is never imported here; `k3pack.sglang` is the torch adapter.
"""

try:
    from . import _k3pack
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "k3pack's C++ extension (_k3pack) is not built or does not match this Python. "
        "Build it with `make` (or `cmake -S . -B build -DK3_PYTHON=ON && cmake --build build "
        "--target _k3pack`) and put <repo>/python on PYTHONPATH, or `pip install .` "
        "(original error: %s)" % exc
    ) from exc

from ._k3pack import GGUFFile, GGUFTensor, ShardSet, ggml_type_info, ggml_types  # noqa: E402
from ._paths import accept_paths_in as _accept_paths_in, accepts_paths as _accepts_paths  # noqa: E402

# The bindings take std::string: os.PathLike paths are converted in Python.
_accept_paths_in(GGUFFile)
_accept_paths_in(ShardSet, "discover")
parse_shard_name = _accepts_paths(_k3pack.parse_shard_name)

__version__ = _k3pack.__version__

__all__ = [
    "GGUFFile", "GGUFTensor", "ShardSet", "ggml_type_info", "ggml_types", "parse_shard_name",
    "__version__",
]

from ._loader import *  # noqa: E402,F401,F403  (non-expert weight streaming)
from ._loader import __all__ as _loader_all  # noqa: E402

__all__ += _loader_all

from ._ops import *  # noqa: E402,F401,F403  (quant, pack, manifest, store)
from ._ops import __all__ as _ops_all  # noqa: E402

__all__ += _ops_all


def _warn_of_an_ignored_isa_cap():
    # A typo in the debugging knob would leave dequantize on the fastest path
    # without a word, so a comparison meant to run the scalar code would not.
    value = _k3pack._ignored_isa_cap()
    if value:
        import warnings
        warnings.warn("K3PACK_QUANT_ISA=%r names none of scalar, avx2, avx512, auto and is ignored; dequantize "
                      "uses %s" % (value, _k3pack.quant_isa()), RuntimeWarning, stacklevel=3)


_warn_of_an_ignored_isa_cap()
