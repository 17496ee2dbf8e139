// The catalog of diagnoses: for every finding code, its severity, the Python
// exception SGLang raises for it, what it means and how to fix it. The
// per-object details (which tensor, which values) go into Finding::message;
// docs/doctor.md lists the same codes (a test keeps them in sync).
#include "k3pack/doctor.h"

namespace k3pack::doctor {

namespace {

constexpr Severity E = Severity::kError;
constexpr Severity W = Severity::kWarning;
constexpr Severity I = Severity::kInfo;

const std::vector<Diagnosis> kCatalog = {
    // ---------------------------------------------------------------- inputs
    {"input-missing", E, "FileNotFoundError", "The path given to doctor does not exist.",
     "Check the path; pass a GGUF shard, the directory holding the shards, or a manifest JSON."},
    {"input-unrecognized", E, "ValueError",
     "The path is neither a GGUF file, a directory with GGUF files, nor a k3pack/SGLang manifest JSON.",
     "Pass a GGUF shard, the shard directory, or the *.manifest.json written by `k3pack manifest`."},
    {"no-gguf-files", E, "ValueError", "The directory holds no *.gguf file, so SGLang finds no shards.",
     "Point at the directory that holds the <prefix>-NNNNN-of-NNNNN.gguf files (or finish the download)."},
    // ------------------------------------------------------------ shard set
    {"stray-gguf", E, "ValueError",
     "SGLang's discovery takes every *.gguf in the directory as a shard; a file without the "
     "-NNNNN-of-NNNNN.gguf suffix (an mmproj, a leftover single-file model) makes preparation fail.",
     "Move the other GGUF file out of the shard directory (k3pack itself ignores it, SGLang does not)."},
    {"gguf-not-numbered", E, "ValueError",
     "SGLang only loads numbered split sets (<prefix>-NNNNN-of-NNNNN.gguf with split.* keys); a single "
     "unsplit file is refused by its preparation tools.",
     "Re-split it with llama-gguf-split (one shard is fine: --split-max-tensors larger than the tensor count), "
     "which writes the -00001-of-00001 name and the split.* keys."},
    {"several-shard-sets", E, "ValueError",
     "The directory holds more than one numbered shard set (another quantization, or a renamed copy of a shard); "
     "SGLang's discovery takes every numbered *.gguf as one set, so it fails: the split counts disagree, or the "
     "numbers of all files together are not 1..count.",
     "Keep one model per directory: move the other set's files (named in the message) out; doctor checked the set "
     "named in the message."},
    {"shard-count-disagree", E, "ValueError",
     "The shard file names disagree on the total count (-of-NNNNN), e.g. files of two downloads mixed.",
     "Remove the files of the other download so that every shard name ends in the same -of-NNNNN."},
    {"shard-set-incomplete", E, "ValueError", "Shard files are missing from the numbered set.",
     "Download the missing shard files (numbers listed in the message) into the same directory."},
    {"synth-unfinished", E, "",
     "A `k3pack synth` into this directory did not finish (it was interrupted or failed): its marker "
     ".k3pack-synth.partial is there, so shards may be missing or half written whatever they look like.",
     "Run the same `k3pack synth` command again: it writes the directory over from the start."},
    {"repair-unfinished", E, "",
     "A `k3pack repair` into this directory did not finish: its marker .k3pack-repair.partial is there, so some "
     "shards may be the input's, some repaired, some missing.",
     "Run the same `k3pack repair` command again: it finishes the directory."},
    {"gguf-unreadable", E, "ValueError",
     "The file is not a readable GGUF: its header breaks a rule of ggml's reader (the message names "
     "the byte offset and the rule). Nothing else in this file could be checked.",
     "Re-download the file (compare its size and checksum with the source) or re-convert it."},
    {"file-permission-denied", E, "PermissionError",
     "This user may not read the file (its mode, owner or an ACL denies it; or a directory above it cannot be "
     "searched). The file itself may be intact; SGLang run as the same user fails the same way when it opens it. "
     "Nothing in it could be checked.",
     "Make it readable for the user that runs k3pack and SGLang (chmod a+r FILE, or chown/chgrp it to that user), "
     "or run as a user who may read it; then run doctor again. `details`: `errno`."},
    {"open-file-limit", E, "OSError",
     "The process ran out of file descriptors when doctor opened the file (the per-process limit, `ulimit -n`, or "
     "the system's table of open files): the file itself may be intact, and nothing in it could be checked. SGLang "
     "run under the same limit fails the same way when it opens it.",
     "Raise the limit in the shell that runs doctor (`ulimit -n 4096`; the hint in the message says the value now) "
     "and run doctor again. `details`: `errno`."},
    {"out-of-memory", E, "OSError",
     "The process could not map or allocate memory when doctor read the file (mostly an address-space limit, "
     "`ulimit -v`, far below what the file's mapping needs; else memory is exhausted): the file itself may be "
     "intact, and nothing in it could be checked. SGLang run under the same limit fails when it maps it.",
     "Raise the limit in the shell that runs doctor (`ulimit -v unlimited`; the hint in the message says the value "
     "now) or free memory, and run doctor again. `details`: `errno`."},
    {"shard-link-broken", E, "FileNotFoundError",
     "The shard is a symbolic link whose target does not exist, typically a Hugging Face cache snapshot "
     "(snapshots/<rev>/ links to blobs/) whose blob was deleted or has not finished downloading "
     "(blobs/<sha>.incomplete). SGLang's discovery lists the link and its GGUF reader fails to open it.",
     "Download the file again (huggingface-cli download resumes the .incomplete blob), or replace the link with "
     "the complete file."},
    {"download-in-progress", E, "",
     "An aria2 control file (<shard>.aria2) is beside the shard: aria2 is still downloading it, or was "
     "interrupted. aria2 writes into the final file name and preallocates its full size, so the size and header "
     "look right while parts of the data are still zeros; nothing else reveals it (zeros decode as valid weights).",
     "Resume the download with the same aria2c command (hfd.sh and similar use aria2c) until the .aria2 file "
     "disappears, then run doctor again."},
    {"gguf-header-invalid", E, "ValueError",
     "The header breaks a rule of ggml's reader (see the message); doctor read it leniently to check the rest.",
     "Re-convert or re-split the file with llama.cpp's tools (gguf-split / llama-quantize --keep-split)."},
    {"gguf-not-utf8", E, "UnicodeDecodeError",
     "A metadata key or tensor name is not valid UTF-8. k3pack keeps GGUF strings as bytes and reads the file "
     "(the manifest writer still refuses such a tensor name); SGLang's GGUF reader (gguf-py) decodes every key and "
     "tensor name strictly, so its scan fails with this error before any other check.",
     "Rewrite the key or name as UTF-8 (gguf-py's GGUFWriter copying the shard's metadata and tensors); the message "
     "gives the file offset of the string."},
    {"gguf-truncated", E, "ValueError",
     "The file is shorter than its own header says: the tensors listed end past the end of the file "
     "(an interrupted download or copy).",
     "Re-download this shard; `k3pack doctor` lists the tensors whose data is cut off."},
    {"split-key-missing", E, "ValueError",
     "A split key (split.no, split.count, split.tensors.count) or general.architecture is missing; SGLang's "
     "scanner requires all of them in every shard.",
     "Re-split with gguf-split or llama-quantize --keep-split, which write the split keys into every shard."},
    {"architecture-first-shard-only", E, "ValueError",
     "general.architecture is in the first shard only (llama.cpp's gguf-split writes the model's metadata "
     "into the first shard). k3pack reads the architecture from the first shard and accepts this set; "
     "SGLang's scanner requires the key in every shard and refuses it.",
     "For k3pack nothing is needed. For SGLang, give every shard the key: rewrite each later shard with "
     "general.architecture = 'kimi-k3' added to its metadata (e.g. gguf-py's GGUFWriter copying the "
     "shard's keys and tensors), keeping the file names and split.* keys."},
    {"split-no-mismatch", E, "ValueError",
     "The shard's split.no does not match its position in the file-name order: the file was renamed or "
     "belongs to another set.",
     "Give each shard its original name (split.no + 1 = the NNNNN in the name) or re-download it."},
    {"shards-renamed", E, "ValueError",
     "The file names contradict the headers, which alone form one complete split (split.count equals the "
     "number of files, split.no covers 0..count-1): the files were renamed, so SGLang's discovery sees a missing "
     "shard, mixed counts or a split.no mismatch, though nothing is missing.",
     "Rename each file to <prefix>-NNNNN-of-NNNNN.gguf with NNNNN = split.no + 1 and the count from split.count "
     "(the message gives the commands)."},
    {"split-metadata-mismatch", E, "ValueError",
     "split.count, split.tensors.count or general.architecture differ between shards: the files come from "
     "different splits or conversions.",
     "Use shards of one split run only; re-download the odd shard."},
    {"split-count-mismatch", E, "ValueError", "split.count does not match the number of shard files found.",
     "Download the missing shards, or remove shards of another split."},
    {"split-tensor-count-mismatch", E, "ValueError",
     "split.tensors.count (the total the splitter recorded) differs from the tensors actually present: "
     "tensors are missing, extra, or the key is stale after editing.",
     "Re-split the model; if tensors were added or removed on purpose, rewrite split.tensors.count in every shard."},
    {"duplicate-tensor", E, "ValueError", "The same tensor name appears in two shards.",
     "Remove the shard that does not belong to this set, or re-split the model."},
    {"architecture-mismatch", E, "ValueError", "general.architecture is not 'kimi-k3'.",
     "Convert the model with a llama.cpp that knows Kimi-K3 (convert_hf_to_gguf.py, arch kimi-k3)."},
    // ------------------------------------------------------ model and config
    {"model-metadata-invalid", E, "KeyError",
     "The kimi-k3.* hyper-parameters needed to know the expected tensors are missing or inconsistent; name "
     "and shape checks against the model layout were skipped.",
     "Re-convert with llama.cpp's Kimi-K3 converter, which writes every kimi-k3.* key."},
    {"config-missing", I, "", "No config.json beside the shards or in their tokenizer directory (or given with "
     "--model-config): the HF config "
     "invariants and the config/GGUF cross-check were skipped.",
     "Pass --model-config PATH (the model's config.json) to include those checks."},
    {"config-invalid", E, "ValueError",
     "The HF config.json does not satisfy the model invariants (SGLang's KimiK3Spec), or holds a value SGLang "
     "cannot build the model from (a size that is no integer, a kda_layers that is no list).",
     "Use the original Kimi-K3 config.json (text_config), or --profile scaled for scaled-down models."},
    {"config-gguf-mismatch", E, "ValueError",
     "config.json and the GGUF metadata disagree on a dimension: they describe different models.",
     "Put the config.json of the model that was converted beside the shards."},
    // ---------------------------------------------------------------- names
    {"tensor-name-unknown", E, "KeyError",
     "SGLang maps every non-expert GGUF tensor to a model parameter; this name is not in its table, so "
     "loading stops with a KeyError.",
     "Re-convert with llama.cpp's Kimi-K3 converter, or rename/remove the tensor."},
    {"tensor-name-misspelled", E, "KeyError",
     "An unknown tensor name is a near miss of an expected tensor that is missing: most likely a "
     "renamed/misspelled tensor (converter with a different naming scheme).",
     "Rename the tensor to the suggested name (the converter's scheme) or re-convert."},
    {"tensor-wrong-layer-kind", W, "",
     "A tensor of the other attention kind (KDA vs MLA) sits in this layer; SGLang maps it without checking "
     "and the model never uses it.",
     "Check attention.head_count_kv (0 = KDA layer) against the layer pattern of the converter."},
    {"tensor-layer-spelling", I, "",
     "The tensor's layer is written with leading zeros or other decimal digits (blk.07 for blk.7); SGLang reads "
     "the layer as int(), so it loads the tensor as the converter's name, and doctor checks it as that tensor.",
     "Nothing to do for SGLang or k3pack; rename it to the converter's name (in the message) for other tools."},
    {"duplicate-target", E, "ValueError",
     "Two GGUF tensors map to the same SGLang parameter (blk.N.ssm_g and blk.N.attn_gate both map to "
     "self_attn.g_proj), so SGLang's non-expert iterator stops at the second one.",
     "Keep the tensor of this layer's attention kind (ssm_g in KDA layers, attn_gate in MLA layers) and "
     "remove the other, or re-convert."},
    {"tensor-missing", E, "RuntimeError",
     "A tensor the Kimi-K3 layout requires for these hyper-parameters is absent; SGLang's strict parameter "
     "coverage check (Kimi-K3 GGUF did not initialize all model parameters) fails.",
     "Re-convert or re-download; if a near-miss name exists it is reported as tensor-name-misspelled."},
    {"tensor-shape-mismatch", E, "ValueError",
     "The tensor's shape (GGUF ne order) differs from what the kimi-k3.* metadata implies (MLA head sizes "
     "come from attention.key_length_mla and value_length_mla; a KDA conv1d may be {C, 1, Di} or the "
     "converter's {C, 1, Di, 1}).",
     "Re-convert the model; the metadata and the tensors come from different configurations."},
    {"tensor-must-be-float", E, "RuntimeError",
     "This tensor feeds an unquantized module (norm, router, conv, A_log, dt_bias, residual score); SGLang "
     "loads it as a plain weight and a quantized one is silently skipped, failing parameter coverage.",
     "Keep it F32 when quantizing (llama.cpp does so by default); re-quantize from the F32/BF16 GGUF."},
    {"tensor-must-be-quantized", E, "RuntimeError",
     "This tensor feeds a GGUF-quantized linear layer in SGLang's expert_pack path; stored as F32/F16/BF16 it "
     "is yielded as `.weight`, which the model does not have, so parameter coverage fails.",
     "Quantize it (e.g. Q8_0 or a K-quant) with llama-quantize."},
    {"tensor-bf16", E, "ValueError",
     "SGLang's non-expert iterator treats BF16 as unquantized but gguf-py hands BF16 out as raw bytes, so "
     "the weight loads as a uint8 tensor of the wrong shape.",
     "Store this tensor as F32 or F16 (or quantize it, when it feeds a linear layer)."},
    {"mla-k-b-dtype", E, "ValueError", "SGLang's split MLA path requires attn_k_b to stay Q4_0.",
     "Re-quantize with attn_k_b as Q4_0 (llama-quantize --tensor-type attn_k_b=q4_0)."},
    {"mla-v-b-dtype", E, "ValueError", "SGLang's split MLA path requires attn_v_b to stay Q2_K.",
     "Re-quantize with attn_v_b as Q2_K (llama-quantize --tensor-type attn_v_b=q2_k)."},
    // -------------------------------------------------------------- experts
    {"expert-missing", E, "ValueError",
     "A routed expert stack (blk.N.ffn_{up,gate,down}_exps.weight) of an active MoE layer is absent; the "
     "pack cannot be built.",
     "Re-download the shard that should hold it (see the tensor listing of the source) or re-convert."},
    {"expert-extra", E, "ValueError",
     "A routed expert stack exists for a layer that is not an active MoE layer of the spec.",
     "Check first_k_dense_replace / num_hidden_layers in config.json against the GGUF."},
    {"expert-shape", E, "ValueError", "A routed expert stack has the wrong shape for the model spec.",
     "Re-convert; expert stacks must be {L, Fe, X} (up/gate) and {Fe, L, X} (down) in ne order."},
    {"expert-dtype", E, "ValueError",
     "A routed expert stack has a type the pack (and SGLang's kernel) does not accept: Q2_K/Q2_K/Q3_K for "
     "Kimi-K3, or a type that differs from the other layers under --profile scaled.",
     "Re-quantize the experts with the expected types (llama-quantize --tensor-type ffn_up_exps=q2_k ...)."},
    {"expert-duplicate", E, "ValueError",
     "Two routed expert stacks name the same layer and role (e.g. blk.01.ffn_up_exps.weight next to "
     "blk.1.ffn_up_exps.weight: SGLang reads the layer number as an integer).",
     "Remove the extra stack (or the shard that should not be in this set), or re-convert."},
    {"expert-role-size-unaligned", E, "ValueError",
     "One expert's bytes for this role are not a multiple of 4096. The pack pads each role to 4 KiB, but "
     "SGLang's expert store (and k3pack's) require the three roles of an object to be byte-contiguous, so "
     "both refuse the pack at start-up.",
     "Pick expert dimensions / quant types whose per-expert role sizes are multiples of 4096 bytes (Kimi-K3's "
     "are); a pack built from these tensors validates but no store opens it."},
    {"expert-not-sliceable", E, "ValueError",
     "The stack's byte size is not a multiple of the expert count, so one expert is not a contiguous slab.",
     "Re-convert; ne[2] must be the expert count."},
    // --------------------------------------------------------------- values
    {"ssm-a-raw-a-log", E, "ValueError",
     "ssm_a must hold llama.cpp's -exp(A_log) (strictly negative); these values are raw A_log (some are "
     ">= 0, all small), i.e. the converter skipped the transform. SGLang inverts with log(-x) and rejects it.",
     "Run `k3pack repair IN OUT --fix ssm-a` (rewrites only these tensors as -exp(A_log)), or re-export with "
     "ssm_a = -exp(A_log)."},
    {"ssm-a-mixed-forms", E, "ValueError",
     "ssm_a holds values > 0 next to values below -1: parts look like raw A_log and parts like -exp(A_log). "
     "Which transform applies is ambiguous, so it is not repaired automatically.",
     "Re-export the GGUF from the original checkpoint with ssm_a = -exp(A_log)."},
    {"ssm-a-zero", E, "ValueError",
     "ssm_a is all zeros, or holds zeros among negative values and nothing positive (missing data, e.g. a hole "
     "in a sparse copy or zeroed elements); 0 is not a valid -exp(A_log).",
     "Re-download the shard or re-export; the real A_log values cannot be recovered from zeros."},
    {"ssm-a-nonfinite", E, "ValueError", "ssm_a contains NaN or Inf values.",
     "Re-export from the original checkpoint; check the converter's float handling."},
    {"ssm-a-not-float", E, "ValueError",
     "ssm_a is stored quantized, as BF16 (gguf-py exposes BF16 as raw bytes) or as integers: SGLang sees a "
     "non-floating tensor.",
     "Store ssm_a as F32 (llama.cpp's converter does; llama-quantize keeps 1-D tensors F32)."},
    {"ssm-a-shape", E, "ValueError",
     "ssm_a must be a vector of attention.head_count values ({H}); this shape is different, often because "
     "another tensor was mapped into the ssm_a slot (the message names the tensor it matches).",
     "Re-convert; check the converter's name mapping for A_log."},
    {"ssm-a-looks-like-norm", E, "ValueError",
     "ssm_a values are all positive and close to one common value, like an RMSNorm weight: another tensor "
     "was probably written into the ssm_a slot (name mapping error).",
     "Re-convert and check the converter's mapping of self_attn.A_log -> blk.N.ssm_a."},
    {"ssm-a-implausible", E, "ValueError",
     "ssm_a has positive values above 10: no A_log is that large (A would exceed 22026) and -exp(A_log) is "
     "never positive, so the slot holds some other data.",
     "Re-convert; the tensor holds some other data."},
    {"ssm-a-tiny", W, "",
     "ssm_a is all negative (SGLang accepts it) but some |x| < 1e-3, which means A_log < -6.9; that is "
     "unusual and may be raw A_log that happens to be all negative.",
     "Compare with the checkpoint's A_log; if these are raw values, re-export with -exp(A_log)."},
    {"res-score-not-vector", E, "ValueError",
     "The attention-residual score must be the converter's folded F32 vector {E}; SGLang splits it into a "
     "[1, E] projection and a ones norm and rejects anything else.",
     "Re-convert: the converter folds self_attention_res_norm * proj into one vector."},
    {"tensor-nonfinite", E, "", "A small F32 tensor (norm, bias, score) contains NaN or Inf.",
     "Re-export from the original checkpoint."},
    // ------------------------------------------------------------- manifest
    {"manifest-invalid", E, "KeyError",
     "The manifest JSON is missing keys or has values of the wrong type.",
     "Regenerate it with `k3pack manifest` (never edit it by hand)."},
    {"manifest-refused", E, "",
     "A reader (the expert store or the non-expert loader) refuses the manifest for a reason the other checks do "
     "not name; the message is the reader's own.",
     "Regenerate the manifest with `k3pack manifest` (or rebuild with `k3pack build DIR --force`); never edit it by "
     "hand."},
    {"manifest-format", E, "ValueError", "The manifest's format is not SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1.",
     "Regenerate the manifest with `k3pack manifest`."},
    {"manifest-incomplete", E, "ValueError", "The manifest is not marked complete.",
     "Regenerate the manifest with `k3pack manifest`."},
    {"manifest-hard-constraints", E, "ValueError",
     "hard_constraints differ from SGLang's immutable Top-K policy dict.", "Regenerate the manifest."},
    {"manifest-dimensions", E, "ValueError",
     "The manifest's model dimensions are not Kimi-K3's (93 layers, 896 experts, top-16) or its active "
     "layers are not 1..92; SGLang's store refuses it under the kimi-k3 profile. Under scaled: the active "
     "layers differ from the ones the pack was built for (k3pack.layer_roles), or the expert count or top-k "
     "is one no store opens (experts 1..65536, top-k 1..experts).",
     "Use --profile scaled for scaled-down models, or regenerate the manifest from the real model."},
    {"manifest-shard-changed", E, "FileNotFoundError",
     "A shard the manifest lists is missing or its size changed since the manifest was written.",
     "Restore the shard, or regenerate the manifest (and re-validate the pack) for the current files."},
    {"manifest-shard-inventory", E, "ValueError",
     "The tensor names of a shard differ from the manifest's list for that shard.", "Regenerate the manifest."},
    {"manifest-tensor-type", E, "ValueError", "A tensor's type differs from the manifest's dtype.",
     "Regenerate the manifest (and rebuild the pack if expert types changed)."},
    {"manifest-metadata-changed", W, "",
     "A shard's header bytes no longer hash to the manifest's metadata_sha256 (SGLang does not check this, "
     "k3pack does): the shard was rewritten.",
     "Regenerate the manifest for the current shards."},
    {"manifest-source-record", E, "",
     "A record of the manifest's source section (a shard's tensor_count or metadata_nbytes, a tensor's offset, "
     "size, shape or shard, the summary, or inventory_sha256) differs from what the shards hold, while their "
     "sizes, headers and tensor names match: the manifest was edited after it was written. `k3pack verify` and "
     "the loader's verify_metadata refuse it.",
     "Rewrite the manifest from the files it records with `k3pack manifest ... --force` (the finding gives the "
     "command with its paths; the pack is kept)."},
    {"pack-missing", E, "FileNotFoundError", "The expert pack the manifest names does not exist.",
     "Build it with `k3pack pack`, or fix expert_pack.path."},
    {"pack-size", E, "ValueError", "The expert pack's size differs from the manifest.",
     "Rebuild the pack and its manifest with `k3pack build DIR --model-config CONFIG --tokenizer-dir TOK --force` "
     "(the finding names the paths); a pack whose size changed cannot be repaired in place."},
    {"pack-invalid", E, "ValueError",
     "The expert pack fails SGLang's validation (header, index order, alignment or payload samples).",
     "Damaged payloads only (\"payload does not match GGUF source\"): `k3pack pack --repair-damaged` (or "
     "`k3pack build --restart`); otherwise rebuild the pack and its manifest with `k3pack build ... --force` "
     "(the finding gives the command)."},
    {"pack-index-digest", E, "ValueError", "The pack index no longer hashes to the manifest's index_sha256.",
     "If the pack was rebuilt on purpose, regenerate the manifest for it; if its header/index was damaged "
     "(bytes SGLang's validator skips, e.g. a name's NUL padding), `k3pack build --restart` (or `k3pack pack "
     "--repair-damaged`) rewrites it from the shards' layout."},
    {"check-skipped", I, "", "A group of checks could not run (the message says why).",
     "Fix the errors reported before it, then run doctor again."},
};

}  // namespace

const std::vector<Diagnosis>& Catalog() { return kCatalog; }

const Diagnosis* FindDiagnosis(std::string_view code) {
  for (const Diagnosis& d : kCatalog) {
    if (code == d.code) return &d;
  }
  return nullptr;
}

const char* SeverityName(Severity s) {
  switch (s) {
    case Severity::kError: return "error";
    case Severity::kWarning: return "warning";
    case Severity::kInfo: return "info";
  }
  return "?";
}

}  // namespace k3pack::doctor
