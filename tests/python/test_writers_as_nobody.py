"""Python's writers run by a user other than the files' owner: every other
Python test runs as root, which opens, locks and replaces anything, so the
libraries' rules for another user's files (tests/cli/permissions_test.cpp
runs the CLI through them) were never met from Python: the lock file another
user's build left, the profile record it may not read, another user's output
in a directory with the sticky bit (test_permissions.py has the tokenizer
directory). Each test runs a short script as nobody (setpriv) over a model
root made, in a world-readable temporary directory, and is skipped where that
cannot be done."""

import errno
import glob
import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import unittest

import _util
import k3pack

SETPRIV = "/usr/bin/setpriv"
PYTHON = "/usr/bin/python3"
PACK_NAME = "KIMI-K3-SYNTH.expert-major.pack"
MANIFEST_NAME = "kimi-k3-expert-pack.manifest.json"

# The child's outcome as one JSON line: what it returned, or the exception's
# class, text and k3pack hint.
PRELUDE = textwrap.dedent("""
    import json, sys
    import k3pack
    def report(fn):
        try:
            value = fn()
        except BaseException as exc:
            print(json.dumps({"raised": type(exc).__name__, "errno": getattr(exc, "errno", None),
                              "message": str(exc), "hint": getattr(exc, "k3pack_hint", None) or ""}))
        else:
            print(json.dumps({"returned": value}))
    """)


def can_run_as_nobody():
    return os.geteuid() == 0 and os.access(SETPRIV, os.X_OK) and os.access(PYTHON, os.X_OK)


def python_dir():
    return os.path.dirname(os.path.dirname(os.path.abspath(k3pack.__file__)))


def as_nobody(body, **values):
    """Runs PRELUDE + body as nobody with `values` bound as globals (JSON);
    returns the reported outcome."""
    script = PRELUDE + "".join("%s = json.loads(%r)\n" % (k, json.dumps(v)) for k, v in values.items()) + \
        textwrap.dedent(body)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": python_dir(), "HOME": "/nonexistent", "LC_ALL": "C.UTF-8"}
    proc = subprocess.run([SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-c", script],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError("the script failed as nobody (%d):\n%s\n%s" % (proc.returncode, proc.stdout, proc.stderr))
    return json.loads(lines[-1])


def open_to_others(root, writable=()):
    """Everything under `root` readable (directories searchable) by others;
    the directories in `writable` writable by them too."""
    for d, dirs, files in os.walk(root):
        os.chmod(d, os.stat(d).st_mode | 0o755)
        for f in files:
            p = os.path.join(d, f)
            os.chmod(p, os.stat(p).st_mode | 0o444)
    for d in writable:
        os.chmod(d, 0o777)


def owner_only(path):
    """As a download or copy made by another user leaves a file."""
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


@unittest.skipUnless(can_run_as_nobody(), "needs root, %s and %s" % (SETPRIV, PYTHON))
class WritersAsNobody(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # World-readable, as the temporary directory of a shared machine is
        # not by default (mkdtemp makes it 0700).
        cls.root = tempfile.mkdtemp(prefix="k3py-nobody-")
        os.chmod(cls.root, 0o755)
        cls.base = os.path.join(cls.root, "base")
        k3pack.synth(cls.base)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def fresh_model(self, name, built=False):
        d = os.path.join(self.root, name)
        shutil.copytree(self.base, d)
        if built:
            k3pack.build(d, safety_margin_gib=0)
        open_to_others(d, writable=[d])
        return d

    def assertNoPack(self, model):
        self.assertEqual(glob.glob(os.path.join(model, "*.pack*")), [])

    def test_another_users_lock_file_is_taken_read_only(self):
        m = self.fresh_model("lock", built=True)
        lock = os.path.join(m, PACK_NAME + ".lock")
        self.assertTrue(os.path.exists(lock))
        got = as_nobody("report(lambda: k3pack.build(m, safety_margin_gib=0)['already_built'])", m=m)
        self.assertEqual(got, {"returned": True})
        # One this user may not even open: its owner and what to do are named.
        owner_only(lock)
        got = as_nobody("report(lambda: k3pack.build(m, safety_margin_gib=0)['already_built'])", m=m)
        self.assertEqual(got.get("raised"), "PermissionError", got)
        self.assertIn("cannot open lock file %s: Permission denied" % lock, got["message"])
        self.assertIn("it belongs to uid 0", got["message"] + got["hint"])

    def test_a_finished_build_in_a_read_only_directory_is_already_built(self):
        # A model directory this user may only read: rerunning the finished
        # build writes nothing (before: "cannot write in M: Permission denied").
        m = self.fresh_model("ro-built", built=True)
        os.chmod(m, 0o755)
        got = as_nobody("report(lambda: k3pack.build(m, safety_margin_gib=0)['already_built'])", m=m)
        self.assertEqual(got, {"returned": True})
        # Its line does not point at a force=True that is refused there.
        got = as_nobody("logged = []\nk3pack.build(m, safety_margin_gib=0, log=logged.append)\n"
                        "report(lambda: [l for l in logged if l.startswith('already built')])", m=m)
        self.assertEqual(got, {"returned": ["already built: %s (read-only for you: rebuild it elsewhere)"
                                            % os.path.join(m, MANIFEST_NAME)]})
        # No lock file either (none can be made there): judged without one.
        os.unlink(os.path.join(m, PACK_NAME + ".lock"))
        got = as_nobody("report(lambda: k3pack.build(m, safety_margin_gib=0)['already_built'])", m=m)
        self.assertEqual(got, {"returned": True})
        manifest = os.path.join(m, MANIFEST_NAME)
        create = "k3pack.create_manifest(m, p, m + '/config.json', m + '/tokenizer', output=o"
        got = as_nobody("report(lambda: %s)['format'])" % create, m=m, p=os.path.join(m, PACK_NAME), o=manifest)
        self.assertEqual(got, {"returned": json.load(open(manifest))["format"]})
        # What would write there is refused before any work, naming the output.
        got = as_nobody("report(lambda: %s, force=True))" % create, m=m, p=os.path.join(m, PACK_NAME), o=manifest)
        self.assertEqual(got.get("raised"), "PermissionError", got)
        self.assertIn("output %s: cannot write in %s: Permission denied" % (manifest, m), got["message"])

    def test_an_unreadable_profile_record_is_not_taken_as_none(self):
        m = self.fresh_model("profile")
        record = os.path.join(m, "k3pack-profile.json")
        self.assertTrue(os.path.exists(record))
        owner_only(record)
        for call in ("k3pack.build(m, safety_margin_gib=0)['already_built']",
                     "k3pack.build_pack(m, m + '/config.json')['pack']"):
            with self.subTest(call=call):
                got = as_nobody("report(lambda: %s)" % call, m=m)
                self.assertEqual(got.get("raised"), "PermissionError", got)
                self.assertIn("cannot open %s: Permission denied" % record, got["message"])
                self.assertIn("profile=", got["hint"])
                self.assertNotIn("model invariants do not match", got["message"])
                self.assertNoPack(m)
        # Told the profile, nothing needs the record.
        got = as_nobody("report(lambda: k3pack.build(m, profile='scaled', safety_margin_gib=0)['already_built'])",
                        m=m)
        self.assertEqual(got, {"returned": False})

    def test_another_users_output_in_a_sticky_directory_is_refused_before_the_run(self):
        m = self.fresh_model("sticky", built=True)
        shared = os.path.join(self.root, "shared-scratch")
        os.mkdir(shared)
        theirs = os.path.join(shared, "m.json")
        with open(theirs, "w") as f:
            # Another user's manifest (a note of theirs is refused by kind first).
            json.dump({"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "their": "notes"}, f)
        open_to_others(shared)
        os.chmod(shared, 0o777 | stat.S_ISVTX)
        with open(theirs, "rb") as f:
            before = f.read()
        for force in (True, False):
            with self.subTest(force=force):
                got = as_nobody("""
                    report(lambda: sorted(k3pack.create_manifest(m, pack, m + '/config.json', m + '/tokenizer',
                                                                 output=out, force=force)))
                    """, m=m, pack=os.path.join(m, PACK_NAME), out=theirs, force=force)
                self.assertEqual(got.get("raised"), "PermissionError", got)
                self.assertIn("refusing to overwrite existing %s (output): it belongs to uid 0 and %s has the sticky "
                              "bit, so only the owner of the file or of the directory may replace it"
                              % (theirs, shared), got["message"])
                self.assertNotIn("Operation not permitted", got["message"])
                self.assertNotIn("force=True", got["message"] + got["hint"])
                with open(theirs, "rb") as f:
                    self.assertEqual(f.read(), before)
        self.assertEqual(sorted(os.listdir(shared)), ["m.json"])  # no temporary left beside it


class ErrnoSubclass(unittest.TestCase):
    """k3pack's OSError with an errno is the subclass Python's own calls raise
    for it: an EACCES open() is PermissionError, and `except PermissionError`
    missed k3pack's (a plain OSError with errno 13)."""

    def test_the_errno_picks_pythons_subclass(self):
        for err, cls in ((errno.EACCES, PermissionError), (errno.EPERM, PermissionError),
                         (errno.EWOULDBLOCK, BlockingIOError), (errno.EISDIR, IsADirectoryError),
                         (errno.EIO, OSError)):
            with self.subTest(errno=errno.errorcode[err]):
                with self.assertRaises(OSError) as cm:
                    k3pack._k3pack._raise_for_test("OSError", "cannot open x: boom", err)
                self.assertIs(type(cm.exception), cls)
                self.assertEqual(cm.exception.errno, err)
                self.assertEqual(str(cm.exception), "cannot open x: boom")


if __name__ == "__main__":
    unittest.main()
