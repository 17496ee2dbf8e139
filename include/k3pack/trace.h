// Expert-routing traces: the input of `k3pack trace replay/sweep`, the store
// benchmark and the policy tests.
//
// A trace is the sequence of acquire() calls a model would make: each record
// is one call for one routed layer with a [rows, top_k] matrix of expert ids
// (rows = 1 for a decode token, >1 for a batched prefill chunk).
//
// File format (all integers little-endian; see docs/store.md):
//   magic "K3TRACE\0" (8 bytes), u32 version (1), u32 num_experts, u32 top_k,
//   u32 num_layers, u64 num_records, u32 layer_ids[num_layers],
//   then per record: u32 layer, u32 rows, u32 request, u32 flags (bit 0 =
//   prefill), u16 expert_ids[rows * top_k] (row-major).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::trace {

struct Record {
  uint32_t layer = 0;      // layer id (not index)
  uint32_t rows = 0;
  uint32_t request = 0;
  bool is_prefill = false;
  uint64_t offset = 0;     // into Trace::ids
};

struct Trace {
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  std::vector<uint32_t> layer_ids;   // active routed layers, ascending
  std::vector<Record> records;
  std::vector<uint16_t> ids;         // all records' ids, concatenated

  std::span<const uint16_t> RecordIds(const Record& r) const {
    return {ids.data() + r.offset, static_cast<size_t>(r.rows) * top_k};
  }
  uint64_t num_routes() const { return ids.size(); }   // token x layer x top_k entries
  void Append(uint32_t layer, uint32_t rows, uint32_t request, bool prefill, std::span<const uint16_t> route_ids);
};

Status WriteTrace(const std::string& path, const Trace& trace);
Result<Trace> ReadTrace(const std::string& path);
// The same from bytes in memory; `path` only labels errors.
Result<Trace> ParseTrace(std::string_view data, const std::string& path);

struct GenOptions {
  std::vector<uint32_t> layer_ids;   // default: 1..92
  uint32_t num_experts = 896;
  uint32_t top_k = 16;
  uint32_t requests = 4;
  uint32_t prompt_tokens = 32;       // per request
  uint32_t decode_tokens = 256;      // per request
  uint32_t prefill_chunk = 0;        // 0: one record per prompt token (SGLang's Kimi path), else rows per record
  double reuse = 0.30;               // chance each expert of the previous token (same layer) is routed again
  double skew = 0.0;                 // global Zipf exponent per layer (0 = flat, Kimi's balanced router)
  double request_skew = 0.6;         // per-request Zipf exponent (a request's topic favours some experts)
  uint64_t seed = 1;
};

Result<Trace> Generate(const GenOptions& options);

// Mean share of a token's experts (per layer) that the previous token of the
// same request also used in that layer: the "reuse" a generated trace shows.
double MeasuredReuse(const Trace& trace);

}  // namespace k3pack::trace
