#!/usr/bin/env bash
# `make demo`: the whole k3pack pipeline on the built-in synthetic Kimi-K3 model.
set -euo pipefail
cd "$(dirname "$0")/.."
K3=${K3PACK_BIN:-$PWD/build/k3pack}
OUT=${DEMO_OUT:-$PWD/demo-out}
rm -rf "$OUT"
mkdir -p "$OUT"
MODEL="$OUT/model"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
has() { "$K3" --help 2>/dev/null | grep -qE "^  $1 "; }

say "1. synthesize a small Kimi-K3 checkpoint in llama.cpp's exact layout (split GGUF + config + tokenizer)"
"$K3" synth --preset tiny --out "$MODEL" --seed 1
ls -l "$MODEL"

say "2. inspect the shard set"
"$K3" inspect "$MODEL" --summary | head -40

if has doctor; then
  say "3. doctor on the healthy checkpoint"
  "$K3" doctor "$MODEL" --profile scaled || true
fi

say "4. build the expert pack + SGLang adapter manifest (resumable, verified)"
"$K3" build --gguf-dir "$MODEL" --model-config "$MODEL/config.json" --tokenizer-dir "$MODEL/tokenizer" \
  --profile scaled --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --progress none
ls -l "$MODEL"/*.pack* "$OUT"/*.json

say "5. verify every expert payload against the digest sidecar and the GGUF source"
"$K3" verify --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --full --against-source

if has load; then
  say "6. stream the non-routed weights with SGLang's names and transforms"
  "$K3" load --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --summary
fi

if has run-experts; then
  say "7. one routed-expert block through the store, checked against the GGUF source"
  "$K3" run-experts --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --layer 1 --tokens 4
fi

if has trace; then
  say "8. replay a routing trace against the pack through the expert store"
  "$K3" trace gen --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --requests 2 --prompt-tokens 8 --decode-tokens 24 --seed 1 --trace "$OUT/trace.k3t"
  "$K3" trace replay --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --trace "$OUT/trace.k3t" --cache-mib 4 \
    --policy reuse-lfu-lru-v2 --io uring
  "$K3" trace sweep --manifest "$OUT/kimi-k3-expert-pack.manifest.json" --trace "$OUT/trace.k3t" --sizes 4,6,8,12,16,24 --svg "$OUT/hit-rate.svg"
  echo "plot: $OUT/hit-rate.svg"
fi

if has doctor && has synth; then
  say "9. a deliberately broken copy (raw A_log in ssm_a): doctor explains, repair fixes"
  "$K3" synth --preset tiny --out "$OUT/broken" --seed 1 --fault raw-ssm-a >/dev/null
  "$K3" doctor "$OUT/broken" --profile scaled || echo "(doctor exit code $? = problems found)"
  if has repair; then
    "$K3" repair "$OUT/broken" "$OUT/repaired" --fix ssm-a --profile scaled
    "$K3" doctor "$OUT/repaired" --profile scaled
  fi
fi

if ls python/k3pack/_k3pack*.so >/dev/null 2>&1; then
  say "10. SGLang's expert store served by k3pack (k3pack.sglang.KimiGGMLExpertPackStore, CPU device)"
  PYTHONPATH="$PWD/python" /usr/bin/python3 - "$OUT/kimi-k3-expert-pack.manifest.json" <<'PY'
import json, sys
import torch
from k3pack.sglang import KimiGGMLExpertPackStore
manifest = sys.argv[1]
m = json.load(open(manifest))["model"]
store = KimiGGMLExpertPackStore(json.load(open(manifest))["expert_pack"]["path"], manifest_path=manifest,
                                expected_layers=m["num_hidden_layers"], expected_experts=m["num_experts"],
                                expected_top_k=m["num_experts_per_token"], cache_vram_mib=8, cache_vram_reserve_mib=1)
store.initialize_device_cache("cpu")
layer, k = m["active_moe_layer_ids"][0], m["num_experts_per_token"]
for step in range(3):  # what SGLang's MoE layer does per token: acquire, read device_cache[slots], mark_used
    slots, slot_list = store.acquire(layer, torch.arange(k).reshape(1, k))
    rows = store.device_cache.index_select(0, slots.long())
    store.mark_used(slot_list)
s = store.snapshot()
print(f"slots {slot_list}; rows {tuple(rows.shape)}; hits {s['cache_hits']}, misses {s['cache_misses']}, "
      f"pack reads {s['pack_reads']}, checksums {s['k3pack']['checksums']}")
store.close()
PY
fi

say "demo complete: outputs in $OUT"
