"""bfloat16 bit patterns in a big-endian array (a code-reading audit of the
bindings): the test failed before its fix."""

import unittest

import numpy as np

import _util  # noqa: F401  (import path)
import k3pack


class BigEndianBfloat16Test(unittest.TestCase):
    """dtype="bfloat16" bit patterns in a big-endian array ('>u2', as numpy
    reads a big-endian file) were reinterpreted in place with .view(): every
    value came out as the bfloat16 of its swapped bytes, without a word."""

    MINUS_ONE = 0xBF80  # bfloat16 -1.0
    MINUS_FOUR = 0xC080  # bfloat16 -4.0

    def test_ssm_a_to_a_log(self):
        little = np.array([self.MINUS_ONE, self.MINUS_FOUR], dtype="<u2")
        want = k3pack.ssm_a_to_a_log(little, dtype="bfloat16")
        for big in (little.astype(">u2"), little.view("<i2").astype(">i2")):
            got = k3pack.ssm_a_to_a_log(big, dtype="bfloat16")
            np.testing.assert_array_equal(got, want)

    def test_to_torch(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        from k3pack.sglang import to_torch

        big = np.array([self.MINUS_ONE, self.MINUS_FOUR], dtype=">u2")
        for copy in (False, True):
            t = to_torch(big, "bfloat16", copy=copy)
            self.assertEqual(t.dtype, torch.bfloat16)
            self.assertEqual(t.tolist(), [-1.0, -4.0])


if __name__ == "__main__":
    unittest.main()
