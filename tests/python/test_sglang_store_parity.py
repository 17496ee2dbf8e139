"""k3pack's manifest against a mirror of SGLang's KimiGGMLExpertPackStore
constructor checks (spec sglang-expert-pack.md 2.7 checks 1-13, 7.2), written
here from the spec and sharing no code with k3pack, and k3pack's own store on
the same manifests: a top-4 synthetic checkpoint's manifest must pass both,
and every manifest edit must be refused by both with the same first line.

SGLang passes expected_layers/experts/top_k to its store and holds the roles
to Q2_K/Q2_K/Q3_K and the layers to 1..92; for the tiny model those facts are
the model's own (4 layers, 16 experts, top-4, layers 1..3). The hard
constraints are SGLang's literal dict (top_k 16) compared with Python's `!=`,
exactly as SGLang compares them.
"""

import copy
import hashlib
import json
import os
import re
import struct
import unittest

import _util
import k3pack

PACK_MAGIC = b"GGMLMOEPACKv1\0\0\0"
PACK_HEADER = struct.Struct("<16sIIQQ")
PACK_ENTRY = struct.Struct("<128siIQQ")
ROLES = ("up", "gate", "down")
NAME_RE = re.compile(r"blk\.(?P<layer>\d+)\.ffn_(?P<role>up|gate|down)_exps\.weight")
HARD_CONSTRAINTS = {"top_k": 16, "top_k_is_immutable": True, "all_selected_experts_must_execute": True,
                    "expert_pruning_allowed": False, "requantization_allowed": False}
K3_TYPES = {"up": ("Q2_K", 10), "gate": ("Q2_K", 10), "down": ("Q3_K", 11)}


def sglang_store_checks(pack_path, manifest_path, *, expected_layers=93, expected_experts=896, expected_top_k=16,
                        expected_active=tuple(range(1, 93)), role_types=K3_TYPES):
    """The constructor's validation, in SGLang's order and with its texts."""
    # 1. files
    if not os.path.exists(pack_path) or not os.path.exists(manifest_path):
        raise FileNotFoundError("Kimi expert-pack or manifest is missing: %s, %s" % (pack_path, manifest_path))
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    # 2. complete + format
    if not manifest.get("complete") or manifest.get("format") != "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1":
        raise ValueError("Kimi expert-pack manifest is incomplete or unsupported")
    # 3. the constraints dict, Python equality
    if manifest.get("hard_constraints") != HARD_CONSTRAINTS:
        raise ValueError("Kimi manifest hard constraints do not match runtime policy")
    model = manifest["model"]
    # 4. dimensions (SGLang's store also requires expected_top_k == 16; the
    # tiny model's is 4, so that clause is the caller's expected value here)
    dims = (model["num_hidden_layers"], model["num_experts"], model["num_experts_per_token"])
    expected = (expected_layers, expected_experts, expected_top_k)
    if dims != expected:
        raise ValueError("Kimi expert-pack dimensions %s != %s; Top-K is immutable at 16" % (dims, expected))
    # 5. active layers
    if list(model["active_moe_layer_ids"]) != list(expected_active):
        raise ValueError("Kimi active routed MoE layers must be exactly %d..%d" % (expected_active[0],
                                                                                    expected_active[-1]))
    ep = manifest["expert_pack"]
    # 6-8. path, size, role order
    if os.path.realpath(ep["path"]) != os.path.realpath(pack_path):
        raise ValueError("Kimi manifest expert-pack path does not match pack_path")
    size = os.path.getsize(pack_path)
    if ep["size"] != size:
        raise ValueError("Kimi expert-pack size does not match its manifest")
    if ep["physical_role_order"] != ["up", "gate", "down"]:
        raise ValueError("Kimi expert-pack physical role order is unsupported")
    # 9. quant types per role
    roles = ep["roles"]
    for role in ROLES:
        if (roles[role]["dtype"], roles[role]["dtype_id"]) != role_types[role]:
            raise ValueError("Kimi expert-pack %s quant type is unsupported" % role)
    # 10. role sizes add up
    role_nbytes = {role: roles[role]["expert_bytes"] for role in ROLES}
    if sum(role_nbytes.values()) != ep["object_bytes"]:
        raise ValueError("Kimi expert-pack role sizes do not match object bytes")
    role_offsets = {"up": 0, "gate": role_nbytes["up"], "down": role_nbytes["up"] + role_nbytes["gate"]}
    # 11. header
    count = len(expected_active) * expected_experts * 3
    with open(pack_path, "rb") as f:
        header = f.read(PACK_HEADER.size)
        if len(header) != PACK_HEADER.size:
            raise ValueError("Kimi expert-pack header is truncated")
        magic, version, header_size, index_count, data_start = PACK_HEADER.unpack(header)
        if (magic, version, header_size, index_count, data_start) != (PACK_MAGIC, 1, 40, count, ep["data_start"]):
            raise ValueError("Kimi expert-pack header does not match its manifest")
        index = f.read(count * PACK_ENTRY.size)
    # 12. entries, read one by one (SGLang's loop): a short entry is the
    # truncation text, after the complete entries before it were checked
    previous_end = data_start
    object_offset = None
    for i in range(count):
        if len(index) < (i + 1) * PACK_ENTRY.size:
            raise ValueError("Kimi expert-pack index is truncated")
        raw_name, expert, reserved, offset, nbytes = PACK_ENTRY.unpack_from(index, i * PACK_ENTRY.size)
        object_index, role_id = divmod(i, 3)
        layer_index, want_expert = divmod(object_index, expected_experts)
        role = ROLES[role_id]
        match = NAME_RE.fullmatch(raw_name.split(b"\0", 1)[0].decode("utf-8"))  # strict, as SGLang
        if (match is None or int(match["layer"]) != expected_active[layer_index] or match["role"] != role
                or expert != want_expert or reserved != 0):
            raise ValueError("Kimi expert-pack identity mismatch at index %d" % i)
        if (nbytes != role_nbytes[role] or offset % ep["alignment"] or offset < previous_end
                or offset + nbytes > size):
            raise ValueError("Kimi expert-pack range mismatch at index %d" % i)
        if role == "up":
            object_offset = offset
        elif offset != object_offset + role_offsets[role]:
            raise ValueError("Kimi expert object is not contiguous at index %d" % i)
        previous_end = offset + nbytes
    if previous_end != size:
        raise ValueError("Kimi expert-pack file has trailing or missing bytes")
    # 13. index digest
    digest = hashlib.sha256(header + index).hexdigest()
    if digest != ep["index_sha256"]:
        raise ValueError("Kimi expert-pack index SHA-256 does not match manifest")
    return manifest


@unittest.skipUnless(_util.cli_has_command("manifest"), "needs the k3pack CLI")
class TopFourManifest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        model = os.path.join(cls.tmp.path, "model")
        _util.synth(model)
        cls.pack = os.path.join(cls.tmp.path, "KIMI-K3-SYNTH.expert-major.pack")
        cls.manifest = os.path.join(cls.tmp.path, "m.json")
        config = os.path.join(model, "config.json")
        _util.run_cli("pack", "--profile", "scaled", "--progress", "none", "--gguf-dir", model, "--model-config",
                      config, "--out", cls.pack)
        _util.run_cli("manifest", "--profile", "scaled", "--progress", "none", "--gguf-dir", model,
                      "--expert-pack", cls.pack, "--model-config", config, "--tokenizer-dir",
                      os.path.join(model, "tokenizer"), "--output", cls.manifest)
        with open(cls.manifest, encoding="utf-8") as f:
            cls.doc = json.load(f)
        cls.edited = os.path.join(cls.tmp.path, "edited.json")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def sglang(self, manifest):
        return sglang_store_checks(self.pack, manifest, expected_layers=4, expected_experts=16, expected_top_k=4,
                                   expected_active=(1, 2, 3), role_types=K3_TYPES)

    def k3pack_store(self, manifest):
        return k3pack.ExpertStore(self.pack, manifest, cache_bytes=64 << 20)

    def test_top4_manifest_passes_sglangs_store_checks(self):
        self.assertEqual(self.doc["model"]["num_experts_per_token"], 4)
        self.assertEqual(self.doc["expert_pack"]["top_k"], 4)
        self.assertEqual(self.doc["hard_constraints"], HARD_CONSTRAINTS)
        self.sglang(self.manifest)  # raises on any refused check
        store = self.k3pack_store(self.manifest)
        store.close()

    def edit(self, change):
        doc = copy.deepcopy(self.doc)
        change(doc)
        with open(self.edited, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        return self.edited

    def assert_both_refuse(self, change, text):
        path = self.edit(change)
        with self.assertRaises(ValueError) as want:
            self.sglang(path)
        self.assertEqual(str(want.exception), text)
        with self.assertRaises(ValueError) as got:
            self.k3pack_store(path)
        self.assertEqual(str(got.exception), text)

    def test_constraints_compared_with_python_equality(self):
        def top_k(value):
            return lambda d: d["hard_constraints"].__setitem__("top_k", value)

        # What k3pack used to write for a top-4 model.
        self.assert_both_refuse(top_k(4), "Kimi manifest hard constraints do not match runtime policy")
        self.assert_both_refuse(lambda d: d["hard_constraints"].__setitem__("extra", False),
                                "Kimi manifest hard constraints do not match runtime policy")
        self.assert_both_refuse(lambda d: d["hard_constraints"].pop("requantization_allowed"),
                                "Kimi manifest hard constraints do not match runtime policy")
        # Equal in Python: 16.0 == 16, 1 == True, 0 == False; key order is irrelevant.
        for change in (top_k(16.0),
                       lambda d: d["hard_constraints"].__setitem__("top_k_is_immutable", 1),
                       lambda d: d["hard_constraints"].__setitem__("expert_pruning_allowed", 0),
                       lambda d: d.__setitem__("hard_constraints", dict(reversed(list(HARD_CONSTRAINTS.items()))))):
            path = self.edit(change)
            self.sglang(path)
            self.k3pack_store(path).close()

    def test_role_records_are_checked_against_the_pack(self):
        def roles(role, key, delta=None, value=None):
            def change(d):
                r = d["expert_pack"]["roles"][role]
                r[key] = value if value is not None else r[key] + delta
            return change

        self.assert_both_refuse(roles("up", "dtype", value="Q4_K"), "Kimi expert-pack up quant type is unsupported")
        self.assert_both_refuse(roles("down", "dtype_id", value=12), "Kimi expert-pack down quant type is unsupported")
        self.assert_both_refuse(lambda d: d["expert_pack"].__setitem__("object_bytes",
                                                                       d["expert_pack"]["object_bytes"] + 4096),
                                "Kimi expert-pack role sizes do not match object bytes")

        def shift(a, b):  # sizes move between two roles; their sum (object_bytes) still matches
            def change(d):
                roles(a, "expert_bytes", 4096)(d)
                roles(b, "expert_bytes", -4096)(d)
            return change

        self.assert_both_refuse(shift("up", "gate"), "Kimi expert-pack range mismatch at index 0")
        self.assert_both_refuse(shift("gate", "down"), "Kimi expert-pack range mismatch at index 1")

    def test_active_layers_disagreeing_with_the_model(self):
        self.assert_both_refuse(lambda d: d["model"]["active_moe_layer_ids"].pop(),
                                "Kimi active routed MoE layers must be exactly 1..3")
        self.assert_both_refuse(lambda d: d["model"]["active_moe_layer_ids"].insert(0, 0),
                                "Kimi active routed MoE layers must be exactly 1..3")


if __name__ == "__main__":
    unittest.main()
