"""Drop-in replacements for SGLang's
sglang.srt.model_loader.kimi_k3_gguf.kimi_k3_nonexpert_weights_iterator and
sglang.srt.layers.moe.expert_pack.KimiGGMLExpertPackStore (the latter in
_sglang_store.py); install_into_sglang(store=True) swaps both in.

    from k3pack.sglang import kimi_k3_nonexpert_weights_iterator
    for name, tensor in kimi_k3_nonexpert_weights_iterator(manifest_path):
        ...

Same names, same order, same shapes, same exception types and texts as
SGLang's function (spec: sglang-expert-pack.md 5.3 and 6.4). torch is imported
only by this module.

Differences, all deliberate and documented (docs/python.md):
  * BF16 tensors are torch.bfloat16 in element shape. SGLang yields their raw
    bytes as a uint8 tensor with a doubled last axis, which no model parameter
    accepts (spec 11.1). Pass sglang_compat=True for SGLang's exact output
    (this also turns off k3pack's ssm_a shape check).
  * By default the tensors are zero-copy views of the memory-mapped GGUF file
    (SGLang copies every tensor with torch.tensor()). The mapping is private
    copy-on-write: an in-place write (t.mul_(2)) changes a private page, never
    the file, and never crashes the process; but once the iterator moves on
    such a page is dropped (back to the file's bytes). Model loaders copy the
    tensors into parameters (param.data.copy_), which is fine; pass copy=True
    to get fresh, owned tensors as SGLang does. install_into_sglang() makes
    copy=True SGLang's default.
  * Errors carry a k3pack hint as an exception note (shown in tracebacks, not
    part of str(exc)), so messages compare equal to SGLang's.
  * A_log = log(-ssm_a) is correctly rounded by default (computed in double,
    rounded once). With sglang_compat=True it is computed by torch itself,
    torch.log(-raw) on the tensor SGLang builds, so its bytes equal SGLang's
    on the same torch (torch's vectorized log is off by 1 ulp for ~1% of
    float32 values).
"""

import numpy as np

from ._loader import nonexpert_tensors

from ._sglang_store import KimiGGMLExpertPackStore  # noqa: E402

__all__ = ["kimi_k3_nonexpert_weights_iterator", "to_torch", "install_into_sglang", "KimiGGMLExpertPackStore"]

_torch = None


def _torch_module():
    global _torch
    if _torch is None:
        import torch

        _torch = torch
    return _torch


class _ArrayAlias:
    """Exposes another array's bytes through the array interface, marked
    writable, and keeps that array (the owner of the bytes) alive."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, array):
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)  # (pointer, read_only)
        self.__array_interface__ = interface
        self._owner = array


def _writable_alias(array):
    """A writable numpy array over `array`'s bytes, for torch.from_numpy, when
    a write through it stays private: k3pack's stream arrays and GGUFFile's
    private copy-on-write mappings, where it lands in a page of its own, never
    the file. Any other array is returned as it is (torch then warns, as it
    does for anyone's read-only array): an ExpertStore view is the store's
    shared cache, and a GGUFFile view past its private mappings is the file's
    read-only mapping (a write kills the process). Any k3pack capsule used to
    pass, and those were aliased without the warning."""
    if array.flags.writeable:
        return array
    from . import _k3pack

    if not _k3pack._writes_stay_private(array):
        return array
    return np.asarray(_ArrayAlias(array))


def to_torch(array, dtype_name, copy=False):
    """numpy array (as k3pack hands it out) -> torch tensor of dtype_name.
    dtype_name is the record's dtype ("bfloat16": the array holds uint16 bit
    patterns; otherwise it must name the array's own dtype: TypeError if
    not, rather than a tensor of reinterpreted bytes). copy=False shares the
    memory (the stream's and GGUFFile's arrays are private copy-on-write
    mappings: a write through the tensor never reaches the file; for other
    read-only arrays, an ExpertStore view included, torch warns that the
    array is not writable, and a write reaches whatever else shares the
    bytes); copy=True makes a fresh, writable tensor (one plain
    memcpy, like SGLang's torch.tensor())."""
    torch = _torch_module()
    if dtype_name == "bfloat16":
        # numpy has no bfloat16: reinterpret the uint16 bits.
        if array.dtype.kind not in "iu" or array.dtype.itemsize != 2:
            raise TypeError(f"to_torch: bfloat16 values must be uint16 bit patterns, got a {array.dtype} array")
        if not array.dtype.isnative:
            # A big-endian ('>u2') array viewed as int16 would be the bfloat16 of its swapped bytes.
            array = array.astype(array.dtype.newbyteorder("="))
        array = array.view(np.int16)
    elif np.dtype(dtype_name) != array.dtype:
        raise TypeError(f"to_torch: dtype_name {dtype_name!r} does not match the array's dtype {array.dtype}")
    if copy:
        tensor = torch.from_numpy(np.array(array))
    else:
        # torch has no read-only tensors and warns when handed a read-only
        # array. A tensor from this array is writable either way, so it is
        # made from a writable alias of the same bytes, which torch takes
        # without a warning. (Silencing the warning with
        # warnings.catch_warnings() swapped the process's global filter list:
        # two threads converting at once could leave an "ignore UserWarning"
        # filter installed for good.)
        tensor = torch.from_numpy(_writable_alias(array))
    if dtype_name == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


def kimi_k3_nonexpert_weights_iterator(manifest_path, *, sglang_compat=False, copy=False, verify_metadata=False,
                                       release_pages=True):
    """Yields (name, torch.Tensor) for every non-routed Kimi-K3 weight of the
    manifest's GGUF shards, as SGLang's function of the same name does."""
    _torch_module()
    # copy=True reads each tensor into a fresh buffer of its own (no view of
    # the mapping is copied, so memory stays bounded by about one tensor).
    stream = nonexpert_tensors(manifest_path, sglang_compat=sglang_compat, verify_metadata=verify_metadata,
                               release_pages=release_pages, copy=copy)
    a_log = _TorchALog(stream.manifest_path) if sglang_compat else None
    for record in stream:
        if a_log is not None and record.kind == "a_log":
            yield record.name, a_log(record)
            continue
        yield record.name, to_torch(record.array, record.dtype)


class _TorchALog:
    """SGLang's A_log, computed as SGLang computes it: torch.log(-raw), raw
    being torch.tensor() of gguf-py's view of the ssm_a tensor. k3pack's
    stream has already applied SGLang's checks (and raised its errors)."""

    def __init__(self, manifest_path):
        import json

        with open(manifest_path, encoding="utf-8") as f:
            shards = json.load(f)["source"]["shards"]
        self._paths = {int(s["index"]): s["path"] for s in shards}
        self._files = {}

    def __call__(self, record):
        from . import _k3pack

        torch = _torch_module()
        shard = self._files.get(record.shard_index)
        if shard is None:
            # As the stream that handed out the record (and gguf-py): tensors
            # need not be packed end to end.
            shard = self._files[record.shard_index] = _k3pack.GGUFFile(
                self._paths[record.shard_index], require_packed_offsets=False
            )
        raw = torch.tensor(np.array(shard.tensor_data(record.source_name, "gguf")))
        try:
            return torch.log(-raw)
        except RuntimeError:
            if raw.dtype != torch.float16:
                raise
            # torch before 2.1 has no CPU log for Half; later ones take it in
            # float and round to half, as this does.
            return torch.log(-raw.float()).to(torch.float16)


SGLANG_MODULE = "sglang.srt.model_loader.kimi_k3_gguf"
SGLANG_STORE_MODULE = "sglang.srt.layers.moe.expert_pack"


def _make_copying_iterator(iterator):
    """kimi_k3_nonexpert_weights_iterator with copy=True unless told
    otherwise. It holds the function itself, not this module's global of
    that name, so nothing rebinding the global can make it call itself."""

    def _copying_iterator(manifest_path, **kwargs):
        """kimi_k3_nonexpert_weights_iterator with copy=True unless told
        otherwise: fresh tensors, as SGLang's own iterator yields."""
        kwargs.setdefault("copy", True)
        return iterator(manifest_path, **kwargs)

    return _copying_iterator


_copying_iterator = _make_copying_iterator(kimi_k3_nonexpert_weights_iterator)

# What install_into_sglang puts into SGLang's modules, fixed at import: every
# one of them is k3pack's ("ours"), whatever an install did before.
_ITERATORS = {True: _copying_iterator, False: kimi_k3_nonexpert_weights_iterator}
_STORE = KimiGGMLExpertPackStore
_OURS = {
    "kimi_k3_nonexpert_weights_iterator": (_copying_iterator, kimi_k3_nonexpert_weights_iterator),
    "KimiGGMLExpertPackStore": (_STORE,),
}
# Only an install hands out _copying_iterator: any module holding it got it from SGLang's.
_ONLY_FROM_SGLANG = (_copying_iterator,)
_PACKAGE = __name__.rpartition(".")[0]  # "k3pack": its modules are never patched
_sglang_originals = {}  # attribute -> SGLang's own objects seen in its module
_patched_modules = {}  # attribute -> weakref.WeakSet of the modules an install patched


def _is_one_of(obj, objects):
    return any(obj is o for o in objects)


def _replace_everywhere(target_module, attribute, replacement):
    """Sets `attribute` on the SGLang module and on every other loaded module
    that holds SGLang's binding of it: SGLang's own object (a `from ...
    import name` binding), k3pack's replacement in a module of the sglang
    package or one an earlier install patched, or the private copying
    iterator (only an install hands it out). k3pack's own modules are never
    patched, nor is a module that imported k3pack's public function or class
    from k3pack itself. So repeated installs, in any order, switch what
    SGLang's modules hold."""
    import sys
    import weakref

    target = _import_sglang_module(target_module)
    ours = _OURS[attribute]
    originals = _sglang_originals.setdefault(attribute, [])
    current = getattr(target, attribute, None)
    if current is not None and not _is_one_of(current, ours) and not _is_one_of(current, originals):
        originals.append(current)
    patched_before = _patched_modules.setdefault(attribute, weakref.WeakSet())
    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or name == _PACKAGE or name.startswith(_PACKAGE + "."):
            continue
        current = getattr(module, attribute, None)
        if current is None:
            continue
        if module is target or _is_one_of(current, originals) or _is_one_of(current, _ONLY_FROM_SGLANG):
            pass
        elif not _is_one_of(current, ours):
            continue
        elif not (name == "sglang" or name.startswith("sglang.") or _was_patched(module, patched_before)):
            continue  # k3pack's own object, imported from k3pack by someone else
        setattr(module, attribute, replacement)
        try:
            patched_before.add(module)
        except TypeError:  # not weak-referenceable (an odd sys.modules entry)
            pass
        patched.append(name)
    return patched


def _import_sglang_module(name):
    """SGLang's module `name`. Python's bare "No module named 'sglang'" does
    not say which interpreter looked, nor that an SGLang without the Kimi-K3
    GGUF path is too old: both are said, as the same ModuleNotFoundError. A
    module SGLang's own code imports that is missing keeps its own error."""
    import importlib
    import sys

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or not (name == missing or name.startswith(missing + ".")):
            raise
        if missing == "sglang":
            why = "SGLang is not installed for this Python (%s)" % sys.executable
            fix = "install SGLang into it, or run under the Python that has SGLang"
        else:
            why = "this SGLang has no module %s (a version without the Kimi-K3 GGUF path)" % missing
            fix = "use an SGLang with the Kimi-K3 GGUF expert-pack loader"
        raise ModuleNotFoundError(
            "k3pack.sglang.install_into_sglang: %s, so there is no %s to patch; %s (k3pack's iterator and store "
            "work without SGLang: kimi_k3_nonexpert_weights_iterator, KimiGGMLExpertPackStore)" % (why, name, fix),
            name=missing) from exc


def _was_patched(module, patched_before):
    try:
        return module in patched_before
    except TypeError:
        return False


def install_into_sglang(*, copy=True, store=False):
    """Makes SGLang use k3pack: imports SGLang's kimi_k3_gguf module and
    replaces its kimi_k3_nonexpert_weights_iterator, plus every
    `from ... import kimi_k3_nonexpert_weights_iterator` binding already made
    in loaded modules. With store=True it also replaces
    KimiGGMLExpertPackStore in sglang.srt.layers.moe.expert_pack (and every
    loaded module that imported it), so the routed experts are served by
    k3pack's slot cache. Call it before the model loads. Returns the names of
    the modules patched. Raises ImportError when SGLang is not installed.

    copy=True (the default) yields fresh tensors, as SGLang's own iterator
    does, so SGLang may do anything with them; copy=False yields zero-copy
    views of the mapping (no copy, less memory; writes stay private and may
    be dropped, see the module docstring).

    It may be called again, in any order of copy and store: each call
    switches SGLang's modules to the iterator it asks for (store=False
    leaves the store class as it is: k3pack's after an earlier store=True).
    k3pack's own modules are never patched."""
    patched = _replace_everywhere(SGLANG_MODULE, "kimi_k3_nonexpert_weights_iterator", _ITERATORS[bool(copy)])
    if store:
        patched += _replace_everywhere(SGLANG_STORE_MODULE, "KimiGGMLExpertPackStore", _STORE)
    return sorted(set(patched))
