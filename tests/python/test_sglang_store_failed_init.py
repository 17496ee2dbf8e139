"""A drop-in store whose constructor fails after the pack opened (a
code-reading audit of the bindings): the test failed before its fix."""

import gc
import os
import unittest

import _util


def pack_fds(pack):
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(os.path.join("/proc/self/fd", fd)) == os.path.realpath(pack)
        except OSError:
            pass
    return n


def threads():
    return len(os.listdir("/proc/self/task"))


class FailedConstructorTest(_util.TinyPackTestCase):
    """SGLang's checks after the pack's (configured digests, budgets, the
    stats path) raised with the C++ slot cache open: its read threads and the
    pack's descriptor lived as long as the exception, which a caller that
    keeps, logs or chains it keeps for good."""

    def test_kept_exceptions_hold_no_engine(self):
        gc.collect()
        fds_before, threads_before = pack_fds(self.pack), threads()
        kept = []
        for kw in ({"expected_config_sha256": "0" * 64}, {"stats_flush_interval": -1},
                   {"stats_path": self.manifest}):
            with self.subTest(**kw):
                try:
                    self.dropin(**kw)
                except (ValueError, OSError) as exc:
                    kept.append(exc)
                else:
                    self.fail("the constructor did not raise")
        self.assertEqual(len(kept), 3)
        self.assertEqual(pack_fds(self.pack), fds_before)
        self.assertEqual(_util.settled(threads, threads_before), threads_before)


if __name__ == "__main__":
    unittest.main()
