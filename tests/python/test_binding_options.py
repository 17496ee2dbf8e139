"""Integer and bool options of the store constructors, Acquisition indexes,
wait= and validate_pack's allow_mixed_types (the leftovers of the bindings'
code-reading audit): each test failed before its fix."""

import os
import unittest

import numpy as np

import _util
import k3pack
from k3pack import _k3pack

U32 = 2 ** 32 - 1
U64 = 2 ** 64 - 1
I64 = 2 ** 63 - 1


class StoreIntegerOptionsTest(_util.TinyPackTestCase):
    """Options typed uint32 / uint64 / int64 in C++ were pybind11's TypeError
    "incompatible function arguments" for an int out of that range (it names
    no argument, and lists the whole signature), and read_splits /
    queue_depth past 32 bits were narrowed (2**32 read as 0)."""

    def check_value_error(self, make, arg, value, lo, hi):
        with self.assertRaises(ValueError) as cm:
            make(**{arg: value})
        self.assertEqual(str(cm.exception), f"{arg} must be in {lo}..{hi}, got {value}")

    def check_type_error(self, make, arg):
        with self.assertRaises(TypeError) as cm:
            make(**{arg: "7"})
        self.assertEqual(str(cm.exception), f"{arg} must be an int, got str")

    def expert_store(self, **kw):
        kw.setdefault("cache_bytes", 64 << 20)
        store = k3pack.ExpertStore(self.pack, self.manifest, **kw)
        store.close()
        return store

    def slot_cache(self, **kw):
        cache = _k3pack.SlotCache(self.pack, self.manifest, **kw)
        cache.close()
        return cache

    def test_expert_store_out_of_range(self):
        cases = [("expected_layers", 0, U32), ("expected_experts", 0, U32), ("expected_top_k", 0, U32),
                 ("prefetch_budget_bytes", 0, U64), ("cache_bytes", 1, U64), ("stats_flush_interval", 0, I64),
                 ("prefetch_queue_depth", 0, I64)]
        for arg, lo, hi in cases:
            for value in (hi + 1, 2 ** 64, 2 ** 100):
                self.check_value_error(self.expert_store, arg, value, lo, hi)
            self.check_type_error(self.expert_store, arg)
        for arg in ("expected_layers", "expected_experts", "expected_top_k", "prefetch_budget_bytes"):
            for value in (-1, -2 ** 64):
                self.check_value_error(self.expert_store, arg, value, 0, U32 if arg.startswith("exp") else U64)

    def test_slot_cache_out_of_range(self):
        cases = [("expected_layers", 0, U32), ("expected_experts", 0, U32), ("expected_top_k", 0, U32),
                 ("host_cache_bytes", 0, U64)]
        for arg, lo, hi in cases:
            for value in (hi + 1, 2 ** 100):
                self.check_value_error(self.slot_cache, arg, value, lo, hi)
            self.check_type_error(self.slot_cache, arg)
        self.check_value_error(self.slot_cache, "host_cache_bytes", -1, 0, U64)
        for value in (2 ** 63, -2 ** 63 - 1):
            self.check_value_error(self.slot_cache, "cache_vram_reserve_mib", value, -2 ** 63, I64)

    def test_counts_past_the_limit_read_as_the_library_says(self):
        # Before: 2**32 was the binding's own "read_splits must be in
        # 1..4294967295, got 4294967296" where a C++ caller read "must be at
        # most 4294967295 (k3pack's limit)", and stage_slots=5000 the
        # library's words but 2**32 the binding's.
        cases = [(self.expert_store, "read_splits", 1024), (self.expert_store, "queue_depth", U32),
                 (self.slot_cache, "read_splits", 1024), (self.slot_cache, "queue_depth", U32),
                 (self.slot_cache, "stage_slots", 1024)]
        for make, arg, limit in cases:
            for value in (limit + 1, U32 + 1, 2 ** 64, 2 ** 100):
                with self.assertRaises(ValueError) as cm:
                    make(**{arg: value})
                self.assertEqual(str(cm.exception), f"{arg} must be at most {limit} (k3pack's limit), got {value}")
            self.check_type_error(make, arg)

    def test_counts_that_are_not_positive_name_the_option_in_the_hint(self):
        for make, arg in [(self.expert_store, "read_splits"), (self.expert_store, "queue_depth"),
                          (self.expert_store, "cache_bytes"), (self.slot_cache, "read_splits"),
                          (self.slot_cache, "stage_slots")]:
            for value in (0, -1, -2 ** 64):
                with self.assertRaises(ValueError) as cm:
                    make(**{arg: value})
                self.assertEqual(str(cm.exception), "expert cache and staging budgets, and read splits, must be positive")
                self.assertEqual(cm.exception.k3pack_hint, f"{arg} must be at least 1, got {value}")

    def test_negative_counts_keep_sglang_texts(self):
        # The library's own words for a count that is not positive (SGLang's),
        # past int64 too.
        for arg in ("read_splits", "queue_depth", "cache_bytes"):
            for value in (0, -1, -2 ** 64):
                with self.assertRaises(ValueError) as cm:
                    self.expert_store(**{arg: value})
                self.assertEqual(str(cm.exception), "expert cache and staging budgets, and read splits, must be positive")
        with self.assertRaises(ValueError) as cm:
            self.expert_store(stats_flush_interval=-2 ** 64)
        self.assertEqual(str(cm.exception), "expert-pack stats flush interval cannot be negative")

    def test_ep_past_int64(self):
        for kw, text in [({"ep_size": 2 ** 64, "ep_rank": 0}, f"ep_size must be in 1..{U32}, got {2 ** 64}"),
                         ({"ep_size": -2 ** 64, "ep_rank": 0}, f"ep_size must be at least 1, got {-2 ** 64}"),
                         ({"ep_size": 2, "ep_rank": 2 ** 64},
                          f"ep_rank {2 ** 64} is out of range for ep_size 2 (ranks are 0..1)")]:
            for make in (self.expert_store, self.slot_cache):
                with self.assertRaises(ValueError) as cm:
                    make(**kw)
                self.assertEqual(str(cm.exception), text)

    def test_numpy_integers_and_in_range_values(self):
        store = self.expert_store(expected_layers=np.int64(self.num_layers), expected_experts=np.uint32(self.experts),
                                  expected_top_k=np.int16(self.top_k), prefetch_budget_bytes=U64,
                                  read_splits=np.int64(2), queue_depth=np.uint8(4))
        self.assertEqual(store.info["top_k"], self.top_k)
        cache = self.slot_cache(host_cache_bytes=np.uint64(64 << 20), stage_slots=np.int32(2))
        self.assertEqual(cache.top_k, self.top_k)


class AcquisitionIndexTest(_util.TinyPackTestCase):
    """acq[i] past ssize_t was "incompatible function arguments"; a list
    says IndexError there."""

    def test_index_past_ssize_t(self):
        ids = np.arange(self.top_k).reshape(1, self.top_k)
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            with store.acquire(self.layers[0], ids) as acq:
                for i in (2 ** 63, 2 ** 64, -2 ** 63 - 1, -2 ** 100):
                    with self.assertRaises(IndexError) as cm:
                        acq[i]
                    self.assertEqual(str(cm.exception), "Acquisition index out of range")
                self.assertEqual(acq[np.int64(-1)].expert, self.top_k - 1)
                with self.assertRaises(TypeError) as cm:
                    acq["0"]
                self.assertEqual(str(cm.exception), "Acquisition indices must be integers, not str")


class DropInSizesTest(_util.TinyPackTestCase):
    """host_cache_mib past 2**44 made host_cache_bytes past 64 bits: the
    engine's "incompatible function arguments" TypeError."""

    def test_host_cache_mib_past_2_44(self):
        for value in (2 ** 44, 2 ** 70):
            with self.assertRaises(ValueError) as cm:
                self.dropin(host_cache_mib=value)
            self.assertEqual(str(cm.exception),
                             f"host_cache_mib must be 0 (no host tier) or positive, at most {2 ** 44 - 1}, got {value}")

    def test_stage_slots_past_32_bits(self):
        # It was clamped, and k3pack's limit then named 2**32 - 1 as the value
        # given; it is k3pack's limit with the value, as for stage_slots=5000.
        with self.assertRaises(ValueError) as cm:
            self.dropin(stage_slots=2 ** 40)
        self.assertEqual(str(cm.exception), f"stage_slots must be at most 1024 (k3pack's limit), got {2 ** 40}")


class WaitAndBoolArgumentsTest(unittest.TestCase):
    """wait= an int a double cannot hold, and allow_mixed_types= of an object
    with no __bool__ (or one that raises), were pybind11's RuntimeError
    "Unable to cast Python instance to C++ type"."""

    def setUp(self):
        self.tmp = _util.TempDir()
        self.addCleanup(self.tmp.cleanup)
        self.model = os.path.join(self.tmp.path, "model")
        _util.synth(self.model)

    def test_wait_past_a_double(self):
        # Longer than a double holds is longer than float("inf") waits: forever.
        out = os.path.join(self.tmp.path, "s")
        self.assertFalse(k3pack.synth(out, wait=10 ** 400)["already_built"])
        with self.assertRaises(ValueError) as cm:
            k3pack.synth(out, wait=-10 ** 400)
        self.assertEqual(str(cm.exception), "wait must be a number of seconds (0 or more), float('inf') or "
                                            f"'forever', got {-10 ** 400}")

    def test_allow_mixed_types_truth_value(self):
        config = os.path.join(self.model, "config.json")
        missing = os.path.join(self.tmp.path, "none.pack")

        class Raises:
            def __bool__(self):
                raise ZeroDivisionError("no truth")

        # Python's truth value: [] is False, [0] True; the call then goes on
        # to the pack, which is missing.
        for value in ([], [0], "x", np.bool_(True)):
            with self.assertRaises(FileNotFoundError):
                k3pack.validate_pack(missing, self.model, config, profile="scaled", allow_mixed_types=value)
        with self.assertRaises(ZeroDivisionError):
            k3pack.validate_pack(missing, self.model, config, profile="scaled", allow_mixed_types=Raises())

    def test_allow_mixed_types_under_kimi_k3_names_the_keywords(self):
        # The text named the CLI's flags (--allow-mixed-types, --profile scaled).
        config = os.path.join(self.model, "config.json")
        with self.assertRaises(ValueError) as cm:
            k3pack.build_pack(self.model, config, out=os.path.join(self.tmp.path, "p.pack"), profile="kimi-k3",
                              allow_mixed_types=True)
        self.assertEqual(str(cm.exception), "allow_mixed_types=True requires profile='scaled' (Kimi K3 experts are "
                                            "Q2_K/Q2_K/Q3_K)")
        self.assertFalse(os.path.exists(os.path.join(self.tmp.path, "p.pack")))



class OtherIntegerParametersTest(_util.TinyPackTestCase):
    """threads, payload_samples, samples, SlotCache.attach_*'s slot_count and
    device, and synth's seed / shards / hidden / vocab kept pybind11's
    casters: a float, or an int the C++ type cannot hold (threads=-1 was
    taken as 0, "one per CPU"), was its TypeError "incompatible function
    arguments" listing the whole signature, or went on; create_manifest's
    payload_samples=-1 named the CLI's --payload-samples."""

    def assert_value_error(self, call, text):
        with self.assertRaises(ValueError) as cm:
            call()
        self.assertEqual(str(cm.exception), text)

    def assert_type_error(self, call, arg, kind):
        with self.assertRaises(TypeError) as cm:
            call()
        self.assertEqual(str(cm.exception), f"{arg} must be an int, got {kind}")

    def test_threads(self):
        data = np.zeros((1, 34), np.uint8)
        missing = os.path.join(self.tmp.path, "missing")
        for call in (lambda t: k3pack.dequantize(data, "Q8_0", threads=t),
                     lambda t: _k3pack.build_pack(missing, missing, profile="scaled", threads=t)):
            self.assert_value_error(lambda: call(-1), "threads must be in 0..2147483647, got -1")
            self.assert_value_error(lambda: call(2 ** 31), "threads must be in 0..2147483647, got 2147483648")
            self.assert_type_error(lambda: call(2.0), "threads", "float")
        self.assertEqual(k3pack.dequantize(data, "Q8_0", threads=np.int64(1)).shape, (1, 32))

    def test_samples(self):
        gguf = os.path.join(os.path.dirname(self.pack), "model")  # build_tiny's layout
        config = os.path.join(gguf, "config.json")
        tok = os.path.join(gguf, "tokenizer")
        for call in (lambda n: _k3pack.create_manifest(gguf, self.pack, config, tok, profile="scaled",
                                                       payload_samples=n),
                     lambda n: _k3pack.validate_pack(self.pack, gguf, config, profile="scaled", payload_samples=n)):
            self.assert_value_error(lambda: call(-1), f"payload_samples must be in 0..{I64}, got -1")
            self.assert_type_error(lambda: call(1.5), "payload_samples", "float")
        self.assertEqual(_k3pack.validate_pack(self.pack, gguf, config, profile="scaled",
                                               payload_samples=np.int32(2))["payload_samples_verified"], 2)
        self.assert_type_error(lambda: _k3pack.verify_pack(self.manifest, samples=1.5), "samples", "float")
        self.assert_value_error(lambda: _k3pack.verify_pack(self.manifest, samples=-1), "samples must be non-negative")

    def test_slot_cache_attach(self):
        cache = _k3pack.SlotCache(self.pack, self.manifest)
        self.addCleanup(cache.close)
        self.assert_value_error(lambda: cache.attach_host(0, -1), f"slot_count must be in 0..{U32}, got -1")
        self.assert_type_error(lambda: cache.attach_host(0, 2.0), "slot_count", "float")
        self.assert_value_error(lambda: cache.attach_cuda(0, 2 ** 32, 0), f"slot_count must be in 0..{U32}, got {2 ** 32}")
        self.assert_value_error(lambda: cache.attach_cuda(0, 1, -1), "device must be in 0..2147483647, got -1")

    def test_synth(self):
        out = os.path.join(self.tmp.path, "never")
        self.assert_value_error(lambda: k3pack.synth(out, seed=-1), f"seed must be in 0..{U64}, got -1")
        self.assert_type_error(lambda: k3pack.synth(out, seed=1.5), "seed", "float")
        for arg in ("hidden", "vocab"):
            self.assert_value_error(lambda: k3pack.synth(out, **{arg: -1}), f"{arg} must be in 0..{U32}, got -1")
        # shards' range is split.count's (a UINT16), as `k3pack synth --shards` says.
        self.assert_value_error(lambda: k3pack.synth(out, shards=-1), "shards must be in 1..65535, got -1")
        self.assertFalse(os.path.exists(out))

if __name__ == "__main__":
    unittest.main()
