"""k3pack.dequantize against an independent numpy reference (quant_ref.py,
written from the spec's block layouts), bit for bit, on every code path the
CPU has: the scalar decoders and AVX2 (forced with K3PACK_QUANT_ISA in a child
interpreter) and the default path (AVX-512 where the CPU has it).

Inputs: random blocks (every scale bit pattern, so NaN/Inf/subnormal scales
turn up by chance too), plus each fp16 scale field set to the edge values
(±0, the smallest and largest subnormals, the smallest normal, ±max finite,
±Inf, quiet and signaling NaNs of both signs), all-zero and all-ones quant
bytes, every E8M0 / UE4M3 byte, and odd tensor shapes. Non-NaN values must
have identical bits; where the reference gives a NaN, k3pack must too (NaN
payloads and signs are pinned by tests/quant/nan_scale_test.cpp).
"""

import json
import os
import subprocess
import sys
import unittest

import numpy as np

import _util  # noqa: F401  (import path)
import k3pack
import quant_ref

HALF_EDGES = (0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
              0x7C01, 0xFD55, 0x3C00, 0x0200)
F32_EDGES = (0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan, 1.0)


def _edge_blocks(name, rng):
    """Blocks of `name` that hit the edge inputs named in the module text."""
    blck, size, _ = quant_ref.TYPES[name]
    out = []
    fill = [np.zeros(size, np.uint8), np.full(size, 0xFF, np.uint8), np.full(size, 0xAA, np.uint8),
            np.full(size, 0x55, np.uint8)]
    scale_sets = [(h,) for h in HALF_EDGES]
    for base in fill + [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(4)]:
        for (h,) in scale_sets:
            b = base.copy()
            if name in quant_ref.HALF_SCALES:
                for off in quant_ref.HALF_SCALES[name]:
                    b[off], b[off + 1] = h & 0xFF, h >> 8
            elif name == "IQ1_M":
                quant_ref.set_iq1_m_scale(b, h)
            out.append(b)
        out.append(base)
    if name in ("MXFP4", "NVFP4"):  # every scale byte
        for x in range(256):
            b = rng.integers(0, 256, size, dtype=np.uint8)
            b[0] = x
            if name == "NVFP4":
                b[1:4] = (x + 85) % 256, (x + 170) % 256, 255 - x
            out.append(b)
    if name == "Q8_K":
        for v in F32_EDGES:
            b = rng.integers(0, 256, size, dtype=np.uint8)
            b[0:4] = np.frombuffer(np.float32(v).tobytes(), np.uint8)
            out.append(b)
    if name in ("F16", "BF16"):  # every 16-bit pattern
        out.append(np.arange(65536, dtype="<u2").view(np.uint8))
    if name == "F32":
        out.append(np.array(F32_EDGES, "<f4").view(np.uint8))
    if name == "F64":
        out.append(np.array(F32_EDGES + (1e300, -1e300, 5e-324, 3.4028235677973366e38, 1.401298464324817e-45 / 2),
                            "<f8").view(np.uint8))
    if name in ("I8", "I16", "I32", "I64"):
        info = np.iinfo(np.dtype("<i%d" % size))
        out.append(np.array([info.min, info.max, -1, 0, 1], "<i%d" % size).view(np.uint8))
    return np.concatenate(out)


def _as_input(name, raw, shape):
    """`raw` bytes as k3pack.dequantize takes them: a typed array for plain
    types wider than a byte (ne0 = last axis), else uint8 rows of blocks."""
    blck, size, _ = quant_ref.TYPES[name]
    if blck == 1 and size > 1:
        return raw.view({2: "<u2", 4: "<u4", 8: "<u8"}[size]).reshape(shape)
    return raw.reshape(shape[:-1] + (shape[-1] * size,))


def _inputs(name, rng):
    blck, size, _ = quant_ref.TYPES[name]
    n_random = 3001 if blck == 1 else 400
    raw = rng.integers(0, 256, n_random * size, dtype=np.uint8)
    return np.concatenate([raw, _edge_blocks(name, rng)])


def _mismatches(name, raw, got):
    """Indices of elements that differ from the reference, as a short text."""
    ref = quant_ref.dequantize(name, raw)
    if got.shape != ref.shape:
        return "shape %s, reference %s" % (got.shape, ref.shape)
    ref_nan, got_nan = np.isnan(ref), np.isnan(got)
    bad = (ref_nan != got_nan) | (~ref_nan & (ref.view(np.uint32) != got.view(np.uint32)))
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    blck, size, _ = quant_ref.TYPES[name]
    blk = i // blck
    return "%d of %d elements differ; first at %d (block %d bytes %s): k3pack %r (0x%08x), reference %r (0x%08x)" % (
        int(bad.sum()), bad.size, i, blk, raw[blk * size:(blk + 1) * size].tobytes().hex(), float(got[i]),
        int(got.view(np.uint32)[i]), float(ref[i]), int(ref.view(np.uint32)[i]))


def compare_all(seed=2024):
    """{type: mismatch text} for every type where k3pack's decode on this
    process's code path differs from the reference (empty: all agree)."""
    rng = np.random.default_rng(seed)
    bad = {}
    for name in sorted(quant_ref.TYPES):
        raw = _inputs(name, rng)
        blck, size, _ = quant_ref.TYPES[name]
        with np.errstate(all="ignore"):
            got = k3pack.dequantize(_as_input(name, raw, (1, raw.size // size)), name, threads=1).reshape(-1)
            text = _mismatches(name, raw, got)
        if text:
            bad[name] = text
    return bad


def _child_main():
    print(json.dumps({"isa": k3pack.quant_isa(), "bad": compare_all()}))


class QuantReference(unittest.TestCase):
    def test_reference_covers_every_decodable_type(self):
        names = {t["name"] for t in k3pack.ggml_types()}
        decodable = set()
        for n in names:
            try:
                k3pack.dequantize(np.zeros((1, k3pack.ggml_type_info(n)["type_size"]), np.uint8), n)
                decodable.add(n)
            except ValueError:
                pass
        self.assertEqual(decodable, set(quant_ref.TYPES))
        for n, (blck, size, _) in quant_ref.TYPES.items():
            info = k3pack.ggml_type_info(n)
            self.assertEqual((info["block_size"], info["type_size"]), (blck, size), n)

    def test_default_path_matches_reference(self):
        self.assertEqual(compare_all(), {}, k3pack.quant_isa())

    def test_scalar_and_avx2_paths_match_reference(self):
        here = os.path.dirname(os.path.abspath(__file__))
        code = "import sys; sys.path.insert(0, %r); import test_quant_reference as t; t._child_main()" % here
        wanted = ["scalar"] + (["avx2"] if k3pack.quant_isa() in ("avx2", "avx512") else [])
        for isa in wanted:
            env = dict(os.environ, K3PACK_QUANT_ISA=isa)
            proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            self.assertEqual(result["isa"], isa)
            self.assertEqual(result["bad"], {}, isa)

    def test_an_isa_cap_naming_no_path_is_a_warning(self):
        # Before, a typo ("scaler") left dequantize on the fastest path
        # without a word. Valid values (avx512 and auto cap nothing) are quiet.
        code = "import warnings; warnings.simplefilter('error'); import k3pack; print(k3pack.quant_isa())"
        for value, warned in (("scaler", True), ("AVX2", True), ("scalar", False), ("avx512", False), ("auto", False)):
            with self.subTest(value=value):
                env = dict(os.environ, K3PACK_QUANT_ISA=value, PYTHONPATH=os.pathsep.join(sys.path))
                proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, timeout=120)
                if warned:
                    self.assertNotEqual(proc.returncode, 0, proc.stdout)
                    self.assertIn("RuntimeWarning: K3PACK_QUANT_ISA=%r names none of scalar, avx2, avx512, auto "
                                  "and is ignored; dequantize uses %s" % (value, k3pack.quant_isa()), proc.stderr)
                else:
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    self.assertEqual(proc.stderr, "")

    def test_odd_shapes_decode_row_by_row(self):
        # One block per row, many blocks per row, 3-D stacks, and empty tensors
        # (ggml allows ne = 0): each row decodes as the reference does.
        rng = np.random.default_rng(7)
        for name in ("Q4_0", "Q2_K", "IQ2_XS", "NVFP4", "Q1_0", "F16", "I8"):
            blck, size, _ = quant_ref.TYPES[name]
            for shape in ((1, 1), (5, 1), (1, 37), (3, 4, 7), (0, 3), (4, 0)):
                raw = rng.integers(0, 256, int(np.prod(shape)) * size, dtype=np.uint8)
                arr = _as_input(name, raw, shape)
                with np.errstate(all="ignore"):
                    got = k3pack.dequantize(arr, name)
                self.assertEqual(got.shape, shape[:-1] + (shape[-1] * blck,), (name, shape))
                self.assertIsNone(_mismatches(name, raw, got.reshape(-1)), (name, shape))

    def test_byte_swapped_typed_arrays_decode_their_values(self):
        # A '>f4'-style array (what gguf-py hands out for a big-endian GGUF)
        # holds the same values as its '<' twin; both decode to them.
        rng = np.random.default_rng(11)
        for name, dtype in (("F16", "f2"), ("F32", "f4"), ("F64", "f8"), ("I16", "i2"), ("I32", "i4"),
                            ("I64", "i8")):
            values = (rng.standard_normal((3, 5)) * 1000).astype("<" + dtype)
            swapped = values.astype(">" + dtype)
            want = k3pack.dequantize(values, name)
            np.testing.assert_array_equal(want, values.astype(np.float32), name)
            np.testing.assert_array_equal(k3pack.dequantize(swapped, name), want, name)
            self.assertEqual(k3pack.tensor_stats(swapped, name), k3pack.tensor_stats(values, name), name)

    def test_tensor_stats_match_the_reference_values(self):
        # min / max / mean over the finite decoded values, NaN and Inf counts.
        rng = np.random.default_rng(12)
        for name in ("Q4_K", "IQ2_XXS", "Q8_0", "MXFP4", "F16"):
            raw = _inputs(name, rng)
            blck, size, _ = quant_ref.TYPES[name]
            arr = _as_input(name, raw, (1, raw.size // size))
            with np.errstate(all="ignore"):
                ref = quant_ref.dequantize(name, raw).astype(np.float64)
            finite = ref[np.isfinite(ref)]
            st = k3pack.tensor_stats(arr, name)
            self.assertEqual(st["count"], ref.size, name)
            self.assertEqual(st["nan_count"], int(np.isnan(ref).sum()), name)
            self.assertEqual(st["inf_count"], int(np.isinf(ref).sum()), name)
            if name != "MXFP4":  # E8M0 scales are finite for every byte
                self.assertGreater(st["nan_count"], 0, name)  # the edge blocks hold NaN scales
            self.assertEqual(st["min"], finite.min(), name)
            self.assertEqual(st["max"], finite.max(), name)
            # Summed in double in another order: equal to well within 1e-12 of the magnitude.
            self.assertLessEqual(abs(st["mean"] - finite.mean()), 1e-12 * np.abs(finite).mean(), name)


if __name__ == "__main__":
    unittest.main()
