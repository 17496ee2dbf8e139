"""Integer and name arguments of the wrong kind or range (a code-reading
audit of the bindings): each test failed before its fix."""

import unittest

import numpy as np

import _util  # noqa: F401  (import path)
import k3pack


class TypeArgumentTest(unittest.TestCase):
    """A ggml type or profile argument of the wrong kind, or an int no type
    can have, was pybind11's cast_error: RuntimeError "Unable to cast Python
    instance to C++ type", naming neither the argument nor the value."""

    def test_ggml_type_info_int_out_of_range_is_key_error(self):
        for bad in (-1, 2 ** 32, 2 ** 70):
            with self.assertRaises(KeyError) as cm:
                k3pack.ggml_type_info(bad)
            self.assertIn(str(bad), str(cm.exception))

    def test_ggml_type_info_numpy_int(self):
        self.assertEqual(k3pack.ggml_type_info(np.int64(10))["name"], "Q2_K")

    def test_dequantize_type_out_of_range_is_value_error(self):
        data = np.zeros((1, 34), np.uint8)
        for call in (k3pack.dequantize, k3pack.tensor_stats):
            for bad in (-1, 2 ** 32):
                with self.assertRaises(ValueError) as cm:
                    call(data, bad)
                self.assertEqual(str(cm.exception), "invalid ggml type id %d" % bad)

    def test_type_of_wrong_kind_is_type_error(self):
        data = np.zeros((1, 34), np.uint8)
        for call in (k3pack.dequantize, k3pack.tensor_stats, lambda d, t: k3pack.ggml_type_info(t)):
            for bad in (1.5, None, b"Q8_0"):
                with self.assertRaises(TypeError) as cm:
                    call(data, bad)
                self.assertIn("type", str(cm.exception))
                self.assertIn(type(bad).__name__, str(cm.exception))

    def test_profile_of_wrong_kind_is_type_error(self):
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        with self.assertRaises(TypeError) as cm:
            k3pack.validate_pack(tmp.path + "/x.pack", tmp.path, tmp.path + "/config.json", profile=1)
        self.assertIn("profile", str(cm.exception))


class LayerArgumentTest(_util.TinyPackTestCase):
    """A layer no model has is SGLang's `layer N is not an active routed MoE
    layer` (docs/python.md: "negative, huge"), but an int past int64 was
    pybind11's TypeError "incompatible function arguments"."""

    def check(self, call, layer):
        with self.assertRaises(ValueError) as cm:
            call(layer)
        self.assertEqual(str(cm.exception), f"layer {layer} is not an active routed MoE layer")

    def test_expert_store(self):
        ids = np.arange(self.top_k).reshape(1, self.top_k)
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            for layer in (-1, 2 ** 63, 2 ** 64, -2 ** 63 - 1):
                self.check(lambda l: store.acquire(l, ids), layer)
                self.check(lambda l: store.acquire_token(l, ids[0]), layer)
                self.check(lambda l: store.prefetch(l, ids[0]), layer)
                self.check(lambda l: store.keep(l, ids[0]), layer)
            self.assertEqual(store.acquire(np.int64(self.layers[0]), ids).experts, list(range(self.top_k)))
            with self.assertRaises(TypeError) as cm:
                store.acquire(1.0, ids)
            self.assertIn("layer", str(cm.exception))

    def test_slot_cache(self):
        from k3pack import _k3pack

        ids = np.arange(self.top_k).reshape(1, self.top_k)
        cache = _k3pack.SlotCache(self.pack, self.manifest, host_cache_bytes=64 << 20)
        self.addCleanup(cache.close)
        for layer in (2 ** 64, -2 ** 63 - 1):
            self.check(lambda l: cache.acquire(l, ids), layer)
            self.check(lambda l: cache.prefetch(l, ids[0]), layer)
            self.check(lambda l: cache.keep(l, ids[0]), layer)


class SerializeManifestNumbersTest(unittest.TestCase):
    """serialize_manifest hands the document to C++ as json.dumps text: an
    int past 64 bits came back as a float ("1.8446744073709552e+19", not the
    bytes json.dump writes), and NaN / Infinity was nlohmann's parse_error as
    a RuntimeError."""

    def test_ints_past_64_bits_are_refused_not_rounded(self):
        import json

        for value in (2 ** 63, 2 ** 64 - 1, -2 ** 63):
            doc = {"a": value}
            want = (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
            self.assertEqual(k3pack.serialize_manifest(doc), want)
        for value in (2 ** 64, -2 ** 63 - 1, 10 ** 30):
            with self.assertRaises(ValueError) as cm:
                k3pack.serialize_manifest({"k": [1, {"a": value}]})
            self.assertIn(str(value), str(cm.exception))

    def test_nan_is_value_error(self):
        for value in (float("nan"), float("inf")):
            with self.assertRaises(ValueError):
                k3pack.serialize_manifest({"a": value})


if __name__ == "__main__":
    unittest.main()
