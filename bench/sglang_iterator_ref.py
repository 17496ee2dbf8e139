"""A stand-in for SGLang's non-expert weight iterator, for benchmarks only.

SGLang (and gguf-py, which its iterator reads GGUF files with) cannot be
installed on the development machine (no PyPI), so bench_python_loader.py
times this model of its data path instead, written from the compatibility
spec (docs of the shared spec, §5.3), sharing no code with k3pack:

  * each shard is opened as gguf-py opens it: one numpy.memmap of the whole
    file, tensors as numpy views of that mapping (reversed-ne shape for
    F32/F16, a uint8 byte matrix for everything else, BF16 included);
  * routed aggregates (blk.N.ffn_{gate,up,down}_exps.weight) are skipped
    without touching their pages;
  * every other tensor becomes `torch.tensor(view)`: a copy made through page
    faults on the mapping; ssm_a becomes log(-raw) after the finite/negative
    check; a residual score vector yields [1, d] and a ones vector;
  * quantized weights are preceded by a 0-D uint8 qweight_type tensor.

It is a lower bound on SGLang's time, not SGLang itself: the header is parsed
with `struct` (gguf-py builds a numpy view per field and per array element,
which is most of SGLang's 9.9 s header scan at full scale), and names are not
mapped to SGLang's runtime names. A k3pack speed-up measured against it is
therefore smaller than the one against SGLang's own iterator.
"""
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "manifest"))
import sglang_manifest_ref as gguf_ref  # noqa: E402  (struct-only GGUF header reader)

ROUTED = re.compile(r"^blk\.\d+\.ffn_(?:gate|up|down)_exps\.weight$")
RESIDUAL_SCORE = re.compile(r"_res_score\.weight$")
UNQUANTIZED = {"F32": np.float32, "F16": np.float16}


def _view(mm, t):
    raw = mm[t["data_offset"]:t["data_offset"] + t["nbytes"]]
    dtype = UNQUANTIZED.get(t["dtype"])
    if dtype is not None:
        return raw.view(dtype).reshape(list(reversed(t["shape"])))
    rows = 1
    for d in t["shape"][1:]:
        rows *= d
    return raw.reshape(rows, t["nbytes"] // max(rows, 1))


def iterate(shard_paths):
    """Yields (name, torch.Tensor) in shard order, then GGUF tensor order."""
    import torch

    for path in shard_paths:
        _, tensors, _, data = gguf_ref.read_gguf(path)
        data.close()
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for t in tensors:
            name = t["name"]
            if ROUTED.match(name):
                continue
            raw = torch.tensor(_view(mm, t))
            if t["dtype"] not in ("F32", "F16", "BF16"):
                yield name.rsplit("weight", 1)[0] + "qweight_type", torch.tensor(t["dtype_id"], dtype=torch.uint8)
                yield name, raw
            elif name.endswith(".ssm_a"):
                if not (raw.is_floating_point() and bool(torch.isfinite(raw).all())):
                    raise ValueError("Kimi-K3 GGUF ssm_a must contain finite floating values")
                if not bool((raw < 0).all()):
                    raise ValueError("Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values")
                yield name, torch.log(-raw)
            elif RESIDUAL_SCORE.search(name):
                if raw.dim() != 1:
                    raise ValueError(f"Kimi-K3 attention-residual score must be a vector, got {tuple(raw.shape)}")
                yield name, raw.unsqueeze(0)
                yield name + ".norm", torch.ones_like(raw)
            else:
                yield name, raw
        del mm
