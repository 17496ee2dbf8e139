"""Lifetimes, writability and files changing under the zero-copy arrays, as an
SGLang model author's load_weights meets them (session 12 audit).

Each hazard that used to kill the process (SIGSEGV, SIGBUS) runs in a child
interpreter, so a regression fails the test instead of the whole run.
"""

import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import unittest

import _util

import numpy as np

import k3pack

try:
    import torch
except ImportError:  # pragma: no cover - the test machine has torch
    torch = None

SHARD0 = "KIMI-K3-SYNTH-00001-of-00003.gguf"


def run_child(code, *args):
    """Runs `code` in a fresh interpreter with k3pack importable; returns the
    CompletedProcess (a negative returncode is the signal that killed it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def shard_mapped(path):
    """Whether this process maps `path` (a line of /proc/self/maps names it)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(real) for line in f)


def shard_open(path):
    real = os.path.realpath(path)
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd) == real:
                return True
        except OSError:
            pass
    return False


class _Model(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.pack, cls.manifest, cls.doc = _util.build_tiny(cls.tmp.path)
        cls.model = os.path.join(cls.tmp.path, "model")
        cls.shard0 = os.path.join(cls.model, SHARD0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def copy_model(self, name):
        """A private copy of the model and a manifest naming it, to damage."""
        model = os.path.join(self.tmp.path, name)
        shutil.copytree(self.model, model)
        doc = json.loads(json.dumps(self.doc))
        for s in doc["source"]["shards"]:
            s["path"] = os.path.join(model, os.path.basename(s["path"]))
        manifest = os.path.join(self.tmp.path, name + ".manifest.json")
        with open(manifest, "w") as f:
            json.dump(doc, f)
        return model, manifest


@unittest.skipIf(torch is None, "needs torch")
class WritesThroughTorch(_Model):
    """torch.from_numpy ignores numpy's read-only flag. A GGUFFile view used to
    be a view of the shared PROT_READ mapping, so an in-place op killed the
    process with SIGSEGV; now each array is its own private copy-on-write
    mapping: the write stays in it (never the file, never another array)."""

    def assert_writes_stay_in_memory(self, code, path):
        """Runs `code` in a child; it must print "ok" and leave the shard's bytes alone."""
        before = sha256(self.shard0)
        proc = run_child(code, path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("ok", proc.stdout)
        self.assertEqual(sha256(self.shard0), before)

    def test_gguf_file_view_written_by_torch(self):
        self.assert_writes_stay_in_memory("""
            import sys, warnings, numpy as np, torch, k3pack
            warnings.simplefilter("ignore")
            g = k3pack.GGUFFile(sys.argv[1])
            name = "blk.0.attn_norm.weight"
            a = g.tensor_data(name)
            orig = np.array(a)
            t = torch.from_numpy(a)
            t.mul_(2)
            assert np.array_equal(a, orig * 2), "the write is in this array"
            assert np.array_equal(g.tensor_data(name), orig), "another view must not see it"
            assert np.array_equal(g.tensor_data(name, "raw").view(np.float32), orig.ravel())
            m = g.metadata_array("tokenizer.ggml.token_type")
            morig = np.array(m)
            torch.from_numpy(m).add_(1)
            assert np.array_equal(g.metadata_array("tokenizer.ggml.token_type"), morig)
            print("ok")
        """, self.shard0)

    def test_shard_set_view_written_by_torch(self):
        self.assert_writes_stay_in_memory("""
            import sys, warnings, numpy as np, torch, k3pack
            warnings.simplefilter("ignore")
            s = k3pack.ShardSet(sys.argv[1])
            name = "token_embd.weight"
            orig = np.array(s.tensor_data(name))
            torch.from_numpy(s.tensor_data(name)).fill_(7)
            assert np.array_equal(s.tensor_data(name), orig)
            torch.from_numpy(s.shards[0].tensor_data(name)).fill_(7)
            assert np.array_equal(s.shards[0].tensor_data(name), orig)
            print("ok")
        """, self.model)


@unittest.skipIf(torch is None, "needs torch")
class TorchAdapter(_Model):
    def test_zero_copy_type_scalars_take_writes(self):
        # The qweight_type scalars of a zero-copy stream pointed into a static
        # const table: t.fill_(0) on one was a SIGSEGV (and, where it had not
        # faulted, would have changed every later stream's type ids).
        proc = run_child("""
            import sys, k3pack
            from k3pack.sglang import kimi_k3_nonexpert_weights_iterator
            ref = {r.name: int(r.array) for r in k3pack.nonexpert_tensors(sys.argv[1]) if r.kind == "qweight_type"}
            n = 0
            for name, t in kimi_k3_nonexpert_weights_iterator(sys.argv[1]):
                if name in ref:
                    assert int(t) == ref[name]
                    t.fill_(0)
                    assert int(t) == 0
                    n += 1
            again = {r.name: int(r.array) for r in k3pack.nonexpert_tensors(sys.argv[1]) if r.kind == "qweight_type"}
            assert again == ref, "a write changed another stream's type ids"
            print("wrote", n)
        """, self.manifest)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("wrote ", proc.stdout)
        self.assertGreater(int(proc.stdout.split()[1]), 0)

    def test_to_torch_leaves_the_warning_filters_alone(self):
        # to_torch silenced torch's read-only warning with
        # warnings.catch_warnings(), which swaps the process-wide filter list:
        # two threads converting at once could leave "ignore UserWarning"
        # installed for good (seen in 2 of 3 runs of 4 threads x 20,000).
        import threading
        import warnings

        from k3pack import sglang

        records = [r for r, _ in zip(k3pack.nonexpert_tensors(self.manifest), range(12))]
        before = list(warnings.filters)
        seen = []
        real = torch.from_numpy

        def spy(array):
            seen.append(warnings.filters == before)
            return real(array)

        torch.from_numpy = spy
        try:
            for r in records:
                sglang.to_torch(r.array, r.dtype)
        finally:
            torch.from_numpy = real
        self.assertTrue(seen)
        self.assertTrue(all(seen), "to_torch changed the warning filters while converting")

        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            def work():
                for _ in range(3000):
                    for r in records:
                        sglang.to_torch(r.array, r.dtype)
            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(switch)
        self.assertEqual(warnings.filters, before)
        # Still the same bytes, shared (no copy), and torch's own dtype.
        for r in records:
            t = sglang.to_torch(r.array, r.dtype)
            self.assertEqual(t.data_ptr(), r.array.__array_interface__["data"][0])
            self.assertEqual(t.numpy().tobytes() if r.dtype != "bfloat16" else t.view(torch.int16).numpy().tobytes(),
                             r.array.tobytes())


class ManyLiveViews(_Model):
    def test_more_live_views_than_the_kernel_has_mappings(self):
        # Each private view is one kernel mapping, and a process has at most
        # vm.max_map_count (65530) of them for everything: past k3pack's cap
        # views share the file's read-only mapping instead of failing (an
        # uncapped first version raised MemoryError at about 65,500 live views
        # and left no mapping for torch or malloc).
        proc = run_child("""
            import sys, numpy as np, k3pack
            g = k3pack.GGUFFile(sys.argv[1])
            name = "blk.0.attn_norm.weight"
            ref = np.array(g.tensor_data(name))
            maps = lambda: sum(1 for _ in open("/proc/self/maps"))
            m0 = maps()
            views = [g.tensor_data(name) for _ in range(70000)]
            grown = maps() - m0
            assert all(np.array_equal(v, ref) for v in views[::997])
            del views
            again = [g.tensor_data(name) for _ in range(8)]
            private = len({v.__array_interface__["data"][0] for v in again})
            print("grown", grown, "private", private)
        """, self.shard0)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        grown = int(proc.stdout.split()[1])
        self.assertLess(grown, 20000, proc.stdout)
        self.assertIn("private 8", proc.stdout)  # freed views give their mappings back


class TruncatedWhileOpen(_Model):
    """A file cut short under a live mapping: reading a page past its new end is
    a SIGBUS. The size is checked before a view is made / a tensor is read."""

    def test_gguf_file_view_of_truncated_file_is_refused(self):
        model, _ = self.copy_model("trunc-gguf")
        shard = os.path.join(model, SHARD0)
        proc = run_child("""
            import os, sys, numpy as np, k3pack
            g = k3pack.GGUFFile(sys.argv[1])
            s = k3pack.ShardSet(os.path.dirname(sys.argv[1]))
            os.truncate(sys.argv[1], 16384)
            for opener in (lambda: g.tensor_data("blk.1.attn_norm.weight"),
                           lambda: s.tensor_data("blk.1.attn_norm.weight", "raw")):
                try:
                    np.array(opener()).sum()
                except ValueError as e:
                    print("refused:", e)
                else:
                    print("read")
        """, shard)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.count("refused:"), 2, proc.stdout)
        self.assertIn(shard, proc.stdout)
        self.assertIn("blk.1.attn_norm.weight", proc.stdout)
        self.assertIn("changed on disk", proc.stdout)

    def test_zero_copy_stream_over_truncated_shard_raises_sglang_error(self):
        model, manifest = self.copy_model("trunc-stream")
        shard = os.path.join(model, SHARD0)
        proc = run_child("""
            import os, sys, numpy as np, k3pack
            it = k3pack.nonexpert_tensors(sys.argv[1])
            next(it)
            os.truncate(sys.argv[2], os.path.getsize(sys.argv[2]) // 2)
            try:
                for rec in it:
                    np.array(rec.array).sum()
            except FileNotFoundError as e:
                print("error:", e)
                print("hint:", e.k3pack_hint)
        """, manifest, shard)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("error: Kimi-K3 GGUF shard is missing or changed: " + os.path.realpath(shard) + "\n",
                      proc.stdout)
        self.assertIn("cut short", proc.stdout)


class CopyModeTruncationText(_Model):
    def test_names_the_resolved_shard_path_as_sglang(self):
        # SGLang names the shard as Path(shard["path"]).resolve(); the copy
        # mode's short-read error named the manifest's relative path.
        model, _ = self.copy_model("trunc-rel")
        doc = json.loads(json.dumps(self.doc))
        for s in doc["source"]["shards"]:
            s["path"] = os.path.join("trunc-rel", os.path.basename(s["path"]))
        manifest = os.path.join(self.tmp.path, "rel.manifest.json")
        with open(manifest, "w") as f:
            json.dump(doc, f)
        shard = os.path.join(model, SHARD0)
        cwd = os.getcwd()
        os.chdir(self.tmp.path)
        try:
            it = k3pack.nonexpert_tensors(manifest, copy=True)
            next(it)
            os.truncate(shard, os.path.getsize(shard) // 2)
            with self.assertRaises(FileNotFoundError) as cm:
                for _ in it:
                    pass
        finally:
            os.chdir(cwd)
        self.assertEqual(str(cm.exception), "Kimi-K3 GGUF shard is missing or changed: " + os.path.realpath(shard))


class StreamLifetime(_Model):
    def test_failed_stream_releases_its_shard(self):
        # An ssm_a error mid-stream: the stream object (kept alive by a stored
        # traceback, or by the caller) no longer pins the shard's mapping and
        # descriptor; the views already handed out stay valid.
        tmp = _util.TempDir()
        try:
            model = os.path.join(tmp.path, "model")
            _util.synth(model, fault="nan-ssm-a")
            built = k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                                 pack=os.path.join(tmp.path, "p.pack"), manifest=os.path.join(tmp.path, "m.json"),
                                 profile="scaled", safety_margin_gib=0, allow_unsupported=True)
            stream = k3pack.nonexpert_tensors(built["manifest"])
            held = []
            with self.assertRaises(ValueError) as cm:
                for rec in stream:
                    held.append((rec.array, np.array(rec.array)))
            self.assertEqual(str(cm.exception), "Kimi-K3 GGUF ssm_a must contain finite floating values")
            shard = os.path.join(model, SHARD0)
            self.assertFalse(shard_open(shard))
            with self.assertRaises(ValueError) as again:  # the stream repeats its error
                next(stream)
            self.assertEqual(str(again.exception), str(cm.exception))
            del rec
            gc.collect()
            self.assertTrue(held)
            for view, copy in held:
                np.testing.assert_array_equal(view, copy)
            del held, view
            gc.collect()
            self.assertFalse(shard_mapped(shard))
        finally:
            tmp.cleanup()

    def test_close_releases_the_shard_and_keeps_views(self):
        ref = [(n, np.array(a)) for n, a in k3pack.nonexpert_weights(self.manifest)]
        with k3pack.nonexpert_tensors(self.manifest) as stream:
            kept = [next(stream) for _ in range(6)]
            self.assertTrue(shard_open(self.shard0))
        self.assertTrue(stream.closed)
        self.assertFalse(shard_open(self.shard0))
        self.assertEqual(stream.stats["emitted"], 6)
        with self.assertRaises(StopIteration):
            next(stream)
        stream.close()  # again: nothing
        for rec, (name, value) in zip(kept, ref):
            self.assertEqual(rec.name, name)
            np.testing.assert_array_equal(rec.array, value)
        del kept, rec
        gc.collect()
        self.assertFalse(shard_mapped(self.shard0))


class VerifyMetadataInterrupt(_Model):
    """verify_metadata=True hashes every whole shard in the first next():
    minutes for a full checkpoint, without the GIL. Ctrl-C and a close() from
    another thread used to wait for all of it; now they stop it within one
    8 MiB chunk. A shard with 4 TiB of trailing holes (its manifest record
    says so) stands in for a full checkpoint: hashing it takes far longer
    than the child's time limit."""

    CHILD = """
        import os, signal, sys, threading, time, k3pack

        # Ctrl-C's handler even where this runs with SIGINT ignored (a
        # background job), as test_long_calls_interrupt's child does.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        s = k3pack.NonExpertStream(sys.argv[1], verify_metadata=True)
        base = rchar()

        def stop_once_hashing():
            # 256 MiB read: the main thread is inside next(), hashing shard 0.
            while rchar() - base < (256 << 20):
                time.sleep(0.01)
            if sys.argv[2] == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                return
            if sys.argv[2] == "fork":
                # The child's copy of the stream is mid-step (its mutex held
                # by a thread the fork did not copy): next() used to hang.
                pid = os.fork()
                if pid == 0:
                    signal.alarm(60)  # a hang ends the child with SIGALRM
                    for what, use in (("next", lambda: next(s)), ("stats", lambda: s.stats)):
                        try:
                            use()
                            os.write(1, b"child-%s returned\\n" % what.encode())
                        except RuntimeError as e:
                            os.write(1, ("child-%s refused %s\\n" % (what, e)).encode())
                    s.close()
                    os.write(1, b"child-close returned\\n")
                    os._exit(0)
                print("child-status", os.waitpid(pid, 0)[1])
            s.close()

        stopper = threading.Thread(target=stop_once_hashing, daemon=True)
        stopper.start()
        try:
            next(s)
            print("returned")
        except KeyboardInterrupt:
            print("interrupted")
        except StopIteration:
            print("stopped")
        # A daemon thread still inside close() when the interpreter exits is
        # ended by CPython (pthread_exit) as it takes the GIL back, which
        # aborts a C++ frame: wait for it (it returns as soon as next() has).
        stopper.join(60)
        print("read", rchar() - base)
        print("closed", s.closed)
        s.close()
    """

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.huge_model, cls.huge_manifest = cls.copy_model(cls, "huge")
        shard = os.path.join(cls.huge_model, SHARD0)
        os.truncate(shard, os.path.getsize(shard) + (4 << 40))
        with open(cls.huge_manifest) as f:
            doc = json.load(f)
        doc["source"]["shards"][0]["size"] = os.path.getsize(shard)
        with open(cls.huge_manifest, "w") as f:
            json.dump(doc, f)

    def run_stopped(self, how):
        proc = run_child(_util.CHILD_RCHAR + textwrap.dedent(self.CHILD), self.huge_manifest, how)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in proc.stdout.splitlines())
        self.assertLess(int(lines["read"]), 4 << 30, proc.stdout)  # stopped within a few chunks, not 4 TiB
        return lines

    def test_ctrl_c_stops_the_hashing_with_keyboard_interrupt(self):
        lines = self.run_stopped("sigint")
        self.assertIn("interrupted", lines)
        self.assertEqual(lines["closed"], "False")  # the stream is not failed: next() would verify again

    def test_fork_while_another_thread_is_inside_next(self):
        lines = self.run_stopped("fork")
        self.assertEqual(lines.get("child-status"), "0", lines)  # not killed by the alarm
        refused = ("this NonExpertStream was inside next() on another thread of process %s when it forked into this "
                   "process (%s): its copy here stopped mid-step and cannot be used")
        self.assertRegex(lines.get("child-next", ""), "^refused " + re.escape(refused).replace("%s", r"\d+") + "$")
        self.assertTrue(lines.get("child-stats", "").startswith("refused "), lines)
        self.assertIn("child-close", lines)
        self.assertIn("stopped", lines)  # the parent's own stream is closed as usual

    def test_close_from_another_thread_stops_the_hashing(self):
        lines = self.run_stopped("close")
        self.assertIn("stopped", lines)  # as a closed generator's next()
        self.assertEqual(lines["closed"], "True")


if __name__ == "__main__":
    unittest.main()
