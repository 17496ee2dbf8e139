#include "kimi/synth_vocab.h"

#include <algorithm>

namespace k3pack::synth {
namespace {

// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves,
// the rest to U+0100 onwards, so every byte has a visible spelling.
std::string ByteSpelling(uint8_t b) {
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF); };
  uint32_t cp = b;
  if (!printable(b)) {
    uint32_t n = 0;
    for (int c = 0; c < b; ++c) {
      if (!printable(c)) ++n;
    }
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += k[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
constexpr uint32_t kAlpha = sizeof(kAlphabet) - 1;  // 62

}  // namespace

SynthVocab MakeVocab(uint32_t vocab_size) {
  SynthVocab v;
  // Kimi reserves the last 256 ids for special tokens; small vocabularies
  // reserve an eighth.
  const uint32_t reserved = std::min<uint32_t>(256, vocab_size / 8);
  v.regular = vocab_size - reserved;
  v.tokens.reserve(vocab_size);
  v.raw.reserve(v.regular);
  for (uint32_t b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteSpelling(static_cast<uint8_t>(b)));
    v.raw.push_back(std::string(1, static_cast<char>(b)));
  }
  // Merged tokens: every two-letter alphanumeric pair, then three-letter
  // strings whose two-letter prefix already exists ("ab c").
  uint64_t idx = 0;
  while (v.tokens.size() < v.regular) {
    std::string tok, merge;
    if (idx < kAlpha * kAlpha) {
      const char a = kAlphabet[idx / kAlpha], b = kAlphabet[idx % kAlpha];
      tok = {a, b};
      merge = std::string{a} + " " + std::string{b};
    } else {
      const uint64_t j = idx - kAlpha * kAlpha;
      const char a = kAlphabet[(j / (kAlpha * kAlpha)) % kAlpha], b = kAlphabet[(j / kAlpha) % kAlpha],
                 c = kAlphabet[j % kAlpha];
      tok = {a, b, c};
      merge = std::string{a, b} + " " + std::string{c};
    }
    ++idx;
    v.raw.push_back(tok);
    v.tokens.push_back(std::move(tok));
    v.merges.push_back(std::move(merge));
  }
  v.token_types.assign(v.regular, 1);
  const char* specials[] = {"[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "[UNK]"};
  v.bos_id = v.regular;
  v.eos_id = v.regular + 1;
  v.eom_id = v.regular + 2;
  const uint32_t pads = std::min<uint32_t>(4, reserved > 16 ? 4 : 0);
  v.first_pad = vocab_size - pads;
  uint32_t k = 0;
  for (uint32_t id = v.regular; id < v.first_pad; ++id, ++k) {
    if (k < std::size(specials)) {
      v.tokens.push_back(specials[k]);
    } else {
      v.tokens.push_back("<|reserved_token_" + std::to_string(id) + "|>");
    }
    v.token_types.push_back(3);
  }
  for (uint32_t id = v.first_pad; id < vocab_size; ++id) {
    v.tokens.push_back("[PAD" + std::to_string(id) + "]");
    v.token_types.push_back(5);
  }
  return v;
}

std::string TiktokenModel(const SynthVocab& v) {
  std::string out;
  out.reserve(v.raw.size() * 12);
  for (uint32_t rank = 0; rank < v.raw.size(); ++rank) {
    out += Base64(v.raw[rank]);
    out += ' ';
    out += std::to_string(rank);
    out += '\n';
  }
  return out;
}

nlohmann::json TokenizerConfigJson(const SynthVocab& v, const SynthDims& d) {
  nlohmann::json added = nlohmann::json::object();
  for (uint32_t id = v.regular; id < v.first_pad; ++id) {
    added[std::to_string(id)] = {{"content", v.tokens[id]}, {"lstrip", false}, {"normalized", false},
                                 {"rstrip", false},         {"single_word", false}, {"special", true}};
  }
  return {
      {"added_tokens_decoder", added},
      {"bos_token", v.tokens[v.bos_id]},
      {"eos_token", v.tokens[v.eos_id]},
      {"pad_token", v.tokens[v.eom_id + 4]},  // [UNK] doubles as pad, as in Kimi's tokenizer
      {"unk_token", v.tokens[v.eom_id + 4]},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", d.context_length},
      {"tokenizer_class", "TikTokenTokenizer"},
      {"chat_template",
       "{% for m in messages %}<|open|>{{ m['role'] }}<|sep|>{{ m['content'] }}<|end_of_msg|>{% endfor %}"
       "{% if add_generation_prompt %}<|open|>assistant<|sep|>{% endif %}"},
  };
}

nlohmann::json ConfigJson(const SynthDims& d, const SynthVocab& v) {
  nlohmann::json full = nlohmann::json::array(), kda = nlohmann::json::array();
  for (uint32_t il = 0; il < d.num_layers; ++il) {
    (IsMlaLayer(d, il) ? full : kda).push_back(il + 1);  // 1-based, as the HF config lists them
  }
  nlohmann::json text = {
      {"architectures", nlohmann::json::array({"KimiLinearForCausalLM"})},
      {"model_type", "kimi_linear"},
      {"num_hidden_layers", d.num_layers},
      {"hidden_size", d.hidden},
      {"vocab_size", d.vocab},
      {"intermediate_size", d.dense_intermediate},
      {"max_position_embeddings", d.context_length},
      {"rms_norm_eps", 1e-5},
      {"tie_word_embeddings", false},
      {"num_attention_heads", d.heads},
      {"num_key_value_heads", d.heads},
      {"q_lora_rank", d.q_lora_rank},
      {"kv_lora_rank", d.kv_lora_rank},
      {"qk_nope_head_dim", MlaQkNope(d)},
      {"qk_rope_head_dim", d.qk_rope},
      {"v_head_dim", MlaVHead(d)},
      {"mla_use_nope", true},
      {"mla_use_output_gate", true},
      {"linear_attn_config",
       {{"full_attn_layers", full},
        {"kda_layers", kda},
        {"num_heads", d.heads},
        {"head_dim", d.head_dim},
        {"short_conv_kernel_size", d.conv_kernel},
        {"gate_lower_bound", -5.0},
        {"use_full_rank_gate", true}}},
      {"num_experts", d.num_experts},
      {"num_experts_per_token", d.top_k},
      {"num_shared_experts", d.num_shared_experts},
      {"moe_intermediate_size", d.moe_intermediate},
      {"routed_expert_hidden_size", d.latent},
      {"latent_moe_use_norm", true},
      {"first_k_dense_replace", d.first_k_dense},
      {"moe_layer_freq", 1},
      {"moe_router_activation_func", "sigmoid"},
      {"moe_renormalize", true},
      {"topk_method", "noaux_tc"},
      {"num_expert_group", 1},
      {"topk_group", 1},
      {"routed_scaling_factor", 1.0},
      {"hidden_act", "situ"},
      {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0},
      {"attn_res_block_size", d.attn_res_block_size},
      {"bos_token_id", v.bos_id},
      {"eos_token_id", v.eom_id},
      {"torch_dtype", "bfloat16"},
  };
  return {
      {"architectures", nlohmann::json::array({"KimiK3ForConditionalGeneration"})},
      {"model_type", "kimi_k3"},
      {"text_config", text},
      {"bos_token_id", v.bos_id},
      {"eos_token_id", v.eom_id},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
}

void AddTokenizerMetadata(gguf::MetadataBuilder& m, const SynthVocab& v) {
  m.Str("tokenizer.ggml.model", "gpt2");
  m.Str("tokenizer.ggml.pre", "kimi-k2");
  m.StrArray("tokenizer.ggml.tokens", v.tokens);
  m.I32Array("tokenizer.ggml.token_type", v.token_types);
  m.StrArray("tokenizer.ggml.merges", v.merges);
  m.U32("tokenizer.ggml.bos_token_id", v.bos_id);
  m.U32("tokenizer.ggml.eos_token_id", v.eom_id);  // K3 restores the config's eos (<|end_of_msg|>)
  m.U32("tokenizer.ggml.padding_token_id", v.eom_id + 4);
}

}  // namespace k3pack::synth
