"""The drop-in store's `entries` looked up as SGLang's dict keyed by
(layer, expert, role_id) ints is (a leftover of the bindings' code-reading
audit): a key that equals an int key, and hashes as it (3.0, numpy
integers, True, Fraction(3)), finds that entry; any other is a KeyError.
Before, (layer, 3.0, 0) computed a float pread offset (TypeError), and
(layer, 3.5, 0) was `in` the entries. The expected answer is a real dict's."""

import math
import unittest
from decimal import Decimal
from fractions import Fraction

import numpy as np

import _util


class EntryKeysTest(_util.TinyPackTestCase):
    def probes(self, layer):
        return [
            (layer, 3.0, 0), (float(layer), 3, 1), (layer, np.int64(3), np.int32(2)), (np.uint64(layer), 3, 0),
            (layer, True, 0), (layer, 1, False), (layer, Fraction(3), 0), (layer, Decimal(3), 2),
            (layer, np.float32(2.0), 1), (layer, 3.5, 0), (layer, 3, 0.5), (layer, math.nan, 0),
            (layer, math.inf, 0), (layer + 0.5, 0, 0), (layer, Fraction(7, 2), 0), (layer, -1, 0),
            (layer, self.experts, 0), (layer, 0, 3), (layer, 0, 1.0 + 1e-12), 5, "x", (layer, 3),
            (layer, 3, 0, 0), None,
        ]

    def test_lookups_answer_as_a_dict_keyed_by_ints(self):
        store = self.dropin()
        self.addCleanup(store.close)
        reference = {key: key for key in store.entries}  # SGLang's dict: int keys
        for probe in self.probes(self.layers[0]):
            with self.subTest(probe=probe):
                self.assertEqual(probe in store.entries, probe in reference)
                if probe not in reference:
                    with self.assertRaises(KeyError) as cm:
                        store.entries[probe]
                    self.assertEqual(cm.exception.args, (probe,))
                    self.assertIsNone(store.entries.get(probe))
                    continue
                entry = store.entries[probe]
                canonical = reference[probe]
                self.assertIs(entry, store.entries[canonical])
                self.assertEqual((entry.layer, entry.expert, entry.role_id), canonical)
                self.assertEqual([type(v) for v in (entry.layer, entry.expert, entry.role_id)], [int] * 3)

    def test_first_lookup_by_an_equal_key_records_int_values(self):
        # The record made on a first lookup by (layer, 3.0, 0) is the one the
        # int key gets: its generation hashes "layer:3", not "layer:3.0".
        layer = self.layers[-1]
        first = self.dropin()
        self.addCleanup(first.close)
        by_float = first.entries[(float(layer), 3.0, 1)]
        fresh = self.dropin()
        self.addCleanup(fresh.close)
        by_int = fresh.entries[(layer, 3, 1)]
        for field in ("layer", "expert", "role_id", "pack_offset", "generation", "tensor_name"):
            self.assertEqual(repr(getattr(by_float, field)), repr(getattr(by_int, field)), field)

    def test_unhashable_keys_raise_as_a_dict_does(self):
        store = self.dropin()
        self.addCleanup(store.close)
        for probe in ((self.layers[0], [3], 0), [self.layers[0], 3, 0]):
            with self.assertRaises(TypeError):
                {}[probe]
            with self.assertRaises(TypeError):
                store.entries[probe]
            with self.assertRaises(TypeError):
                probe in store.entries


if __name__ == "__main__":
    unittest.main()
