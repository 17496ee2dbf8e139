"""The drop-in store's stats file when the snapshot cannot be written (a
code-reading audit of the bindings): the test failed before its fix."""

import os
import unittest

import _util


class StatsTempFileTest(_util.TinyPackTestCase):
    """_write_stats_file opened <stats>.<pid>.tmp before json.dumps ran: a
    value set through store.stats that JSON cannot hold raised TypeError and
    left the empty temp file beside the stats file, one per process."""

    def test_no_temp_file_left(self):
        stats = os.path.join(self.tmp.path, "stats", "s.json")
        store = self.dropin(stats_path=stats)
        store.stats["dense_bytes"] = object()
        with self.assertRaises(TypeError):
            store.close()
        self.assertEqual(os.listdir(os.path.dirname(stats)), [])


if __name__ == "__main__":
    unittest.main()
