"""Non-routed weight streaming (binds include/k3pack/loader.h)."""

import json
import os
import stat

from . import _k3pack
from ._paths import accept_paths_in, fspath_str

__all__ = ["NonExpertStream", "NonExpertTensor", "nonexpert_weights", "nonexpert_tensors", "ssm_a_to_a_log"]

NonExpertStream = accept_paths_in(_k3pack.NonExpertStream)
NonExpertTensor = _k3pack.NonExpertTensor


def nonexpert_tensors(manifest_path, *, sglang_compat=False, verify_metadata=False, release_pages=True,
                      drop_page_cache=False, copy=False):
    """Iterates NonExpertTensor records (name, array, dtype, kind, source_name,
    zero_copy, source_type, shard_index) in SGLang's order.

    sglang_compat=True reproduces SGLang's own behaviour where k3pack corrects
    it: BF16 tensors as raw uint8 bytes (last axis doubled) and no ssm_a shape
    check. By default BF16 tensors come out as uint16 arrays holding the
    bfloat16 bit patterns, with record.dtype == "bfloat16".
    verify_metadata=True also checks the manifest's whole source section
    against the shards before the first tensor (metadata and whole-file
    SHA-256, every tensor record, the recomputed inventory_sha256), as
    `k3pack verify` does (SGLang checks only sizes, names and dtypes).
    copy=True hands out every array as a fresh, writable buffer of its own
    (what SGLang's torch.tensor() copies give), read from the file with
    pread rather than through the memory map: no shard page is mapped into
    the process, so a consumer that keeps only the current tensor peaks at
    about two tensors' worth of memory instead of a tensor plus its mapped
    pages plus a second copy. Use it instead of copying the zero-copy views.
    """
    path = fspath_str(manifest_path, "manifest_path")
    try:
        return _k3pack.NonExpertStream(path, sglang_compat=sglang_compat, verify_metadata=verify_metadata,
                                       release_pages=release_pages, drop_page_cache=drop_page_cache, copy=copy)
    except (OSError, ValueError) as exc:
        failure = exc
    # SGLang reads the manifest with open() + json.load: an unreadable file or
    # malformed JSON raises Python's own exception (FileNotFoundError
    # "[Errno 2] ...", json.JSONDecodeError "Expecting value: ..."). Reproduce
    # those exactly; every other error is k3pack's (with SGLang's text). A
    # named pipe or a device, which k3pack refuses without reading, is never
    # opened here: open() waited on a pipe forever.
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise failure
    # A shard, pack or trace given where the manifest goes, which k3pack names
    # from its first bytes: json.load read it whole (a shard is tens of GB)
    # only to fail on its first byte.
    kinds = ("a GGUF file", "an Expert Pack", "a k3pack routing trace")
    if str(failure).split("\n", 1)[0] in {"%s is %s, not a manifest" % (path, kind) for kind in kinds}:
        raise failure
    with open(path, encoding="utf-8") as f:
        json.load(f)
    raise failure


def nonexpert_weights(manifest_path, **options):
    """Yields (name, numpy.ndarray) pairs exactly as SGLang's
    kimi_k3_nonexpert_weights_iterator yields (name, tensor) pairs: same names,
    same order, same shapes. Arrays are read-only and zero-copy where the value
    is the stored tensor (their base keeps the file mapping alive).
    BF16 values are uint16 bit patterns (see nonexpert_tensors for the dtype
    name, or use k3pack.sglang for torch tensors). Options: see
    nonexpert_tensors (copy=True: fresh writable arrays, bounded memory)."""
    for record in nonexpert_tensors(manifest_path, **options):
        yield record.name, record.array


def ssm_a_to_a_log(values, dtype=None):
    """A_log = log(-ssm_a) with SGLang's checks (ValueError texts of spec 6.4).
    values: float32/float16 array, or uint16 bfloat16 bits with dtype="bfloat16"."""
    import numpy as np

    arr = np.asarray(values)
    if dtype == "bfloat16":
        # A view of other bytes as bfloat16 would be other values, silently.
        if arr.dtype.kind not in "iu" or arr.dtype.itemsize != 2:
            raise TypeError(f"dtype='bfloat16' takes uint16 bit patterns, got a {arr.dtype} array")
        if not arr.dtype.isnative:
            # A big-endian ('>u2') array viewed as uint16 would be the bfloat16 of its swapped bytes.
            arr = arr.astype(arr.dtype.newbyteorder("="))
        arr = arr.view(np.uint16)
    elif dtype is not None and np.dtype(dtype) != arr.dtype:
        raise TypeError(f"dtype={dtype!r} does not match the array's dtype {arr.dtype} (None: the array's own)")
    elif arr.dtype == np.uint16:
        raise TypeError("uint16 input must say dtype='bfloat16'")
    elif arr.dtype.kind != "f":
        # SGLang's check of a tensor that is not floating point.
        raise ValueError("Kimi-K3 GGUF ssm_a must contain finite floating values")
    elif arr.dtype not in (np.float32, np.float16):
        # float64 (a plain list of floats): checked as the float32 it is loaded as.
        arr = arr.astype(np.float32)
    return _k3pack.ssm_a_to_a_log(arr)
