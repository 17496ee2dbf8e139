// Expert-routing traces: the input of `k3pack trace replay/sweep`, the store
// benchmark and the policy tests.
//
// A trace is the sequence of acquire() calls a model would make: each record
// is one call for one routed layer with a [rows, top_k] matrix of expert ids
// (rows = 1 for a decode token, >1 for a batched prefill chunk).
//
// File format (all integers little-endian; see docs/store.md):
//   magic "K3TRACE\0" (8 bytes), u32 version (1 or 2), u32 num_experts,
//   u32 top_k, u32 num_layers, u64 num_records, [v2: u32 predict_k],
//   u32 layer_ids[num_layers], then per record: u32 layer, u32 rows,
//   u32 request, u32 flags, u16 expert_ids[rows * top_k] (row-major),
//   [flag bit 1: u32 row_requests[rows]], [flag bit 2: u16
//   predicted[rows * predict_k]], [flag bit 3: u16 next_token[rows *
//   predict_k]]. Flag bit 0 = prefill; bits 1-3 exist only in v2. A writer
//   emits v1 when no record uses a v2 field.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
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
  // v2: the request of each row (batched calls of several requests),
  // predicted expert ids of the next routed layer for each row, and
  // predicted ids of this layer for each row's request's next token.
  bool has_row_requests = false;
  bool has_predictions = false;
  bool has_token_predictions = false;
  uint64_t row_request_offset = 0;  // into Trace::row_requests
  uint64_t prediction_offset = 0;   // into Trace::predictions
  uint64_t token_prediction_offset = 0;  // into Trace::token_predictions
};

struct Trace {
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  std::vector<uint32_t> layer_ids;   // active routed layers, ascending
  std::vector<Record> records;
  std::vector<uint16_t> ids;         // all records' ids, concatenated
  uint32_t predict_k = 0;            // v2: predicted ids per row (0: no predictions)
  std::vector<uint32_t> row_requests;
  std::vector<uint16_t> predictions;
  std::vector<uint16_t> token_predictions;

  std::span<const uint16_t> RecordIds(const Record& r) const {
    return {ids.data() + r.offset, static_cast<size_t>(r.rows) * top_k};
  }
  // The request row `row` belongs to (the record's request without per-row ids).
  uint32_t RowRequest(const Record& r, uint32_t row) const {
    return r.has_row_requests ? row_requests[r.row_request_offset + row] : r.request;
  }
  // Predicted next-layer ids of every row (row-major, predict_k each); empty without.
  std::span<const uint16_t> RecordPredictions(const Record& r) const {
    if (!r.has_predictions) return {};
    return {predictions.data() + r.prediction_offset, static_cast<size_t>(r.rows) * predict_k};
  }
  // Predicted ids of this layer at each row's next token (predict_k each); empty without.
  std::span<const uint16_t> RecordTokenPredictions(const Record& r) const {
    if (!r.has_token_predictions) return {};
    return {token_predictions.data() + r.token_prediction_offset, static_cast<size_t>(r.rows) * predict_k};
  }
  uint64_t num_routes() const { return ids.size(); }   // token x layer x top_k entries
  void Append(uint32_t layer, uint32_t rows, uint32_t request, bool prefill, std::span<const uint16_t> route_ids);
  // v2 fields of the last appended record.
  void SetRowRequests(std::span<const uint32_t> requests);
  void SetPredictions(std::span<const uint16_t> predicted);   // rows * predict_k ids
  void SetTokenPredictions(std::span<const uint16_t> predicted);  // rows * predict_k ids
  uint32_t version() const;   // 2 when any v2 field is used, else 1
};

// The most objects (layers x experts) a trace may declare. Every consumer
// keeps per-object tables sized by the declared model, not by the file (a
// 850-byte file declaring 2,000 layers of 65,536 experts made replay
// allocate GBs and abort; at 2^24 a 1 KB file still cost 3.5 GB per
// adaptive replay and 7 GB per sweep). 2^20 is 12x K3's 92 x 896 = 82,432
// and bounds a 1 KB file's sweep to 0.5-0.9 GB (16 layers of 65,536
// experts take the most). The reader refuses more and the generator writes
// no more (docs/FORMATS.md).
constexpr uint64_t kMaxObjects = uint64_t{1} << 20;
inline constexpr char kMaxObjectsText[] = "1048576 = 2^20";
static_assert(kMaxObjects == 1048576, "kMaxObjectsText names kMaxObjects");

// Whether a model's routes fit a trace (ids are u16: 1..65536 experts, and
// at most kMaxObjects objects), so a writer refuses before it records
// anything rather than truncating ids or writing a file no reader takes.
Status CheckModelFits(uint64_t layers, uint32_t experts);

Status WriteTrace(const std::string& path, const Trace& trace);
// The bytes WriteTrace writes (to compare a run's trace with an existing file).
std::string EncodeTrace(const Trace& trace);
Result<Trace> ReadTrace(const std::string& path);
// The same from bytes in memory; `path` only labels errors.
Result<Trace> ParseTrace(std::string_view data, const std::string& path);

// What the generator knew when it drew each route: enough to rank objects
// by their true chance of being routed at a request's next token (the
// distribution-informed bound of `trace sweep`).
struct TrueDistribution {
  double reuse = 0;
  uint32_t top_k = 0;
  // Per request: [layer index][expert] sampling weights, normalized per layer.
  std::vector<std::vector<float>> initial;
  // Popularity drift: before routing token `token` of `request`, the weights
  // of experts a and b in `layer_index` are swapped.
  struct Swap {
    uint32_t request, token, layer_index;
    uint16_t a, b;
  };
  std::vector<Swap> swaps;  // per request in token order
};

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
  // Families (docs/store.md):
  uint32_t concurrent = 1;           // requests decoded side by side (continuous batching)
  bool batched = false;              // one call per layer per decode step (rows = active requests), else one per token
  uint32_t domains = 0;              // >0: requests share the popularity of domain (request % domains)
  double drift = 0.0;                // per token and layer, drift * num_experts random weight swaps
  // Predictions (v2): predicted ids of the next routed layer for every row.
  bool predict = false;
  double predict_accuracy = 0.95;    // mean share of the next layer's experts predicted
  double predict_surprise = 0.0;     // share of rows where every prediction misses (correlated misses)
  // Predicted ids of the same layer for each row's request's next token (v2),
  // with the same accuracy model; drawn from a separate random stream, so
  // the routes and next-layer predictions are those of the same trace without.
  bool predict_next_token = false;
  TrueDistribution* truth = nullptr; // filled when not null
  // Called as tokens are routed through every layer (done, total): a large
  // trace takes seconds to minutes. Not called when empty.
  std::function<void(uint64_t done_tokens, uint64_t total_tokens)> progress;
};

// The generator's own bounds, so that a request it cannot hold in memory is
// refused before it allocates (callers name their options with them):
// the routes it writes (requests x (prompt + decode) x layers x top_k) and
// the popularity weights it keeps at once ((domains + requests decoded side
// by side [+ every request's, with `truth`]) x layers x experts).
// A token's pass through a layer is a record (tens of bytes in memory
// whatever top_k), so passes are bounded too: at top_k 1 the routes bound
// alone let through a trace of 90 GB. 2^26 is what the routes bound allows
// at K3's top-16 (a few GB).
constexpr uint64_t kMaxGeneratedRoutes = uint64_t{1} << 30;
constexpr uint64_t kMaxGeneratedPasses = uint64_t{1} << 26;
constexpr uint64_t kMaxGeneratorWeights = uint64_t{1} << 27;
uint64_t GeneratedRoutes(const GenOptions& options);
uint64_t GeneratedPasses(const GenOptions& options);  // requests x tokens x layers
uint64_t GeneratorWeights(const GenOptions& options);

Result<Trace> Generate(const GenOptions& options);
// Named presets: "kimi" (the defaults), "drift", "interleaved", "batched",
// "layer-local", "prefill-burst". Fills `options` (keeping layer ids, experts,
// top_k and seed as given); false when the name is unknown.
bool ApplyFamily(const std::string& name, GenOptions* options);
std::vector<std::string> FamilyNames();

// Tokens the trace routes: every token passes each layer the trace routes,
// so they are the rows of its lowest routed layer (not of the model's first
// layer, which a trace of some layers never routes).
uint64_t CountTokens(const Trace& trace);

// Mean share of a token's experts (per layer) that the previous token of the
// same request also used in that layer: the "reuse" a generated trace shows.
// Rows are matched by request (per-row request ids included), so traces that
// interleave requests report their true reuse. Empty when no row has a
// previous token of its request in its layer (a trace of one token per
// request): there is nothing to measure, which 0% would misstate.
std::optional<double> MeasuredReuse(const Trace& trace);

}  // namespace k3pack::trace
