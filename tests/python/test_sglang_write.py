"""A write into a tensor from the drop-in iterator must never kill the process
(SGLang would die with SIGSEGV): zero-copy views are copy-on-write, and
install_into_sglang() hands SGLang copies by default."""

import hashlib
import os
import subprocess
import sys
import textwrap
import unittest

import _util
import gguf_oracle as oracle
import k3pack


class ZeroCopyWrites(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "m")
        _util.synth(cls.model, all_data=True)
        cls.manifest = os.path.join(cls.tmp.path, "m.json")
        oracle.write_json(cls.manifest, oracle.source_manifest(k3pack.ShardSet.discover(cls.model)))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def shard_digests(self):
        out = {}
        for name in sorted(os.listdir(self.model)):
            if name.endswith(".gguf"):
                with open(os.path.join(self.model, name), "rb") as f:
                    out[name] = hashlib.sha256(f.read()).hexdigest()
        return out

    def run_child(self, body):
        code = textwrap.dedent("""
            import sys, torch
            sys.path.insert(0, %r)
            from k3pack.sglang import kimi_k3_nonexpert_weights_iterator
            manifest = %r
        """ % (os.path.join(_util.REPO, "python"), self.manifest)) + textwrap.dedent(body)
        return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, PYTHONPATH=os.path.join(_util.REPO, "python")))

    def test_in_place_write_on_zero_copy_tensor_does_not_crash(self):
        before = self.shard_digests()
        proc = self.run_child("""
            written = 0
            for name, t in kimi_k3_nonexpert_weights_iterator(manifest, copy=False):
                if t.dtype in (torch.float32, torch.float16, torch.bfloat16) and t.numel() > 0:
                    first = t.flatten()[0].item()
                    t.mul_(2)                     # SIGSEGV on a read-only mapping
                    assert t.flatten()[0].item() == first * 2, name
                    written += 1
            # A second pass sees the file's bytes: writes never reach it.
            again = dict(kimi_k3_nonexpert_weights_iterator(manifest, copy=False))
            print("written", written)
        """)
        self.assertGreaterEqual(proc.returncode, 0, "killed by signal %d:\n%s" % (-proc.returncode, proc.stdout))
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertRegex(proc.stdout, r"written [1-9]")
        self.assertEqual(self.shard_digests(), before)

    def test_installed_iterator_copies_by_default(self):
        proc = self.run_child("""
            import types
            import k3pack.sglang as adapter
            for n in ["sglang", "sglang.srt", "sglang.srt.model_loader", adapter.SGLANG_MODULE]:
                sys.modules[n] = types.ModuleType(n)
            sglang_mod = sys.modules[adapter.SGLANG_MODULE]
            sglang_mod.kimi_k3_nonexpert_weights_iterator = lambda path: iter(())
            adapter.install_into_sglang()
            fresh = dict(sglang_mod.kimi_k3_nonexpert_weights_iterator(manifest))
            views = dict(kimi_k3_nonexpert_weights_iterator(manifest, copy=False))
            # Copies own their memory: writes to them never touch another tensor.
            name = next(n for n, t in fresh.items() if t.dtype == torch.float32 and t.numel() > 1)
            ref = views[name].clone()
            fresh[name].mul_(2)
            assert torch.equal(views[name], ref)
            assert fresh[name].data_ptr() != views[name].data_ptr()
            adapter.install_into_sglang(copy=False)
            assert sglang_mod.kimi_k3_nonexpert_weights_iterator is kimi_k3_nonexpert_weights_iterator
            print("ok")
        """)
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("ok", proc.stdout)


if __name__ == "__main__":
    unittest.main()
