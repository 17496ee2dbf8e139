"""Ctrl-C while a progress or log callback runs (a code-reading audit of the
bindings): the tests failed before their fix."""

import os
import signal
import unittest

import _util
import k3pack


class CtrlCInCallbackTest(_util.TinyPackTestCase):
    """Python runs a Ctrl-C's handler on the main thread where it next runs
    Python code: inside a progress or log callback when one is running. Its
    KeyboardInterrupt was then discarded as an unraisable callback error
    ("Exception ignored in: 'k3pack progress callback'") and the call went on
    to its end - for verify_pack(full=True) or create_manifest on a real
    checkpoint, hours."""

    def setUp(self):
        # A test run started in the background inherits SIGINT ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)

    def interrupting(self):
        calls = []

        def callback(_):
            calls.append(1)
            if len(calls) == 1:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):  # the handler runs here, raising KeyboardInterrupt in the callback
                    pass
        return callback, calls

    def test_verify_pack_progress(self):
        callback, calls = self.interrupting()
        with self.assertRaises(KeyboardInterrupt):
            k3pack.verify_pack(self.manifest, full=True, progress=callback)
            for _ in range(100):  # a Ctrl-C left pending when the call returned is raised here
                pass
        self.assertEqual(len(calls), 1)

    def test_create_manifest_progress_lines(self):
        model = os.path.join(self.tmp.path, "model")
        callback, calls = self.interrupting()
        with self.assertRaises(KeyboardInterrupt):
            k3pack.create_manifest(model, self.pack, os.path.join(model, "config.json"),
                                   os.path.join(model, "tokenizer"), profile="scaled", progress=callback)
            for _ in range(100):
                pass


class CustomHandlerOnceTest(_util.TinyPackTestCase):
    """The KeyboardInterrupt a callback raised was re-armed as a pending
    Ctrl-C (PyErr_SetInterrupt), which ran the program's SIGINT handler a
    second time for one Ctrl-C: a handler that counts presses ("press Ctrl-C
    twice to quit at once") saw two (leftover of the session-29 audit)."""

    def setUp(self):
        self.presses = []

        def handler(signum, frame):
            self.presses.append(signum)
            raise KeyboardInterrupt("press %d" % len(self.presses))

        previous = signal.signal(signal.SIGINT, handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)

    def press_in_first_callback(self):
        def callback(_):
            if not self.presses:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):  # the handler runs here, raising KeyboardInterrupt in the callback
                    pass
        return callback

    def test_verify_pack_runs_the_handler_once(self):
        with self.assertRaises(KeyboardInterrupt) as cm:
            k3pack.verify_pack(self.manifest, full=True, progress=self.press_in_first_callback())
            for _ in range(100):
                pass
        self.assertEqual(self.presses, [signal.SIGINT])
        self.assertEqual(str(cm.exception), "press 1")  # the handler's own exception

    def test_create_manifest_runs_the_handler_once(self):
        model = os.path.join(self.tmp.path, "model")
        with self.assertRaises(KeyboardInterrupt) as cm:
            k3pack.create_manifest(model, self.pack, os.path.join(model, "config.json"),
                                   os.path.join(model, "tokenizer"), profile="scaled",
                                   progress=self.press_in_first_callback())
            for _ in range(100):
                pass
        self.assertEqual(self.presses, [signal.SIGINT])
        self.assertEqual(str(cm.exception), "press 1")

    def test_raised_after_a_call_without_interrupt_checks(self):
        # synth's engine never polls for Ctrl-C: the handler's exception is
        # raised once the call is back in Python.
        out = os.path.join(self.tmp.path, "synth-interrupted")
        os.makedirs(out)
        with open(os.path.join(out, ".k3pack-synth.partial"), "w"):
            pass  # an interrupted synth: the rerun tells `log` it starts over

        def log(_):
            if not self.presses:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100):
                    pass
        with self.assertRaises(KeyboardInterrupt) as cm:
            k3pack.synth(out, log=log)
            for _ in range(100):
                pass
        self.assertEqual(self.presses, [signal.SIGINT])
        self.assertEqual(str(cm.exception), "press 1")


if __name__ == "__main__":
    unittest.main()
