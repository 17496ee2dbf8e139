"""Shared helpers of the Python tests: import path, the k3pack CLI, temp dirs."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.environ.get("K3PACK_PYTHON_DIR", os.path.join(REPO, "python")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def settled(count, at_most, seconds=5.0):
    """count() once it is at most `at_most`, or after `seconds` of trying. A
    joined thread's /proc/self/task entry can outlive the join by a moment
    (longer on a loaded machine); a thread that never ends still shows."""
    deadline = time.monotonic() + seconds
    value = count()
    while value > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
        value = count()
    return value


def k3pack_bin():
    """The CLI: $K3PACK_BIN, else <repo>/build/k3pack."""
    return os.environ.get("K3PACK_BIN") or os.path.join(REPO, "build", "k3pack")


def have_cli():
    return os.access(k3pack_bin(), os.X_OK)


def run_cli(*args, check=True):
    proc = subprocess.run([k3pack_bin(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise AssertionError("k3pack %s failed (%d):\n%s\n%s" % (" ".join(args), proc.returncode, proc.stdout,
                                                                  proc.stderr))
    return proc


def cli_has_command(name):
    if not have_cli():
        return False
    proc = subprocess.run([k3pack_bin(), name, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc.returncode == 0


class TempDir:
    def __init__(self):
        self._td = tempfile.TemporaryDirectory(prefix="k3py-")
        self.path = self._td.name

    def cleanup(self):
        self._td.cleanup()


def synth(out, fault=None, all_data=False, matrix_type=None, force=False):
    """The tiny synthetic model into `out`: with the CLI's `synth` when it is
    built, else through the binding (k3pack.synth)."""
    if cli_has_command("synth"):
        args = ["synth", "--preset", "tiny", "--out", out]
        if fault:
            args += ["--fault", fault]
        if all_data:
            args.append("--all-data")
        if matrix_type:
            args += ["--matrix-type", matrix_type]
        if force:  # replace a model written with other options (the overwrite rule refuses otherwise)
            args.append("--force")
        run_cli(*args)
        return
    import k3pack

    k3pack.synth(out, faults=[fault] if fault else [], all_data=all_data, matrix_type=matrix_type, force=force)


def build_tiny(tmp):
    """The tiny model synthesized into `tmp`/model and built (scaled profile)
    into `tmp`/tiny.expert-major.pack + tiny.manifest.json; returns
    (pack path, manifest path, manifest document)."""
    import json
    import k3pack

    model = os.path.join(tmp, "model")
    synth(model)
    built = k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                         pack=os.path.join(tmp, "tiny.expert-major.pack"),
                         manifest=os.path.join(tmp, "tiny.manifest.json"), profile="scaled", safety_margin_gib=0)
    with open(built["manifest"]) as f:
        doc = json.load(f)
    return built["pack"]["pack"], built["manifest"], doc


class SynthModelTestCase(unittest.TestCase):
    """A test case with the tiny synthetic model written once per class into
    cls.model (a directory under cls.tmp), removed with it."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        synth(cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class TinyPackTestCase(unittest.TestCase):
    """A test case with the tiny model built once per class: cls.pack,
    cls.manifest, cls.doc, cls.layers (active MoE layer ids), cls.top_k,
    cls.num_layers, cls.experts, cls.object_bytes; dropin() opens the drop-in store."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = TempDir()
        cls.pack, cls.manifest, cls.doc = build_tiny(cls.tmp.path)
        cls.layers = cls.doc["model"]["active_moe_layer_ids"]
        cls.top_k = cls.doc["model"]["num_experts_per_token"]
        cls.num_layers = cls.doc["model"]["num_hidden_layers"]
        cls.experts = cls.doc["model"]["num_experts"]
        cls.object_bytes = cls.doc["expert_pack"]["object_bytes"]

    def dropin(self, **kw):
        """The SGLang drop-in store on the tiny pack (6 MiB of slots unless
        given); not closed here: tests of an unclosed store drop it."""
        from k3pack.sglang import KimiGGMLExpertPackStore

        kw.setdefault("cache_vram_mib", 6)
        kw.setdefault("cache_vram_reserve_mib", 1)
        return KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest, expected_layers=self.num_layers,
                                       expected_experts=self.experts, expected_top_k=self.top_k, **kw)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class StandInModules:
    """Empty stand-in modules (SGLang is not installed here) for the names
    given, restored to what sys.modules held on exit."""

    def __init__(self, *names):
        self.names = names

    def __enter__(self):
        import types

        self.saved = {n: sys.modules.get(n) for n in self.names}
        for n in self.names:
            sys.modules[n] = types.ModuleType(n)
        return [sys.modules[n] for n in self.names]

    def __exit__(self, *exc):
        for n, m in self.saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
        return False


# For child interpreters' code (prepend it): rchar() is the bytes this process
# has read so far (/proc/self/io), how a child knows a long hashing call it
# runs is under way.
CHILD_RCHAR = """
def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
"""
