"""The Python writers (synth, build_pack, create_manifest, build) apply the
CLI's output rules: an input is never an output, an existing file is not
replaced without force=True, an identical rerun is "already built", and the
defaults (profile sidecar, full_source_hashes) are the CLI's. Every file lives
in a temporary directory."""

import fcntl
import glob
import hashlib
import os
import shutil
import threading
import unittest

import _util
import k3pack

MANIFEST_NAME = "kimi-k3-expert-pack.manifest.json"


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class OutputRules(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        # The binding's synth and build with their defaults (no profile): the
        # tiny model passes only the scaled profile, which the sidecar records.
        cls.model = os.path.join(cls.tmp.path, "m1")
        cls.synth_result = k3pack.synth(cls.model)
        cls.config = os.path.join(cls.model, "config.json")
        cls.tok = os.path.join(cls.model, "tokenizer")
        cls.shards = sorted(glob.glob(os.path.join(cls.model, "*.gguf")))
        cls.built = k3pack.build(cls.model, cls.config, cls.tok, safety_margin_gib=0)
        cls.pack = cls.built["pack"]["pack"]
        cls.manifest = cls.built["manifest"]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def fresh_dir(self, name):
        d = os.path.join(self.tmp.path, name)
        self.assertFalse(os.path.exists(d))
        return d

    def copy_model(self, name):
        d = self.fresh_dir(name)
        outputs = shutil.ignore_patterns("*.pack", "*.digests", "*.inputs", "*.lock", "*.manifest.json")
        shutil.copytree(self.model, d, ignore=outputs)
        return d

    # Finding 1: build/create_manifest never write over an input or a user's file.

    def test_build_refuses_a_shard_as_manifest(self):
        d = self.copy_model("m5")
        shard = sorted(glob.glob(os.path.join(d, "*.gguf")))[-1]
        before = digest(shard)
        with self.assertRaises(FileExistsError) as cm:
            k3pack.build(d, d + "/config.json", d + "/tokenizer", profile="scaled", manifest=shard,
                         safety_margin_gib=0)
        self.assertIn("manifest %s is an input (source shard); writing it would destroy it" % shard,
                      str(cm.exception))
        self.assertEqual(digest(shard), before)
        # Refused before a byte was written: no pack either.
        self.assertEqual(glob.glob(os.path.join(d, "*.pack*")), [])

    def test_create_manifest_refuses_the_pack_as_output(self):
        before = digest(self.pack)
        with self.assertRaises(FileExistsError) as cm:
            k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=self.pack)
        self.assertIn("is an input (expert_pack); writing it would destroy it", str(cm.exception))
        self.assertEqual(digest(self.pack), before)

    def test_create_manifest_refuses_an_existing_file_unless_force(self):
        out = os.path.join(self.tmp.path, "stale.manifest.json")
        stale = '{"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "complete": false}\n'
        with open(out, "w") as f:
            f.write(stale)
        with self.assertRaises(FileExistsError) as cm:
            k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=out)
        self.assertTrue(str(cm.exception).startswith("refusing to overwrite existing %s (output)" % out),
                        str(cm.exception))
        self.assertIn("force=True", cm.exception.k3pack_hint)
        with open(out) as f:
            self.assertEqual(f.read(), stale)
        doc = k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=out, force=True)
        self.assertEqual(k3pack.read_manifest(out), doc)

    def assert_user_file_kept_even_with_force(self, name, text, write, expected):
        """write(out, force) is refused with and without force, naming what
        the file is; the file is left as it was."""
        out = os.path.join(self.tmp.path, name)
        with open(out, "w") as f:
            f.write(text)
        for force in (False, True):
            with self.assertRaises(FileExistsError) as cm:
                write(out, force)
            self.assertIn(expected % out, str(cm.exception))
            self.assertNotIn("force=True", cm.exception.k3pack_hint)
        with open(out) as f:
            self.assertEqual(f.read(), text)

    def test_threads_write_manifests_of_one_directory_side_by_side(self):
        # Each write looks again at its path as one step with the rename;
        # threads of a process take turns there. (A first version refused
        # every thread but one: the directory's lock was per thread.)
        out_dir = os.path.join(self.tmp.path, "side-by-side")
        os.makedirs(out_dir, exist_ok=True)
        errors = []

        def write(name):
            try:
                k3pack.create_manifest(self.model, self.pack, self.config, self.tok,
                                       output=os.path.join(out_dir, name))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=("m%d.manifest.json" % i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(sorted(os.listdir(out_dir)), ["m%d.manifest.json" % i for i in range(4)])

    def assert_manifest_never_replaces(self, name, text, what):
        self.assert_user_file_kept_even_with_force(
            name, text,
            lambda out, force: k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=out,
                                                      force=force),
            "refusing to overwrite existing %s (output): it is " + what + ", not an adapter manifest; k3pack "
            "replaces only a file of the kind it writes, not even with force=True")

    def test_force_never_replaces_a_gguf_file_given_as_the_manifest(self):
        self.assert_manifest_never_replaces("shard.gguf", "GGUF and more", "a GGUF file")

    def test_force_never_replaces_json_that_is_no_manifest(self):
        # Session 41: force=True replaced any JSON or text named as the output.
        self.assert_manifest_never_replaces("settings.json", '{"model_type": "kimi_k3"}\n',
                                            "a JSON document that names no GGMLMOEPACK pack or format")

    def test_create_manifest_same_manifest_is_kept(self):
        out = os.path.join(self.tmp.path, "again.manifest.json")
        first = k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=out)
        with open(out, "rb") as f:
            written = f.read()
        again = k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=out)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), written)  # not rewritten (its created_at would change)
        self.assertEqual(again, first)

    # Finding 2: synth and build as the CLI's synth and build.

    def test_synth_writes_the_profile_sidecar(self):
        side = os.path.join(self.model, "k3pack-profile.json")
        self.assertTrue(os.path.isfile(side))
        self.assertEqual(k3pack.read_manifest(side)["profile"], "scaled")
        self.assertEqual(self.built["document"]["k3pack"]["profile"], "scaled")

    def test_synth_refuses_a_directory_with_a_model_unless_force(self):
        d = self.fresh_dir("s1")
        k3pack.synth(d)
        shards = sorted(glob.glob(os.path.join(d, "*.gguf")))
        before = [digest(s) for s in shards]
        with self.assertRaises(FileExistsError) as cm:
            k3pack.synth(d, seed=9)
        self.assertIn("refusing to overwrite non-empty directory %s (out_dir)" % d, str(cm.exception))
        self.assertEqual([digest(s) for s in shards], before)
        r = k3pack.synth(d, seed=9, force=True)
        self.assertFalse(r["already_built"])
        self.assertNotEqual([digest(s) for s in shards], before)

    def test_synth_same_call_is_already_built(self):
        d = self.fresh_dir("s2")
        first = k3pack.synth(d, seed=3)
        self.assertFalse(first["already_built"])
        mtimes = [os.stat(s).st_mtime_ns for s in first["shards"]]
        again = k3pack.synth(d, seed=3)
        self.assertTrue(again["already_built"])
        self.assertEqual(again["shards"], first["shards"])
        self.assertEqual(again["config"], first["config"])
        self.assertEqual([os.stat(s).st_mtime_ns for s in first["shards"]], mtimes)

    @unittest.skipUnless(_util.have_cli(), "needs the k3pack CLI")
    def test_cli_and_python_synth_recognize_each_others_model(self):
        # One recipe (kimi/profile_sidecar SynthRecipe) in both: the same
        # options are the same model whoever wrote it.
        d = self.fresh_dir("s4")
        _util.run_cli("synth", "--out", d, "--seed", "5", "--progress", "none")
        self.assertTrue(k3pack.synth(d, seed=5)["already_built"])
        with self.assertRaises(Exception):
            k3pack.synth(d, seed=6)
        e = self.fresh_dir("s5")
        k3pack.synth(e, seed=5)
        out = _util.run_cli("synth", "--out", e + "/", "--seed", "5", "--progress", "none")
        self.assertIn("already built", out.stdout + out.stderr)

    def test_synth_refuses_a_user_directory(self):
        d = self.fresh_dir("s3")
        os.makedirs(d)
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("mine")
        with self.assertRaises(FileExistsError):
            k3pack.synth(d)
        self.assertEqual(os.listdir(d), ["keep.txt"])

    def test_build_identical_rerun_is_already_built(self):
        pack_before, manifest_before = digest(self.pack), digest(self.manifest)
        again = k3pack.build(self.model, self.config, self.tok, safety_margin_gib=0)
        self.assertTrue(again["already_built"])
        self.assertEqual((again["manifest"], again["pack"]["pack"]), (self.manifest, self.pack))
        self.assertEqual(again["document"], k3pack.read_manifest(self.manifest))
        self.assertEqual((digest(self.pack), digest(self.manifest)), (pack_before, manifest_before))

    def test_build_pack_identical_rerun_is_already_built(self):
        before = digest(self.pack)
        r = k3pack.build_pack(self.model, self.config, out=self.pack, safety_margin_gib=0)
        self.assertTrue(r["already_built"])
        self.assertEqual((r["size"], r["index_sha256"]),
                         (self.built["pack"]["size"], self.built["pack"]["index_sha256"]))
        self.assertEqual(digest(self.pack), before)

    def test_build_pack_says_why_it_reads_a_reused_pack_whole(self):
        # Shards copied without their times: every payload is compared with
        # them once, with a note saying why and progress while it runs.
        d = self.copy_model("m-touched")
        config = os.path.join(d, "config.json")
        k3pack.build_pack(d, config, safety_margin_gib=0)
        shard = sorted(glob.glob(os.path.join(d, "*.gguf")))[0]
        os.utime(shard, ns=(10**18, 10**18))
        lines, phases = [], []
        r = k3pack.build_pack(d, config, safety_margin_gib=0, log=lines.append,
                              progress=lambda p: phases.append(p["phase"]))
        self.assertTrue(r["already_built"])
        self.assertTrue(any(line.startswith("note: source shard " + os.path.realpath(shard)) and
                            "comparing every payload" in line for line in lines), lines)
        self.assertIn("compare", phases)

    def test_build_refuses_a_stale_manifest_unless_force(self):
        d = self.copy_model("m6")
        manifest = os.path.join(d, MANIFEST_NAME)
        with open(manifest, "w") as f:
            f.write('{"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "complete": false}\n')
        with self.assertRaises(FileExistsError) as cm:
            k3pack.build(d, d + "/config.json", d + "/tokenizer", safety_margin_gib=0)
        self.assertIn("(manifest): it is not the manifest of this pack", str(cm.exception))
        self.assertEqual(glob.glob(os.path.join(d, "*.pack*")), [])
        r = k3pack.build(d, d + "/config.json", d + "/tokenizer", safety_margin_gib=0, force=True)
        self.assertFalse(r["already_built"])
        self.assertEqual(k3pack.read_manifest(manifest), r["document"])

    # Finding 3: an input as build_pack's out is refused before the lock file.

    def test_build_pack_refuses_a_shard_as_out_without_a_lock(self):
        d = self.copy_model("m7")
        shard = sorted(glob.glob(os.path.join(d, "*.gguf")))[0]
        before = digest(shard)
        listing = sorted(os.listdir(d))
        with self.assertRaises(FileExistsError) as cm:
            k3pack.build_pack(d, d + "/config.json", out=shard, safety_margin_gib=0)
        self.assertIn("out %s is an input (source shard); writing it would destroy it" % shard, str(cm.exception))
        self.assertNotIn("Expert Pack", str(cm.exception))
        self.assertEqual(digest(shard), before)
        self.assertFalse(os.path.exists(shard + ".lock"))
        self.assertEqual(sorted(os.listdir(d)), listing)

    def test_build_pack_refuses_a_user_file_even_with_force(self):
        self.assert_user_file_kept_even_with_force(
            "user.pack", "mine",
            lambda out, force: k3pack.build_pack(self.model, self.config, out=out, safety_margin_gib=0, force=force),
            "refusing to overwrite existing %s (out): it is a file that starts with \"mine\", not an Expert Pack")

    def test_build_pack_refuses_another_pack_unless_force(self):
        out = os.path.join(self.tmp.path, "other.pack")
        with open(out, "wb") as f:
            f.write(b"GGMLMOEPACKv1\0\0\0" + bytes(100))
        with self.assertRaises(FileExistsError) as cm:
            k3pack.build_pack(self.model, self.config, out=out, safety_margin_gib=0)
        self.assertIn("refusing to overwrite existing %s (out): " % out, str(cm.exception))
        self.assertIn("force=True", cm.exception.k3pack_hint)
        r = k3pack.build_pack(self.model, self.config, out=out, safety_margin_gib=0, force=True)
        self.assertEqual(r["index_sha256"], self.built["pack"]["index_sha256"])

    # Finding 4: k3pack_hint is the hint, not "hint: hint: ...".

    def test_hint_attribute_has_no_label(self):
        with self.assertRaises(FileExistsError) as cm:
            k3pack.create_manifest(self.model, self.pack, self.config, self.tok, output=self.config)
        hint = cm.exception.k3pack_hint
        self.assertFalse(hint.startswith("hint:"), hint)
        self.assertEqual(hint, "pass output a new path that is not one of the inputs")
        if hasattr(cm.exception, "__notes__"):
            self.assertEqual(cm.exception.__notes__, ["hint: " + hint])

    # Finding 5: whole-shard SHA-256s by default, as `k3pack manifest`.

    def test_create_manifest_hashes_whole_shards_by_default(self):
        doc = k3pack.create_manifest(self.model, self.pack, self.config, self.tok)
        self.assertTrue(doc["source"]["summary"]["full_source_hashes"])
        for s in doc["source"]["shards"]:
            self.assertEqual(s["sha256"], digest(s["path"]))
        quick = k3pack.create_manifest(self.model, self.pack, self.config, self.tok, full_source_hashes=False)
        self.assertFalse(quick["source"]["summary"]["full_source_hashes"])
        self.assertNotIn("sha256", quick["source"]["shards"][0])
        # k3pack build's manifest (the CLI and k3pack.build) records them too.
        self.assertTrue(self.built["document"]["source"]["summary"]["full_source_hashes"])

    @unittest.skipUnless(_util.have_cli(), "needs the k3pack CLI")
    def test_cli_manifest_default_is_the_same(self):
        out = os.path.join(self.tmp.path, "cli.manifest.json")
        _util.run_cli("manifest", self.model, "--pack", self.pack, "--model-config", self.config,
                      "--tokenizer-dir", self.tok, "--manifest", out, "--progress", "none")
        cli = k3pack.read_manifest(out)
        ours = k3pack.create_manifest(self.model, self.pack, self.config, self.tok)
        self.assertEqual(cli["source"]["summary"]["full_source_hashes"],
                         ours["source"]["summary"]["full_source_hashes"])


    # Left open in session 16: build() planned under the pack's lock, then built and wrote its manifest as
    # separate calls, so another writer could replace the pack between the build and the manifest that
    # records it. The lock is now held from the plan to the manifest's last byte.

    def test_build_holds_the_pack_lock_while_it_writes_the_manifest(self):
        d = self.copy_model("m-lock")
        probes = []
        real = k3pack._k3pack.create_manifest

        def probing_create_manifest(gguf_dir, pack, *args, **kwargs):
            # flock conflicts between two open file descriptions even in one process: this is what another
            # writer (`k3pack pack --force`, a second build) would get now.
            with open(pack + ".lock", "rb") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    probes.append("free")
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    probes.append("held")
            return real(gguf_dir, pack, *args, **kwargs)

        k3pack._k3pack.create_manifest = probing_create_manifest
        try:
            built = k3pack.build(d, os.path.join(d, "config.json"), os.path.join(d, "tokenizer"),
                                 safety_margin_gib=0)
        finally:
            k3pack._k3pack.create_manifest = real
        self.assertEqual(probes, ["held"])
        with open(built["pack"]["pack"] + ".lock", "rb") as f:  # and let go when build() returns
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def test_build_lets_the_lock_go_when_it_fails(self):
        d = self.copy_model("m-lock-fail")
        real = k3pack._k3pack.create_manifest

        def failing_create_manifest(*args, **kwargs):
            raise OSError("the disk went away")

        k3pack._k3pack.create_manifest = failing_create_manifest
        try:
            with self.assertRaises(OSError):
                k3pack.build(d, os.path.join(d, "config.json"), os.path.join(d, "tokenizer"), safety_margin_gib=0)
        finally:
            k3pack._k3pack.create_manifest = real
        pack = glob.glob(os.path.join(d, "*.pack"))[0]
        with open(pack + ".lock", "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        again = k3pack.build(d, os.path.join(d, "config.json"), os.path.join(d, "tokenizer"), safety_margin_gib=0)
        self.assertFalse(again["already_built"])  # the pack is reused, the manifest written
        self.assertTrue(os.path.exists(again["manifest"]))

    # build() takes over and refuses the same manifests as `k3pack build`
    # (one rule in C++: manifest::DecideBuildManifest).

    def built_copy(self, name):
        d = self.copy_model(name)
        k3pack.build(d, os.path.join(d, "config.json"), os.path.join(d, "tokenizer"), safety_margin_gib=0)
        return d

    def test_build_writes_a_new_manifest_for_a_moved_model(self):
        d = self.built_copy("m-moved-from")
        moved = self.fresh_dir("m-moved-to")
        os.rename(d, moved)
        pack = glob.glob(os.path.join(moved, "*.pack"))[0]
        before = digest(pack)
        said = []
        r = k3pack.build(moved, os.path.join(moved, "config.json"), os.path.join(moved, "tokenizer"),
                         safety_margin_gib=0, log=said.append)
        self.assertFalse(r["already_built"])
        self.assertTrue(r["pack"]["already_built"])  # the pack there is reused as it is
        self.assertEqual(digest(pack), before)
        self.assertEqual(k3pack.read_manifest(os.path.join(moved, MANIFEST_NAME))["expert_pack"]["path"], pack)
        self.assertTrue(any("none of its files is any more (the model was moved): writing a new manifest" in line
                            for line in said), said)

    def test_build_says_whose_a_copied_manifest_is(self):
        d = self.built_copy("m-copied-from")
        copy = self.fresh_dir("m-copied-to")
        shutil.copytree(d, copy)
        before = digest(os.path.join(copy, MANIFEST_NAME))
        with self.assertRaises(FileExistsError) as cm:
            k3pack.build(copy, os.path.join(copy, "config.json"), os.path.join(copy, "tokenizer"), safety_margin_gib=0)
        self.assertIn("it records the shards and pack of the model in " + d, str(cm.exception))
        self.assertIn("pass force=True to write this directory's own manifest", cm.exception.k3pack_hint)
        self.assertEqual(digest(os.path.join(copy, MANIFEST_NAME)), before)

    def test_build_refuses_a_path_the_manifest_cannot_record(self):
        d = self.copy_model("m-not-utf8")
        with open(os.path.join(os.fsencode(d), b"tokenizer", b"vocab-\xff.txt"), "wb") as f:
            f.write(b"x")
        with self.assertRaises(Exception) as cm:
            k3pack.build(d, os.path.join(d, "config.json"), os.path.join(d, "tokenizer"), safety_margin_gib=0)
        self.assertIn("is not valid UTF-8, and the manifest records it", str(cm.exception))
        self.assertEqual(glob.glob(os.path.join(d, "*.pack*")) + glob.glob(os.path.join(d, MANIFEST_NAME)), [])


if __name__ == "__main__":
    unittest.main()
