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
                 ("prefetch_budget_bytes", 0, U64), ("cache_bytes", 1, U64), ("read_splits", 1, U32),
                 ("queue_depth", 1, U32), ("stats_flush_interval", 0, I64), ("prefetch_queue_depth", 0, I64)]
        for arg, lo, hi in cases:
            for value in (hi + 1, 2 ** 64, 2 ** 100):
                self.check_value_error(self.expert_store, arg, value, lo, hi)
            self.check_type_error(self.expert_store, arg)
        for arg in ("expected_layers", "expected_experts", "expected_top_k", "prefetch_budget_bytes"):
            for value in (-1, -2 ** 64):
                self.check_value_error(self.expert_store, arg, value, 0, U32 if arg.startswith("exp") else U64)

    def test_slot_cache_out_of_range(self):
        cases = [("expected_layers", 0, U32), ("expected_experts", 0, U32), ("expected_top_k", 0, U32),
                 ("host_cache_bytes", 0, U64), ("read_splits", 1, U32), ("queue_depth", 1, U32),
                 ("stage_slots", 1, U32)]
        for arg, lo, hi in cases:
            for value in (hi + 1, 2 ** 100):
                self.check_value_error(self.slot_cache, arg, value, lo, hi)
            self.check_type_error(self.slot_cache, arg)
        self.check_value_error(self.slot_cache, "host_cache_bytes", -1, 0, U64)
        for value in (2 ** 63, -2 ** 63 - 1):
            self.check_value_error(self.slot_cache, "cache_vram_reserve_mib", value, -2 ** 63, I64)

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
        # It was clamped, and k3pack's limit then named 2**32 - 1 as the value given.
        with self.assertRaises(ValueError) as cm:
            self.dropin(stage_slots=2 ** 40)
        self.assertEqual(str(cm.exception), f"stage_slots must be in 1..{U32}, got {2 ** 40}")


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


if __name__ == "__main__":
    unittest.main()
