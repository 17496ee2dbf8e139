"""Artifacts crossing between SGLang and k3pack, both ways (RELIABILITY.md,
"Faults from an SGLang interop audit (session 16)").

SGLang -> k3pack: a manifest written as SGLang's create_manifest writes it
(tests/manifest/sglang_manifest_ref.py, CPython's json) into an artifact
directory away from the shards, over a pack with none of k3pack's sidecars,
in the serialization variants SGLang's json module produces; every k3pack
reader must take it. k3pack -> SGLang: what k3pack builds must pass SGLang's
readers (tests/python/sglang_readers_ref.py, from the spec) and be reused by
the server's auto-preparation.
"""

import json
import os
import shutil
import subprocess
import sys
import unittest

import _util
import k3pack
import sglang_readers_ref as sgl

MANIFEST_REF = os.path.join(_util.REPO, "tests", "manifest", "sglang_manifest_ref.py")
SGLANG_MANIFEST = "kimi-k3-expert-pack.manifest.json"
# KimiGGMLExpertPackStore's stats keys and their types (spec §7.3, §7.7).
STATS_TYPES = {
    "pack_path": str, "pack_entries": int, "pack_reads": int, "pack_read_bytes": int, "pack_read_ns": int,
    "read_splits": int, "direct_io": bool, "cache_hits": int, "cache_misses": int, "cache_evictions": int,
    "cache_policy": str, "kernel_backend": str, "resident_experts": int, "resident_bytes": int, "h2d_bytes": int,
    "cache_vram_reserve_mib": int, "fallback_count": int, "io_errors": int, "pack_format": str,
    "active_moe_layers": int, "cache_capacity_experts": int, "cache_capacity_bytes": int, "staged_bytes": int,
    "mean_read_ms": float, "route_calls_by_layer": list, "route_tokens_by_layer": list,
}


def sglang_manifest(model, pack, out, scaled):
    """SGLang's manifest of `pack` at `out` (prepare_kimi_manifest.py's defaults)."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    args = [sys.executable, MANIFEST_REF, "--gguf-dir", model, "--expert-pack", pack, "--model-config",
            os.path.join(model, "config.json"), "--tokenizer-dir", os.path.join(model, "tokenizer"), "--output", out,
            "--created-at", "2026-01-02T03:04:05.123456+00:00", "--git-sha", "unknown"]
    subprocess.run(args + (["--profile", "scaled"] if scaled else []), check=True)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def rewrite(doc, path, **dump):
    """`doc` written at `path` as json.dump(**dump) writes it (no newline added)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, **dump)


@unittest.skipUnless(_util.cli_has_command("synth"), "needs the k3pack CLI")
class FromSglang(unittest.TestCase):
    """The tiny model's pack as SGLang's prepare_kimi_pack leaves it (no
    .digests, no checkpoint) and SGLang's manifest of it in a unicode
    artifact directory."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        _util.synth(cls.model)
        cls.pack = os.path.join(cls.model, "KIMI-K3-SYNTH.expert-major.pack")
        k3pack.build_pack(cls.model, os.path.join(cls.model, "config.json"), out=cls.pack, profile="scaled",
                          safety_margin_gib=0)
        for sidecar in (".digests", ".lock"):
            if os.path.exists(cls.pack + sidecar):
                os.remove(cls.pack + sidecar)
        cls.artifact = os.path.join(cls.tmp.path, "cache", "sglang-expert-pack", "kimi-k3", "ārtifact-é")
        cls.manifest = os.path.join(cls.artifact, SGLANG_MANIFEST)
        cls.doc = sglang_manifest(cls.model, cls.pack, cls.manifest, scaled=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def variant(self, name, doc=None, **dump):
        path = os.path.join(self.tmp.path, "variants", name, SGLANG_MANIFEST)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rewrite(self.doc if doc is None else doc, path, **dump)
        return path

    def test_verify_full_against_source_needs_no_digest_sidecar(self):
        # It said "digest sidecar ... is missing; use --against-source", to a
        # command that had --against-source.
        proc = _util.run_cli("verify", self.manifest, "--full", "--against-source", "--json")
        out = json.loads(proc.stdout)
        self.assertEqual(out["digest_sidecar"], "missing")
        self.assertEqual(out["entries_checked"], self.doc["expert_pack"]["index_count"])
        # Without --against-source the sidecar is what was asked for.
        proc = _util.run_cli("verify", self.manifest, "--full", check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("digests is missing", proc.stderr)

    def test_a_manifest_without_a_tokenizer_section_is_read(self):
        # SGLang's store and iterator never read "tokenizer"; run-experts
        # refused the manifest ("manifest tokenizer: expected an object").
        for name, doc in (("null", dict(self.doc, tokenizer=None)),
                          ("absent", {k: v for k, v in self.doc.items() if k != "tokenizer"})):
            with self.subTest(name):
                path = self.variant("tokenizer-" + name, doc, ensure_ascii=False, indent=2, sort_keys=True)
                _util.run_cli("run-experts", path, "--tokens", "1")
                out = json.loads(_util.run_cli("verify", path, "--json").stdout)
                self.assertFalse(out["tokenizer_checked"])
                self.assertTrue(json.loads(_util.run_cli("verify", self.manifest, "--json").stdout)["tokenizer_checked"])

    def test_every_reader_takes_sglang_serializations(self):
        variants = {
            "as-written": None,
            "ascii-escaped": dict(ensure_ascii=True, indent=2, sort_keys=True),
            "compact-unsorted-no-newline": dict(separators=(",", ":")),
        }
        for name, dump in variants.items():
            with self.subTest(name):
                path = self.manifest if dump is None else self.variant(name, **dump)
                folder = os.path.dirname(path)
                _util.run_cli("verify", path)
                _util.run_cli("load", folder, "--json")
                _util.run_cli("run-experts", path, "--tokens", "1")
                _util.run_cli("doctor", path, "--no-values")
                trace = os.path.join(self.tmp.path, name + ".trace")
                _util.run_cli("trace", "gen", "--trace", trace, "--manifest", folder, "--requests", "1",
                              "--prompt-tokens", "1", "--decode-tokens", "1", "--force")
                _util.run_cli("trace", "replay", "--trace", trace, "--manifest", folder, "--cache-mib", "8")
                k3pack.ExpertStore(self.pack, path).close()
                from k3pack.sglang import KimiGGMLExpertPackStore, kimi_k3_nonexpert_weights_iterator

                model = self.doc["model"]
                KimiGGMLExpertPackStore(self.pack, manifest_path=path, expected_layers=model["num_hidden_layers"],
                                        expected_experts=model["num_experts"],
                                        expected_top_k=model["num_experts_per_token"], cache_vram_mib=8,
                                        cache_vram_reserve_mib=1).close()
                self.assertGreater(sum(1 for _ in kimi_k3_nonexpert_weights_iterator(path)), 0)

    def test_a_pack_moved_from_its_manifest_is_refused_as_sglang_refuses(self):
        moved = os.path.join(self.tmp.path, "elsewhere", os.path.basename(self.pack))
        os.makedirs(os.path.dirname(moved), exist_ok=True)
        os.link(self.pack, moved)
        model = self.doc["model"]
        dims = dict(expected_layers=model["num_hidden_layers"], expected_experts=model["num_experts"],
                    expected_top_k=model["num_experts_per_token"])
        with self.assertRaises(ValueError) as ref:
            sgl.store_checks(moved, self.manifest, active_layers=model["active_moe_layer_ids"], k3_types=False,
                             **dims)
        from k3pack.sglang import KimiGGMLExpertPackStore

        with self.assertRaises(ValueError) as ours:
            KimiGGMLExpertPackStore(moved, manifest_path=self.manifest, cache_vram_mib=8, cache_vram_reserve_mib=1,
                                    **dims)
        self.assertEqual(str(ours.exception), str(ref.exception))


@unittest.skipUnless(_util.cli_has_command("synth"), "needs the k3pack CLI")
class ToSglang(unittest.TestCase):
    """The full Kimi-K3 structure (sparse) built by `k3pack build` with
    relative paths: SGLang's readers and its auto-preparation see it."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "k3")
        _util.run_cli("synth", "--preset", "k3-structure", "--out", cls.model)
        subprocess.run([_util.k3pack_bin(), "build", "k3", "--progress", "none", "--no-full-source-hashes"],
                       cwd=cls.tmp.path, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.pack = os.path.join(cls.model, "KIMI-K3-SYNTH.expert-major.pack")
        cls.manifest = os.path.join(cls.model, SGLANG_MANIFEST)
        cls.shard = os.path.join(cls.model, "KIMI-K3-SYNTH-00001-of-00019.gguf")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_sglang_readers_accept_what_k3pack_builds(self):
        with open(self.manifest, encoding="utf-8") as f:
            doc = json.load(f)
        self.assertEqual(doc["expert_pack"]["path"], os.path.realpath(self.pack))
        self.assertEqual(sgl.store_checks(self.pack, self.manifest), doc["expert_pack"]["index_sha256"])
        self.assertGreater(sgl.iterator_checks(self.manifest), 0)
        # The server's auto-preparation finds k3pack's pack where it looks
        # and reuses it (6 payload samples against the shards).
        self.assertEqual(sgl.prepare_pack_decision(self.shard), ("EXPERT_PACK_VALID", self.pack))

    def test_sglang_refuses_a_rank_pack_that_k3pack_serves(self):
        # A rank pack holds only its rank's experts and SGLang runs its expert
        # pack at EP 1 only: handed to SGLang's server it would serve every
        # other expert as zeros. Its manifest makes SGLang's store refuse it;
        # the non-routed weights still stream, and k3pack serves the rank.
        out = os.path.join(self.tmp.path, "rank")
        os.makedirs(out)
        pack = os.path.join(out, "KIMI-K3-SYNTH.expert-major.pack")
        build = [self.model, "--pack", pack, "--ep-size", "2", "--ep-rank", "1", "--progress", "none",
                 "--no-full-source-hashes"]
        _util.run_cli("build", *build)
        rank_pack = os.path.join(out, "KIMI-K3-SYNTH.expert-major.ep1-of-2.pack")
        manifest = os.path.join(out, "kimi-k3-expert-pack.ep1-of-2.manifest.json")
        with open(manifest, encoding="utf-8") as f:
            doc = json.load(f)
        self.assertEqual(doc["k3pack"]["ep"], {"size": 2, "rank": 1, "first_expert": 448, "end_expert": 896})
        with self.assertRaises(ValueError) as ref:
            sgl.store_checks(rank_pack, manifest)
        self.assertEqual(str(ref.exception), "Kimi manifest hard constraints do not match runtime policy")
        self.assertGreater(sgl.iterator_checks(manifest), 0)
        with k3pack.ExpertStore(rank_pack, manifest, cache_bytes=256 << 20) as store:
            self.assertEqual((store.info["ep_size"], store.info["ep_rank"]), (2, 1))
        report = json.loads(_util.run_cli("verify", manifest, "--json").stdout)
        self.assertTrue(report["ep"]["sglang_store_refuses"])
        self.assertNotIn("regenerate_with", report["ep"])

        # A rank manifest as k3pack wrote it before: SGLang's store took it.
        # k3pack still reads it; verify says so and gives the command that
        # writes it anew, and a rerun of the rank's build replaces it.
        older = os.path.join(out, "older manifest.json")
        doc["hard_constraints"] = sgl.HARD_CONSTRAINTS
        rewrite(doc, older, indent=2, sort_keys=True)
        self.assertEqual(sgl.store_checks(rank_pack, older), doc["expert_pack"]["index_sha256"])
        report = json.loads(_util.run_cli("verify", older, "--json").stdout)
        self.assertFalse(report["ep"]["sglang_store_refuses"])
        command = report["ep"]["regenerate_with"]
        self.assertIn(command, _util.run_cli("verify", older).stdout)
        self.assertTrue(command.startswith("k3pack manifest "), command)
        subprocess.run(_util.k3pack_bin() + command[len("k3pack"):] + " --progress none --no-full-source-hashes",
                       shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self.assertRaises(ValueError):
            sgl.store_checks(rank_pack, older)
        rewrite(doc, manifest, indent=2, sort_keys=True)
        proc = _util.run_cli("build", *build)
        self.assertIn("is a rank manifest SGLang's store would take", proc.stderr)
        with self.assertRaises(ValueError):
            sgl.store_checks(rank_pack, manifest)
        self.assertEqual(_util.run_cli("build", *build).stderr.count("SGLang's store would take"), 0)

    def test_a_moved_output_directory_is_refused_by_both(self):
        moved = self.model + "-moved"
        os.rename(self.model, moved)
        try:
            pack, manifest = (os.path.join(moved, os.path.basename(p)) for p in (self.pack, self.manifest))
            with self.assertRaises(ValueError) as ref:
                sgl.store_checks(pack, manifest)
            proc = _util.run_cli("verify", manifest, check=False)
            self.assertEqual(proc.returncode, 1)
            with self.assertRaises((ValueError, FileNotFoundError)):
                k3pack.ExpertStore(pack, manifest)
            from k3pack.sglang import KimiGGMLExpertPackStore

            with self.assertRaises(ValueError) as ours:
                KimiGGMLExpertPackStore(pack, manifest_path=manifest, expected_layers=93, expected_experts=896,
                                        expected_top_k=16, cache_vram_mib=200, cache_vram_reserve_mib=1)
            self.assertEqual(str(ours.exception), str(ref.exception))
        finally:
            os.rename(moved, self.model)

    def test_k3pack_reads_sglang_manifest_of_the_full_structure(self):
        artifact = os.path.join(self.tmp.path, "artifact")
        manifest = os.path.join(artifact, SGLANG_MANIFEST)
        doc = sglang_manifest(self.model, self.pack, manifest, scaled=False)
        self.assertNotIn("k3pack", doc)
        out = json.loads(_util.run_cli("verify", artifact, "--json").stdout)
        self.assertEqual(out["index_sha256"], doc["expert_pack"]["index_sha256"])
        k3pack.ExpertStore(self.pack, manifest).close()

    def test_stats_file_has_sglang_keys_types_and_meaning(self):
        from k3pack.sglang import KimiGGMLExpertPackStore
        import torch

        stats = os.path.join(self.tmp.path, "stats", "kimi-k3-expert-pack.stats.json")
        store = KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest, expected_layers=93,
                                        expected_experts=896, expected_top_k=16, cache_vram_mib=400,
                                        cache_vram_reserve_mib=1, stats_path=stats)
        store.initialize_device_cache("cpu")
        _, slots = store.acquire(5, torch.arange(16).reshape(1, 16))
        store.mark_used(slots)
        store.close()
        with open(stats, encoding="ascii") as f:
            text = f.read()
        snap = json.loads(text)
        self.assertEqual(text, json.dumps(snap, indent=2, sort_keys=True) + "\n")
        for key, kind in STATS_TYPES.items():
            self.assertIs(type(snap[key]), kind, key)
        self.assertEqual(snap["pack_path"], os.path.realpath(self.pack))
        self.assertEqual(snap["pack_entries"], 247296)
        self.assertEqual(snap["active_moe_layers"], 92)
        self.assertEqual(snap["pack_format"], "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1")
        self.assertEqual((snap["cache_misses"], snap["pack_reads"], snap["resident_experts"]), (16, 16, 16))
        self.assertEqual(snap["cache_capacity_bytes"], snap["cache_capacity_experts"] * 11956224)
        self.assertEqual(snap["resident_bytes"], 16 * 11956224)
        self.assertEqual(len(snap["route_calls_by_layer"]), 93)
        self.assertEqual([i for i, n in enumerate(snap["route_calls_by_layer"]) if n], [5])
        self.assertEqual(snap["route_tokens_by_layer"][5], 1)
        self.assertAlmostEqual(snap["mean_read_ms"], snap["pack_read_ns"] / snap["pack_reads"] / 1e6)


if __name__ == "__main__":
    unittest.main()
