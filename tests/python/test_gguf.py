"""k3pack.GGUFFile / ShardSet against the independent oracle (gguf_oracle)."""

import gc
import os
import struct
import unittest

import numpy as np

import _util  # noqa: F401  (sets sys.path)
import gguf_oracle as oracle
import k3pack


def _rng_bytes(rng, n):
    return rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()


class HandWrittenGGUF(unittest.TestCase):
    """A file written by the oracle's writer: every value type, odd shapes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.path = os.path.join(cls.tmp.path, "hand.gguf")
        rng = np.random.default_rng(7)
        f32 = rng.standard_normal((3, 5)).astype("<f4")
        f16 = rng.standard_normal((7,)).astype("<f2")
        bf16 = rng.integers(0, 65536, size=(2, 4), dtype=np.uint16).astype("<u2")
        i32 = rng.integers(-1000, 1000, size=(2, 2, 3), dtype=np.int32).astype("<i4")
        q8 = _rng_bytes(rng, 4 * 2 * 34)  # ne = [64, 4]: 2 blocks per row
        q2k = _rng_bytes(rng, 3 * 84)      # ne = [256, 3]
        kv = [
            ("general.architecture", 8, "kimi-k3"),
            ("general.name", 8, "hand – ünïcode"),
            ("a.u8", 0, 200), ("a.i8", 1, -5), ("a.u16", 2, 65000), ("a.i16", 3, -300),
            ("a.u32", 4, 4000000000), ("a.i32", 5, -70000), ("a.f32", 6, 0.1), ("a.bool", 7, True),
            ("a.u64", 10, 2 ** 63 + 5), ("a.i64", 11, -2 ** 40), ("a.f64", 12, 1.0 / 3.0),
            ("a.strs", 9, (8, ["x", "", "yz"])),
            ("a.f32s", 9, (6, [1.5, -2.25, 3.0])),
            ("a.i32s", 9, (5, [1, -2, 3, 4])),
            ("a.bools", 9, (7, [True, False])),
        ]
        tensors = [
            ("t.f32", "F32", [5, 3], f32.tobytes()),
            ("t.f16", "F16", [7], f16.tobytes()),
            ("t.bf16", "BF16", [4, 2], bf16.tobytes()),
            ("t.i32", "I32", [3, 2, 2], i32.tobytes()),
            ("t.q8", "Q8_0", [64, 4], q8),
            ("t.q2k", "Q2_K", [256, 3], q2k),
            ("t.empty", "F32", [0], b""),
        ]
        oracle.write_gguf(cls.path, kv, tensors, alignment=32)
        cls.bf16 = bf16

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.g = k3pack.GGUFFile(self.path)
        self.o = oracle.OracleGGUF(self.path)

    def test_header(self):
        self.assertEqual(self.g.version, 3)
        self.assertEqual(self.g.alignment, 32)
        self.assertEqual(self.g.data_offset, self.o.data_offset)
        self.assertEqual(self.g.file_size, os.path.getsize(self.path))
        self.assertEqual(self.g.architecture, "kimi-k3")
        self.assertEqual(len(self.g), len(self.o.tensors))

    def test_metadata_matches_oracle(self):
        md = self.g.metadata
        self.assertEqual(list(md), list(self.o.metadata))
        for key, value in self.o.metadata.items():
            self.assertEqual(md[key], value, key)
            self.assertEqual(type(md[key]), type(value), key)
        self.assertEqual(self.g.metadata_types, self.o.metadata_types)
        self.assertEqual(md["general.name"], "hand – ünïcode")

    def test_metadata_array_view(self):
        a = self.g.metadata_array("a.f32s")
        self.assertEqual(a.dtype, np.dtype("<f4"))
        np.testing.assert_array_equal(a, np.array([1.5, -2.25, 3.0], dtype=np.float32))
        self.assertFalse(a.flags.writeable)
        with self.assertRaises(KeyError):
            self.g.metadata_array("nope")
        with self.assertRaises(TypeError):
            self.g.metadata_array("a.strs")

    def test_tensor_infos(self):
        for gt, ot in zip(self.g.tensors, self.o.tensors):
            self.assertEqual(gt.name, ot.name)
            self.assertEqual(gt.type, ot.type_name)
            self.assertEqual(gt.type_id, ot.type_id)
            self.assertEqual(list(gt.shape), ot.dims)
            self.assertEqual(gt.offset, ot.offset)
            self.assertEqual(gt.data_offset, ot.data_offset)
            self.assertEqual(gt.nbytes, ot.nbytes)
            self.assertEqual(gt.n_elements, ot.n_elements)
            self.assertIsNone(gt.shard_index)

    def test_gguf_layout_matches_gguf_py_semantics(self):
        for ot in self.o.tensors:
            a = self.g.tensor_data(ot.name)
            self.assertEqual(a.dtype, ot.data.dtype, ot.name)
            self.assertEqual(a.shape, ot.data.shape, ot.name)
            np.testing.assert_array_equal(a, ot.data)
            self.assertFalse(a.flags.writeable)
            self.assertTrue(a.flags.c_contiguous)

    def test_typed_and_raw_layouts(self):
        b = self.g.tensor_data("t.bf16", layout="typed")
        self.assertEqual(b.dtype, np.uint16)
        self.assertEqual(b.shape, (2, 4))
        np.testing.assert_array_equal(b, self.bf16)
        self.assertEqual(self.g.tensor_data("t.bf16").shape, (2, 8))  # gguf-py: bytes
        r = self.g.tensor_data("t.q2k", layout="raw")
        self.assertEqual(r.shape, (3 * 84,))
        self.assertEqual(r.tobytes(), self.o.by_name["t.q2k"].data.tobytes())
        with self.assertRaises(ValueError):
            self.g.tensor_data("t.q2k", layout="nope")
        with self.assertRaises(KeyError):
            self.g.tensor_data("missing")

    def test_zero_copy_and_lifetime(self):
        a = self.g.tensor_data("t.f32")
        b = self.g.tensor_data("t.f32")
        # Each view is its own private mapping of the same file bytes (a write
        # through torch stays in it: test_loader_lifetime.WritesThroughTorch).
        self.assertNotEqual(a.__array_interface__["data"][0], b.__array_interface__["data"][0])
        np.testing.assert_array_equal(a, b)
        self.assertIsNotNone(a.base)
        expected = np.array(self.o.by_name["t.f32"].data)
        del self.g, b
        gc.collect()
        np.testing.assert_array_equal(a, expected)  # the base keeps the mapping alive
        with self.assertRaises(ValueError):
            a[0, 0] = 1.0  # read-only

    def test_empty_tensor(self):
        a = self.g.tensor_data("t.empty")
        self.assertEqual(a.shape, (0,))


class Faults(unittest.TestCase):
    def setUp(self):
        self.tmp = _util.TempDir()

    def tearDown(self):
        self.tmp.cleanup()

    def test_missing_file_is_file_not_found(self):
        with self.assertRaises(FileNotFoundError) as cm:
            k3pack.GGUFFile(os.path.join(self.tmp.path, "none.gguf"))
        self.assertIn("none.gguf", str(cm.exception))

    def test_bad_magic_is_value_error(self):
        p = os.path.join(self.tmp.path, "bad.gguf")
        with open(p, "wb") as f:
            f.write(b"GGUX" + struct.pack("<IQQ", 3, 0, 0))
        with self.assertRaises(ValueError) as cm:
            k3pack.GGUFFile(p)
        self.assertIn("bad.gguf", str(cm.exception))

    def test_truncated_data_is_value_error(self):
        p = os.path.join(self.tmp.path, "trunc.gguf")
        oracle.write_gguf(p, [("general.architecture", 8, "x")], [("t", "F32", [64], b"\1" * 256)])
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) - 100)
        with self.assertRaises(ValueError):
            k3pack.GGUFFile(p)


class ErrorMapping(unittest.TestCase):
    def test_kinds(self):
        cases = {"ValueError": ValueError, "KeyError": KeyError, "FileNotFoundError": FileNotFoundError,
                 "FileExistsError": FileExistsError, "OSError": OSError, "EOFError": EOFError,
                 "RuntimeError": RuntimeError, "MemoryError": MemoryError}
        for kind, cls in cases.items():
            with self.assertRaises(cls) as cm:
                k3pack._k3pack._raise_for_test(kind, "boom")
            self.assertIs(type(cm.exception), cls)
            self.assertEqual(cm.exception.args, ("boom",))

    def test_key_error_repr_like_python(self):
        with self.assertRaises(KeyError) as cm:
            k3pack._k3pack._raise_for_test("KeyError", "'format'")
        self.assertEqual(str(cm.exception), str(KeyError("format")))
        with self.assertRaises(KeyError) as cm:
            k3pack._k3pack._raise_for_test("KeyError", "unsupported Kimi-K3 GGUF tensor name: x")
        self.assertEqual(str(cm.exception), str(KeyError("unsupported Kimi-K3 GGUF tensor name: x")))

    def test_hint_becomes_note(self):
        with self.assertRaises(ValueError) as cm:
            k3pack._k3pack._raise_for_test("ValueError", "Kimi-K3 manifest is incomplete\nhint: rebuild it")
        self.assertEqual(str(cm.exception), "Kimi-K3 manifest is incomplete")
        # The attribute is the hint's text; the note (shown in tracebacks) keeps its label.
        self.assertEqual(cm.exception.k3pack_hint, "rebuild it")
        if hasattr(cm.exception, "__notes__"):
            self.assertEqual(cm.exception.__notes__, ["hint: rebuild it"])

    def test_errno(self):
        with self.assertRaises(OSError) as cm:
            k3pack._k3pack._raise_for_test("OSError", "read failed", 5)
        self.assertEqual(cm.exception.errno, 5)


class TypeTable(unittest.TestCase):
    def test_matches_oracle(self):
        ids = {t["id"]: t for t in k3pack.ggml_types()}
        self.assertEqual(set(ids), set(oracle.GGML_TYPES))
        for tid, (name, block, size) in oracle.GGML_TYPES.items():
            self.assertEqual((ids[tid]["name"], ids[tid]["block_size"], ids[tid]["type_size"]), (name, block, size))
        self.assertEqual(k3pack.ggml_type_info("Q3_K")["id"], 11)
        with self.assertRaises(KeyError):
            k3pack.ggml_type_info(4)  # removed id

    def test_shard_name(self):
        self.assertEqual(k3pack.parse_shard_name("KIMI-00002-of-00019.gguf"), ("KIMI", 2, 19))
        self.assertIsNone(k3pack.parse_shard_name("KIMI.gguf"))


class SynthShardSet(unittest.TestCase):
    """The tiny synthetic model (3 shards) read by ShardSet and by the oracle."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        _util.synth(cls.tmp.path)
        cls.s = k3pack.ShardSet(cls.tmp.path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_discovery(self):
        paths = k3pack.ShardSet.discover(self.tmp.path)
        self.assertEqual(paths, self.s.paths)
        self.assertEqual(len(paths), 3)
        self.assertEqual(self.s.prefix, "KIMI-K3-SYNTH")

    def test_every_tensor_matches_oracle(self):
        seen = 0
        for index, path in enumerate(self.s.paths):
            o = oracle.OracleGGUF(path)
            g = self.s.shards[index]
            self.assertEqual(g.metadata, o.metadata)
            self.assertEqual(g.data_offset, o.data_offset)
            for ot in o.tensors:
                gt = self.s.tensor(ot.name)
                self.assertEqual(gt.shard_index, index)
                self.assertEqual((gt.type, list(gt.shape), gt.data_offset, gt.nbytes),
                                 (ot.type_name, ot.dims, ot.data_offset, ot.nbytes))
                a = self.s.tensor_data(ot.name)
                self.assertEqual((a.dtype, a.shape), (ot.data.dtype, ot.data.shape), ot.name)
                self.assertTrue(np.array_equal(a, ot.data, equal_nan=a.dtype.kind == "f"), ot.name)
                seen += 1
        self.assertEqual(seen, self.s.tensor_count)
        self.assertEqual([t.name for t in self.s.tensors],
                         [t.name for p in self.s.paths for t in oracle.OracleGGUF(p).tensors])

    def test_wrong_architecture(self):
        with self.assertRaises(ValueError):
            k3pack.ShardSet(self.tmp.path, architecture="llama")
        self.assertEqual(k3pack.ShardSet(self.tmp.path, architecture="").tensor_count, self.s.tensor_count)


if __name__ == "__main__":
    unittest.main()
