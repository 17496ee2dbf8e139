"""The Python writers queue behind another writer of the same output as the
CLI's `--wait` does: synth(wait=), build_pack(wait=) and build(wait=).
Another writer is stood in for by a flock on the output's lock taken through
a second open file description (flock conflicts between those even inside one
process), let go by a timer thread. Without wait= the call is refused at once
naming the holder; with it the call waits, says so to `log`, then goes on;
Ctrl-C ends a wait. synth also keeps `k3pack synth`'s partial marker: an
interrupted synth in out_dir is started over, not refused."""

import errno
import fcntl
import glob
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import unittest

import _util
import k3pack


class HeldLock:
    """flock(LOCK_EX) on `path` (a directory or a lock file), let go after `seconds` by a thread."""

    def __init__(self, path, seconds):
        self.fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else os.O_CREAT))
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.timer = threading.Timer(seconds, self.release)
        self.timer.start()

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def releasing_log(self, lines):
        """A log that keeps the lines and lets go once the waiter says it
        waits: a timer let go before a slow machine's waiter met the lock."""

        def log(line):
            lines.append(line)
            if line.startswith("waiting for "):
                self.release()

        return log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.release()


class WriterWait(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        k3pack.synth(cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def copy_model(self, name):
        d = os.path.join(self.tmp.path, name)
        shutil.copytree(self.model, d, ignore=shutil.ignore_patterns("*.pack", "*.digests", "*.inputs", "*.lock", "*.json.tmp"))
        return d

    def test_synth_without_wait_is_refused_at_once_naming_the_holder(self):
        d = os.path.join(self.tmp.path, "refused")
        os.mkdir(d)
        with HeldLock(d, 30):
            with self.assertRaises(OSError) as ctx:
                k3pack.synth(d)
        e = ctx.exception
        self.assertEqual(e.errno, errno.EWOULDBLOCK)
        self.assertIn("another process is writing a synthetic model into " + d, str(e))
        self.assertIn("pid %d" % os.getpid(), str(e))
        self.assertIn("`wait=SECONDS`", e.k3pack_hint)
        self.assertEqual(os.listdir(d), [])  # nothing written

    def test_synth_with_wait_goes_on_once_the_holder_lets_go(self):
        d = os.path.join(self.tmp.path, "waited")
        os.mkdir(d)
        lines = []
        with HeldLock(d, 30) as held:
            result = k3pack.synth(d, wait=60, log=held.releasing_log(lines))
        self.assertFalse(result["already_built"])
        self.assertTrue(os.path.exists(os.path.join(d, "k3pack-profile.json")))
        self.assertTrue(lines[0].startswith("waiting for " + d + ": another process is writing a synthetic model"),
                        lines)
        self.assertIn("(for up to 60 s)", lines[0])
        self.assertTrue(lines[-1].startswith("took the lock on " + d + " after "), lines)

    def test_a_wait_that_runs_out_is_refused_saying_how_long_it_waited(self):
        d = os.path.join(self.tmp.path, "ran-out")
        os.mkdir(d)
        with HeldLock(d, 30):
            with self.assertRaises(OSError) as ctx:
                k3pack.synth(d, wait=0.3, log=lambda line: None)
        self.assertIn("(still after waiting", str(ctx.exception))
        self.assertNotIn("wait=SECONDS", getattr(ctx.exception, "k3pack_hint", ""))

    def test_wait_values_are_checked(self):
        for bad in (-1, float("nan"), "soon", True, [3]):
            with self.assertRaises(ValueError, msg=repr(bad)) as ctx:
                k3pack.synth(os.path.join(self.tmp.path, "never"), wait=bad)
            self.assertIn("wait must be a number of seconds", str(ctx.exception))
        self.assertFalse(os.path.exists(os.path.join(self.tmp.path, "never")))

    def test_synth_starts_an_interrupted_synth_over(self):
        d = os.path.join(self.tmp.path, "interrupted")
        os.mkdir(d)
        # What a killed synth leaves: its marker and an atomic writer's temp file.
        with open(os.path.join(d, ".k3pack-synth.partial"), "w") as f:
            f.write("k3pack synth is writing this directory\n")
        with open(os.path.join(d, "config.json.tmp"), "w") as f:
            f.write("{")
        lines = []
        result = k3pack.synth(d, log=lines.append)
        self.assertFalse(result["already_built"])
        self.assertEqual(lines, [d + " holds an interrupted synth; starting over"])
        self.assertFalse(os.path.exists(os.path.join(d, "config.json.tmp")))
        self.assertFalse(os.path.exists(os.path.join(d, ".k3pack-synth.partial")))
        self.assertTrue(k3pack.synth(d)["already_built"])

    def test_build_pack_and_build_wait_for_the_pack_lock(self):
        d = self.copy_model("build")
        config = os.path.join(d, "config.json")
        pack = os.path.join(d, "KIMI-K3-SYNTH.expert-major.pack")
        with HeldLock(pack + ".lock", 30):
            with self.assertRaises(OSError) as ctx:
                k3pack.build_pack(d, config, safety_margin_gib=0)
            self.assertIn("another process is building or repairing the Expert Pack " + pack, str(ctx.exception))
            self.assertFalse(os.path.exists(pack))
        lines = []
        with HeldLock(pack + ".lock", 30) as held:
            built = k3pack.build_pack(d, config, safety_margin_gib=0, wait="forever", log=held.releasing_log(lines))
        self.assertEqual(built["pack"], pack)
        self.assertIn("(until it lets go)", lines[0])
        lines = []
        with HeldLock(pack + ".lock", 30) as held:
            both = k3pack.build(d, safety_margin_gib=0, wait=float("inf"), log=held.releasing_log(lines))
        self.assertTrue(any(line.startswith("waiting for " + pack + ".lock: ") for line in lines), lines)
        self.assertTrue(os.path.exists(both["manifest"]))


class WaitInterrupt(unittest.TestCase):
    def test_ctrl_c_ends_a_wait_forever(self):
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        d = os.path.join(tmp.path, "held")
        os.mkdir(d)
        child = textwrap.dedent("""
            import fcntl, os, signal, sys, threading, k3pack
            signal.signal(signal.SIGINT, signal.default_int_handler)
            fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            def interrupt(line):
                if line.startswith("waiting for"):
                    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                k3pack.synth(sys.argv[1], wait="forever", log=interrupt)
                print("returned")
            except KeyboardInterrupt:
                print("interrupted")
        """)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        proc = subprocess.run([sys.executable, "-c", child, d], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(proc.stdout.strip(), "interrupted", proc.stderr)
        self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    unittest.main()
