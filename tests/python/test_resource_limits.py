"""The Python module under process limits (`ulimit -n`, `ulimit -v`), which
it shares with the CLI (tests/cli/resource_limits_test.cpp): out of
descriptors or address space, an intact model must never be called damaged,
and the exception must name the limit and its value. Each case runs in a
child interpreter that sets the limit on itself after importing k3pack, so
the import (libraries, numpy) is not what the limit stops."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

import _util  # noqa: F401  (puts the built module on sys.path)
import k3pack

PYTHON = "/usr/bin/python3"

PRELUDE = textwrap.dedent("""
    import json, resource, sys
    import k3pack
    def limit(which, value):
        soft, hard = resource.getrlimit(which)
        resource.setrlimit(which, (value, hard))
    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    def report(fn, **extra):
        try:
            value = fn()
        except BaseException as exc:
            out = {"raised": type(exc).__name__, "errno": getattr(exc, "errno", None),
                   "message": str(exc), "hint": getattr(exc, "k3pack_hint", None) or ""}
        else:
            out = {"returned": value}
        out.update(extra)
        sys.stdout.write(json.dumps(out) + "\\n")
    """)

# Words that send a user to rebuild or re-download files that are intact.
BLAMES_THE_FILES = ("changed since the manifest was written", "no longer a readable GGUF file", "rebuild")


def run_child(body, **values):
    script = PRELUDE + "".join("%s = json.loads(%r)\n" % (k, json.dumps(v)) for k, v in values.items()) + \
        textwrap.dedent(body)
    proc = subprocess.run([PYTHON, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=300,
                          close_fds=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError("the child failed (%d):\n%s\n%s" % (proc.returncode, proc.stdout, proc.stderr))
    return json.loads(lines[-1])


@unittest.skipUnless(os.access(PYTHON, os.X_OK), "needs " + PYTHON)
class UnderProcessLimits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="k3py-limits-")
        cls.model = os.path.join(cls.root, "m")
        k3pack.synth(cls.model, shards=30, seed=3)
        cls.manifest = k3pack.build(cls.model, safety_margin_gib=0)["manifest"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def test_verify_reads_one_shard_at_a_time_under_a_small_descriptor_limit(self):
        # 30 shards; the check reads one at a time, so a limit of a few more
        # than the interpreter holds is enough.
        body = """
            import os
            limit(resource.RLIMIT_NOFILE, len(os.listdir("/proc/self/fd")) + 6)
            report(lambda: k3pack.verify_pack(manifest, full=True, against_source=True)["structure"])
            """
        got = run_child(body, manifest=self.manifest)
        self.assertEqual(got, {"returned": "ok"})

    def test_out_of_descriptors_names_the_limit(self):
        body = """
            import os
            limit(resource.RLIMIT_NOFILE, len(os.listdir("/proc/self/fd")))
            report(lambda: k3pack.verify_pack(manifest, full=True))
            """
        got = run_child(body, manifest=self.manifest)
        self.assertEqual(got.get("raised"), "OSError", got)
        self.assertEqual(got["errno"], 24, got)
        self.assertIn("files open at once (`ulimit -n`)", got["hint"], got)
        self.assertIn("the file itself is not at fault", got["hint"], got)

    def test_small_address_space_blames_the_limit_not_the_files(self):
        # Limits a few MiB above what the interpreter already maps: the check
        # maps shards and allocates buffers of several MiB, so some fail. Its
        # threads' stacks and malloc arenas (64 MiB of address space each,
        # when glibc gives a thread its own) make the largest limit that works
        # vary from run to run: 256 MiB more failed one run in six here.
        failed = worked = 0
        for extra_mib in (1, 4, 16, 32, 64, 256, 1024):
            with self.subTest(extra_mib=extra_mib):
                body = """
                    cap = vm_bytes() + extra_mib * 2**20
                    limit(resource.RLIMIT_AS, cap)
                    report(lambda: k3pack.verify_pack(manifest, full=True)["structure"], cap=cap)
                    """
                got = run_child(body, manifest=self.manifest, extra_mib=extra_mib)
                cap = got["cap"]
                if got.get("returned") == "ok":
                    worked += 1
                    continue
                failed += 1
                self.assertIn(got.get("raised"), ("MemoryError", "OSError"), got)
                self.assertIn("%d bytes of address space (`ulimit -v`)" % cap, got["hint"], got)
                for wrong in BLAMES_THE_FILES:
                    self.assertNotIn(wrong, got["message"] + got["hint"], got)
        self.assertGreater(failed, 0, "no limit of the sweep was small enough to test anything")
        self.assertGreater(worked, 0, "no limit of the sweep was large enough for the check to pass")


if __name__ == "__main__":
    unittest.main()
