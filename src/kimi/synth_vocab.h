// Synthetic tokenizer and HF config for synthetic Kimi-K3 models.
//
// The vocabulary has Kimi's shape: byte-level BPE tokens first (tiktoken
// ranks = ids), then a block of special tokens ([BOS], [EOS],
// <|end_of_msg|>, chat markers, reserved tokens) and finally [PAD{i}] filler
// up to vocab_size, the way llama.cpp's converter pads. The same vocabulary
// is written three ways: GGUF tokenizer.ggml.* metadata, tiktoken.model, and
// tokenizer_config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "k3pack/synth.h"

namespace k3pack::synth {

struct SynthVocab {
  std::vector<std::string> tokens;     // GGUF spellings (GPT-2 byte-to-unicode), vocab entries
  std::vector<int32_t> token_types;    // 1 normal, 3 control, 5 unused
  std::vector<std::string> merges;     // "a b"
  std::vector<std::string> raw;        // raw bytes of the regular tokens (tiktoken)
  uint32_t regular = 0;                // ids [0, regular) are BPE tokens
  uint32_t bos_id = 0;                 // [BOS]
  uint32_t eos_id = 0;                 // [EOS] (document end; the tokenizer's eos)
  uint32_t eom_id = 0;                 // <|end_of_msg|> (the model's eos in config.json)
  uint32_t first_pad = 0;              // first [PAD{i}] id
};

SynthVocab MakeVocab(uint32_t vocab_size);

// Lines "<base64 of the raw token> <rank>\n" for the regular tokens.
std::string TiktokenModel(const SynthVocab& v);
nlohmann::json TokenizerConfigJson(const SynthVocab& v, const SynthDims& d);
// HF-style config: top-level kimi_k3 wrapper with `text_config` holding every
// key SGLang's KimiK3Spec / KIMI_K3_REQUIRED_CONFIG reads.
nlohmann::json ConfigJson(const SynthDims& d, const SynthVocab& v);

// tokenizer.ggml.* keys (model gpt2, pre kimi-k2, tokens, types, merges, ids).
void AddTokenizerMetadata(gguf::MetadataBuilder& m, const SynthVocab& v);

}  // namespace k3pack::synth
