"""k3pack.dequantize(threads=, out=): one C++ call over the whole array, split
over threads, bit-identical to the single-threaded decode, into a caller's
buffer when asked."""

import threading
import time
import unittest

import numpy as np

import _util  # noqa: F401  (import path)
import k3pack


class DequantizeThreads(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(8)

    def blocks(self, type_name, rows, blocks_per_row, scale_offsets=(0,)):
        size = k3pack.ggml_type_info(type_name)["type_size"]
        raw = self.rng.integers(0, 256, rows * blocks_per_row * size, dtype=np.uint8)
        b = raw.reshape(-1, size)
        for off in scale_offsets:
            b[:, off + 1] &= 0xBF  # finite fp16 scales
        return raw.reshape(rows, blocks_per_row * size)

    def test_threads_and_out_match_single_thread_bits(self):
        for type_name, offsets in (("Q8_0", (0,)), ("Q2_K", (80, 82)), ("IQ2_XS", (0,)), ("BF16", ())):
            info = k3pack.ggml_type_info(type_name)
            per_row = 8192 // info["block_size"]  # 8192 elements per row, 256 rows: 8 MiB out
            data = self.blocks(type_name, 256, per_row, offsets)
            one = k3pack.dequantize(data, type_name, threads=1)
            self.assertEqual(one.shape, (256, 8192))
            for threads in (0, 2, 3):
                many = k3pack.dequantize(data, type_name, threads=threads)
                self.assertEqual(many.tobytes(), one.tobytes(), (type_name, threads))
            out = np.full(one.shape, -1.0, dtype=np.float32)
            ret = k3pack.dequantize(data, type_name, out=out)
            self.assertIs(ret, out)
            self.assertEqual(out.tobytes(), one.tobytes(), type_name)

    def test_out_must_fit(self):
        data = self.blocks("Q8_0", 2, 4)
        with self.assertRaises(ValueError):
            k3pack.dequantize(data, "Q8_0", out=np.zeros((2, 127), np.float32))
        with self.assertRaises(TypeError):
            k3pack.dequantize(data, "Q8_0", out=np.zeros((2, 128), np.float64))
        with self.assertRaises(ValueError):
            k3pack.dequantize(data, "Q8_0", out=np.zeros((128, 2), np.float32).T)  # not C-contiguous

    def test_gil_is_released(self):
        # Another Python thread keeps running while a large decode is in C++.
        data = self.blocks("Q2_K", 64, 4096, (80, 82))  # 64 Mi elements
        ticks = []
        done = threading.Event()

        def ticker():
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0.001)

        th = threading.Thread(target=ticker)
        th.start()
        time.sleep(0.01)
        t0 = time.perf_counter()
        k3pack.dequantize(data, "Q2_K", threads=1)
        t1 = time.perf_counter()
        done.set()
        th.join()
        during = [t for t in ticks if t0 < t < t1]
        if t1 - t0 < 0.05:
            self.skipTest("decode too fast to observe")
        self.assertGreater(len(during), 2, "no ticks while decoding for %.3f s" % (t1 - t0))


if __name__ == "__main__":
    unittest.main()
