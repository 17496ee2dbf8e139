// The pack-vs-source routed-expert check (see k3pack/run_experts.h).
#include "k3pack/run_experts.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "k3pack/ep.h"
#include "k3pack/gguf.h"
#include "k3pack/moe.h"
#include "k3pack/quant.h"
#include "util/file.h"
#include "util/sha256.h"
#include "util/threads.h"

namespace k3pack::store {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct SourceTensor {
  const gguf::TensorInfo* info = nullptr;
  std::span<const uint8_t> bytes;
};

Result<SourceTensor> Find(const gguf::ShardSet& set, const std::string& name, bool required) {
  auto loc = set.FindTensor(name);
  if (!loc) {
    if (!required) return SourceTensor{};
    return Error("tensor " + name + " not found in the GGUF source " + set.directory(), ErrorKind::kKey)
        .WithHint("run-experts needs the source the pack was built from (the manifest's source.path, or --gguf)");
  }
  return SourceTensor{loc->info, set.shards()[loc->shard_index]->TensorData(*loc->info)};
}

// Expert e's slice of a stacked [ne0, ne1, n_experts] tensor.
std::span<const uint8_t> ExpertSlice(const SourceTensor& t, uint32_t e) {
  const uint64_t per = t.info->nbytes / static_cast<uint64_t>(t.info->ne[2]);
  return t.bytes.subspan(uint64_t{e} * per, per);
}

Result<std::vector<float>> Decode(const SourceTensor& t) {
  return quant::DequantizeRows(t.info->type, t.bytes, t.info->ne[0],
                               static_cast<uint64_t>(t.info->n_elements() / t.info->ne[0]));
}

std::string FloatsSha256(const std::vector<float>& v) { return Sha256Hex(v.data(), v.size() * sizeof(float)); }

struct LayerTensors {
  SourceTensor router, bias, latent_down, latent_up, up, gate, down;
};

// A layer's router: ffn_gate_inp and the decoded exp_probs_b (empty without).
struct Router {
  uint32_t layer = 0;
  SourceTensor weight;
  std::vector<float> bias;
};

Result<Router> LoadRouter(const gguf::ShardSet& set, uint32_t layer) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  Router r;
  r.layer = layer;
  K3_ASSIGN_OR_RETURN(r.weight, Find(set, p + "ffn_gate_inp.weight", true));
  K3_ASSIGN_OR_RETURN(SourceTensor bias, Find(set, p + "exp_probs_b.bias", false));
  if (bias.info) {
    K3_ASSIGN_OR_RETURN(r.bias, Decode(bias));
  }
  return r;
}

// The router's decision for x under `cfg` (its top_k chosen; weights as the block uses them).
Result<moe::Routing> RouteWith(const Router& r, std::span<const float> x, const moe::MoeConfig& cfg) {
  if (r.weight.info->ne[0] != static_cast<int64_t>(x.size()))
    return Error("blk." + std::to_string(r.layer) + ".ffn_gate_inp.weight takes " +
                 std::to_string(r.weight.info->ne[0]) + " values, the hidden state has " + std::to_string(x.size()));
  K3_ASSIGN_OR_RETURN(auto logits, moe::RouterLogits(r.weight.info->type, r.weight.bytes, x, cfg.num_experts));
  return moe::Route(logits, r.bias, cfg);
}

Result<LayerTensors> FindLayer(const gguf::ShardSet& set, uint32_t layer) {
  const std::string p = "blk." + std::to_string(layer) + ".";
  LayerTensors t;
  K3_ASSIGN_OR_RETURN(t.up, Find(set, p + "ffn_up_exps.weight", true));
  K3_ASSIGN_OR_RETURN(t.gate, Find(set, p + "ffn_gate_exps.weight", true));
  K3_ASSIGN_OR_RETURN(t.down, Find(set, p + "ffn_down_exps.weight", true));
  K3_ASSIGN_OR_RETURN(t.router, Find(set, p + "ffn_gate_inp.weight", true));
  K3_ASSIGN_OR_RETURN(t.bias, Find(set, p + "exp_probs_b.bias", false));
  K3_ASSIGN_OR_RETURN(t.latent_down, Find(set, p + "ffn_routed_down.weight", false));
  K3_ASSIGN_OR_RETURN(t.latent_up, Find(set, p + "ffn_routed_up.weight", false));
  return t;
}

Result<moe::MoeConfig> ConfigFor(const gguf::ShardSet& set, const LayerTensors& t, const StoreInfo& info,
                                 const ExpertRunOptions& o) {
  moe::MoeConfig cfg;
  cfg.latent = t.gate.info->ne[0];
  cfg.inter = t.gate.info->ne[1];
  cfg.num_experts = static_cast<uint32_t>(t.gate.info->ne[2]);
  cfg.top_k = info.top_k;
  cfg.quantize_activations = o.quantize_activations;
  cfg.threads = o.threads;
  if (cfg.num_experts != info.num_experts) {
    return Error("layer " + std::to_string(o.layer) + ": the GGUF source has " + std::to_string(cfg.num_experts) +
                 " experts, the pack " + std::to_string(info.num_experts) + " (is this the source of this pack?)");
  }
  if (t.router.info->ne[1] != int64_t{cfg.num_experts}) {
    return Error("blk." + std::to_string(o.layer) + ".ffn_gate_inp.weight has " + std::to_string(t.router.info->ne[1]) +
                 " rows for " + std::to_string(cfg.num_experts) + " experts");
  }
  const std::string arch = set.first().architecture();
  if (const gguf::Value* v = set.first().Find(arch + ".expert_weights_norm")) cfg.expert_weights_norm = v->u64 != 0;
  if (const gguf::Value* v = set.first().Find(arch + ".expert_weights_scale")) {
    cfg.expert_weights_scale = static_cast<float>(v->AsFloat().value_or(1.0));
  }
  // SiTU's constants are model hyperparameters (llama.cpp requires both
  // keys); MoeConfig's defaults are Kimi-K3's 4 and 25.
  if (const gguf::Value* v = set.first().Find(arch + ".activation.situ_beta")) {
    cfg.situ_beta = static_cast<float>(v->AsFloat().value_or(cfg.situ_beta));
  }
  if (const gguf::Value* v = set.first().Find(arch + ".activation.situ_linear_beta")) {
    cfg.situ_lambda = static_cast<float>(v->AsFloat().value_or(cfg.situ_lambda));
  }
  // moe::Route implements sigmoid gating only (Kimi-K3's, id 2).
  if (const gguf::Value* v = set.first().Find(arch + ".expert_gating_func")) {
    if (v->AsInt() != std::optional<int64_t>(2)) {
      return Error(set.first().path() + ": " + arch + ".expert_gating_func is " +
                   (v->AsInt() ? std::to_string(*v->AsInt()) : std::string(gguf::ValueTypeName(v->type))) +
                   "; only sigmoid routing (2, Kimi-K3's) is implemented");
    }
  }
  return cfg;
}

// The routes of `routing` that EP rank `rank` of `ep_size` owns, in router order.
moe::Routing RankShare(const moe::Routing& routing, uint32_t num_experts, uint32_t ep_size, uint32_t rank) {
  moe::Routing share;
  for (size_t i = 0; i < routing.experts.size(); ++i) {
    if (ep::OwnerOf(routing.experts[i], num_experts, ep_size) != rank) continue;
    share.experts.push_back(routing.experts[i]);
    share.weights.push_back(routing.weights[i]);
  }
  return share;
}

// One rank's partial output: its routes summed from zero in router order.
Result<std::vector<float>> PartialForward(uint32_t layer, const moe::Routing& share, std::span<const float> x_lat,
                                          const moe::ExpertSource& src, const moe::MoeConfig& cfg) {
  if (share.experts.empty()) return std::vector<float>(static_cast<size_t>(cfg.latent), 0.0f);
  return moe::RoutedForward(layer, share, x_lat, src, cfg);
}

// The fixed reduction: partials added rank 0..N-1 to a zero vector.
std::vector<float> ReduceRanks(const std::vector<std::vector<float>>& partials, size_t n) {
  std::vector<float> out(n, 0.0f);
  for (const auto& p : partials)
    for (size_t i = 0; i < n; ++i) out[i] += p[i];
  return out;
}

}  // namespace

Result<ExpertRunResult> RunRoutedExperts(ExpertStore& store, const gguf::ShardSet& source,
                                         const ExpertRunOptions& o,
                                         const std::vector<std::shared_ptr<ExpertStore>>& rank_stores) {
  if (o.tokens == 0) return Error("run-experts: --tokens must be at least 1");
  const uint32_t N = o.ep_size;
  K3_RETURN_IF_ERROR(ep::CheckRank({N, 0}, store.info().num_experts, ep::kCliNames));  // the CLI's --ep-size
  if (N > 1 && rank_stores.size() != N)
    return Error("run-experts --ep-size " + std::to_string(N) + " needs " + std::to_string(N) + " rank stores, got " +
                 std::to_string(rank_stores.size()));
  for (uint32_t r = 0; N > 1 && r < N; ++r) {
    const StoreInfo& ri = rank_stores[r]->info();
    if (ri.ep.size != N || ri.ep.rank != r || ri.index_sha256 != store.info().index_sha256)
      return Error("run-experts: rank store " + std::to_string(r) + " (" + ri.pack_path + ") serves " +
                   ep::Describe(ri.ep, ri.num_experts) + " of a pack with index " + ri.index_sha256.substr(0, 12) +
                   ", not rank " + std::to_string(r) + " of " + std::to_string(N) + " of " +
                   store.info().index_sha256.substr(0, 12));
  }
  K3_ASSIGN_OR_RETURN(LayerTensors t, FindLayer(source, o.layer));
  // The source's pages this layer read stay mapped otherwise: a run over
  // every layer of a full-scale model grew by ~190 MB of file pages a layer.
  struct ReleaseOnExit {
    const LayerTensors& t;
    ~ReleaseOnExit() {
      for (const SourceTensor* s : {&t.router, &t.bias, &t.latent_down, &t.latent_up, &t.up, &t.gate, &t.down})
        ReleaseMappedPages(s->bytes);
    }
  } release_on_exit{t};
  const StoreInfo& info = store.info();
  K3_ASSIGN_OR_RETURN(moe::MoeConfig cfg, ConfigFor(source, t, info, o));
  ExpertRunResult r;
  r.layer = o.layer;
  r.tokens = o.tokens;
  r.top_k = cfg.top_k;
  r.num_experts = cfg.num_experts;
  r.hidden = t.router.info->ne[0];
  r.latent = cfg.latent;
  r.inter = cfg.inter;
  if (!t.latent_down.info && r.hidden != r.latent) {
    return Error("blk." + std::to_string(o.layer) + ".ffn_routed_down.weight is missing and the hidden size " +
                 std::to_string(r.hidden) + " differs from the experts' input size " + std::to_string(r.latent));
  }
  Router router{o.layer, t.router, {}};
  if (t.bias.info) {
    K3_ASSIGN_OR_RETURN(router.bias, Decode(t.bias));
  }
  std::optional<Router> next;  // the look-ahead's router
  moe::MoeConfig next_cfg = cfg;
  if (o.predict_layer) {
    K3_ASSIGN_OR_RETURN(next, LoadRouter(source, *o.predict_layer));
    next_cfg.num_experts = static_cast<uint32_t>(next->weight.info->ne[1]);
    next_cfg.top_k = o.predict_k ? o.predict_k : cfg.top_k;
  }

  // Hidden states -> router decisions and latent inputs, from the source.
  const size_t hidden = static_cast<size_t>(r.hidden);
  if (o.hidden && o.hidden->size() != size_t{o.tokens} * hidden)
    return Error("run-experts: layer " + std::to_string(o.layer) + " was given " + std::to_string(o.hidden->size()) +
                 " hidden values for " + std::to_string(o.tokens) + " tokens of " + std::to_string(hidden));
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<moe::Routing> routing(o.tokens);
  std::vector<std::vector<float>> x_lat(o.tokens);
  std::vector<int64_t> ids;
  for (uint32_t k = 0; k < o.tokens; ++k) {
    std::vector<float> x(hidden);
    if (o.hidden) {
      std::copy_n(o.hidden->begin() + static_cast<std::ptrdiff_t>(k * hidden), hidden, x.begin());
    } else {
      for (float& v : x) v = normal(rng);
    }
    r.hidden_in.insert(r.hidden_in.end(), x.begin(), x.end());
    K3_ASSIGN_OR_RETURN(routing[k], RouteWith(router, x, cfg));
    if (next) {
      K3_ASSIGN_OR_RETURN(moe::Routing guess, RouteWith(*next, x, next_cfg));
      r.predicted.push_back(std::move(guess.experts));
    }
    if (t.latent_down.info) {
      K3_ASSIGN_OR_RETURN(x_lat[k], moe::RouterLogits(t.latent_down.info->type, t.latent_down.bytes, x,
                                                      static_cast<uint32_t>(r.latent)));
    } else {
      x_lat[k] = std::move(x);
    }
    r.routed.push_back(routing[k].experts);
    for (uint32_t e : routing[k].experts) ids.push_back(e);
  }

  const nlohmann::json before = store.Snapshot();
  auto t0 = Clock::now();
  const int64_t shape[2] = {int64_t{o.tokens}, int64_t{cfg.top_k}};
  K3_ASSIGN_OR_RETURN(Acquisition acq, store.Acquire(o.layer, ids, shape));
  r.acquire_seconds = Since(t0);
  const nlohmann::json after = store.Snapshot();
  r.hits = after["cache_hits"].get<uint64_t>() - before["cache_hits"].get<uint64_t>();
  r.misses = after["cache_misses"].get<uint64_t>() - before["cache_misses"].get<uint64_t>();
  r.bytes_read = after["pack_read_bytes"].get<uint64_t>() - before["pack_read_bytes"].get<uint64_t>();

  // Every path sums in the fixed order (see the header): per rank, then ranks 0..N-1.
  auto run = [&](auto&& weights_of, std::vector<float>* out, double* seconds) -> Status {
    auto t1 = Clock::now();
    for (uint32_t k = 0; k < o.tokens; ++k) {
      moe::ExpertSource src = [&, k](uint32_t, uint32_t e) { return weights_of(k, e); };
      std::vector<std::vector<float>> partials(N);
      for (uint32_t rank = 0; rank < N; ++rank) {
        K3_ASSIGN_OR_RETURN(partials[rank], PartialForward(o.layer, RankShare(routing[k], cfg.num_experts, N, rank),
                                                           x_lat[k], src, cfg));
      }
      std::vector<float> y = ReduceRanks(partials, static_cast<size_t>(r.latent));
      out->insert(out->end(), y.begin(), y.end());
    }
    *seconds = Since(t1);
    return Status::OK();
  };
  auto typed = [&](moe::ExpertWeights w) {
    w.up_type = t.up.info->type;
    w.gate_type = t.gate.info->type;
    w.down_type = t.down.info->type;
    return w;
  };
  auto from_store = [&](uint32_t k, uint32_t e) -> Result<moe::ExpertWeights> {
    for (uint32_t j = 0; j < cfg.top_k; ++j) {
      const ExpertView& v = acq.routes[size_t{k} * cfg.top_k + j];
      if (v.expert == e) return typed({v.up, v.gate, v.down});
    }
    return Error("run-experts: expert " + std::to_string(e) + " was not acquired for token " + std::to_string(k));
  };
  auto from_source = [&](uint32_t, uint32_t e) -> Result<moe::ExpertWeights> {
    return typed({ExpertSlice(t.up, e), ExpertSlice(t.gate, e), ExpertSlice(t.down, e)});
  };
  Status st = run(from_store, &r.from_store, &r.store_compute_seconds);
  Status released = store.MarkUsed(acq);
  K3_RETURN_IF_ERROR(st);
  K3_RETURN_IF_ERROR(released);
  K3_RETURN_IF_ERROR(run(from_source, &r.from_source, &r.source_compute_seconds));

  for (size_t i = 0; i < r.from_store.size(); ++i) {
    if (std::memcmp(&r.from_store[i], &r.from_source[i], sizeof(float)) != 0) ++r.mismatched_values;
    const double d = std::fabs(double(r.from_store[i]) - double(r.from_source[i]));
    if (d > r.max_abs_diff || std::isnan(d)) r.max_abs_diff = std::isnan(d) ? INFINITY : d;
  }
  r.store_sha256 = FloatsSha256(r.from_store);
  r.source_sha256 = FloatsSha256(r.from_source);
  if (o.residual_out) {
    // The residual stream after the block: x + W_up . y (y is the latent output).
    if (!t.latent_up.info && r.latent != r.hidden)
      return Error("blk." + std::to_string(o.layer) + ".ffn_routed_up.weight is missing and the experts' output size " +
                   std::to_string(r.latent) + " differs from the hidden size " + std::to_string(r.hidden));
    r.hidden_out = r.hidden_in;
    for (uint32_t k = 0; k < o.tokens; ++k) {
      std::span<const float> y(r.from_store.data() + size_t{k} * static_cast<size_t>(r.latent),
                               static_cast<size_t>(r.latent));
      std::vector<float> up(y.begin(), y.end());
      if (t.latent_up.info) {
        K3_ASSIGN_OR_RETURN(up, moe::RouterLogits(t.latent_up.info->type, t.latent_up.bytes, y,
                                                  static_cast<uint32_t>(r.hidden)));
      }
      for (size_t i = 0; i < hidden; ++i) r.hidden_out[k * hidden + i] += up[i];
    }
  }
  if (N == 1) return r;

  // The EP run: rank r serves, from its own store, the routes it owns.
  r.ep_size = N;
  r.ranks.resize(N);
  std::vector<std::vector<std::vector<float>>> partials(N);  // [rank][token]
  std::vector<Status> status(N);
  auto run_rank = [&](uint32_t rank) {
    ExpertStore& rs = *rank_stores[rank];
    EpRankRun& run_r = r.ranks[rank];
    run_r.rank = rank;
    run_r.first_expert = rs.info().owned_experts.first;
    run_r.end_expert = rs.info().owned_experts.end;
    run_r.pack_path = rs.info().pack_path;
    const nlohmann::json b = rs.Snapshot();
    auto t2 = Clock::now();
    status[rank] = [&]() -> Status {
      for (uint32_t k = 0; k < o.tokens; ++k) {
        const moe::Routing share = RankShare(routing[k], cfg.num_experts, N, rank);
        if (share.experts.empty()) {
          partials[rank].emplace_back(static_cast<size_t>(r.latent), 0.0f);
          continue;
        }
        std::vector<int64_t> mine(share.experts.begin(), share.experts.end());
        const int64_t shape2[2] = {1, static_cast<int64_t>(mine.size())};
        K3_ASSIGN_OR_RETURN(Acquisition a, rs.Acquire(o.layer, mine, shape2));
        ++run_r.acquire_calls;
        run_r.routes += mine.size();
        moe::ExpertSource src = [&](uint32_t, uint32_t e) -> Result<moe::ExpertWeights> {
          for (const ExpertView& v : a.routes)
            if (v.expert == e) return typed({v.up, v.gate, v.down});
          return Error("run-experts: expert " + std::to_string(e) + " was not acquired by rank " +
                       std::to_string(rank));
        };
        auto y = PartialForward(o.layer, share, x_lat[k], src, cfg);
        Status released = rs.MarkUsed(a);
        if (!y.ok()) return y.error();
        K3_RETURN_IF_ERROR(released);
        partials[rank].push_back(std::move(*y));
      }
      return Status::OK();
    }();
    run_r.seconds = Since(t2);
    const nlohmann::json e = rs.Snapshot();
    run_r.hits = e["cache_hits"].get<uint64_t>() - b["cache_hits"].get<uint64_t>();
    run_r.misses = e["cache_misses"].get<uint64_t>() - b["cache_misses"].get<uint64_t>();
    run_r.bytes_read = e["pack_read_bytes"].get<uint64_t>() - b["pack_read_bytes"].get<uint64_t>();
  };
  // When the process cannot start a thread per rank (a pids or
  // address-space limit), those it starts, and this one, run them all (a
  // rank's results do not depend on its thread).
  RunJobsOnThreads(N, N, [&](uint64_t rank) { run_rank(static_cast<uint32_t>(rank)); });
  for (uint32_t rank = 0; rank < N; ++rank)
    if (!status[rank].ok()) return status[rank].error().WithContext("run-experts EP rank " + std::to_string(rank));
  for (uint32_t k = 0; k < o.tokens; ++k) {
    std::vector<std::vector<float>> token(N);
    for (uint32_t rank = 0; rank < N; ++rank) token[rank] = std::move(partials[rank][k]);
    std::vector<float> y = ReduceRanks(token, static_cast<size_t>(r.latent));
    r.from_ranks.insert(r.from_ranks.end(), y.begin(), y.end());
  }
  for (size_t i = 0; i < r.from_ranks.size(); ++i)
    if (std::memcmp(&r.from_ranks[i], &r.from_store[i], sizeof(float)) != 0) ++r.rank_mismatched_values;
  r.ranks_sha256 = FloatsSha256(r.from_ranks);
  return r;
}

Result<std::vector<uint32_t>> RouteHidden(const gguf::ShardSet& source, uint32_t layer, std::span<const float> x,
                                          uint32_t k) {
  K3_ASSIGN_OR_RETURN(Router router, LoadRouter(source, layer));
  moe::MoeConfig cfg;
  cfg.num_experts = static_cast<uint32_t>(router.weight.info->ne[1]);
  cfg.top_k = k;
  K3_ASSIGN_OR_RETURN(moe::Routing routing, RouteWith(router, x, cfg));
  return routing.experts;
}

static nlohmann::json EpRunJson(const ExpertRunResult& r) {
  if (r.ep_size <= 1) return nullptr;
  nlohmann::json ranks = nlohmann::json::array();
  for (const EpRankRun& k : r.ranks)
    ranks.push_back({{"rank", k.rank},
                     {"first_expert", k.first_expert},
                     {"end_expert", k.end_expert},
                     {"pack", k.pack_path},
                     {"routes", k.routes},
                     {"acquire_calls", k.acquire_calls},
                     {"cache_hits", k.hits},
                     {"cache_misses", k.misses},
                     {"bytes_read", k.bytes_read},
                     {"seconds", k.seconds}});
  return {{"ep_size", r.ep_size},
          {"reduction_order", "per token: each rank's routes summed from zero in router order, then ranks 0.." +
                                  std::to_string(r.ep_size - 1) + " added in order"},
          {"ranks", ranks},
          {"ranks_output_sha256", r.ranks_sha256},
          {"mismatched_values_vs_single_store", r.rank_mismatched_values},
          {"matches_single_store", r.rank_mismatched_values == 0}};
}

nlohmann::json ExpertRunJson(const ExpertRunResult& r) {
  double sum = 0;
  for (float v : r.from_store) sum += v;
  return {{"layer", r.layer},
          {"tokens", r.tokens},
          {"top_k", r.top_k},
          {"num_experts", r.num_experts},
          {"hidden_size", r.hidden},
          {"latent_size", r.latent},
          {"intermediate_size", r.inter},
          {"routed_experts", r.routed},
          {"output_sum", sum},
          {"store_output_sha256", r.store_sha256},
          {"source_output_sha256", r.source_sha256},
          {"mismatched_values", r.mismatched_values},
          {"max_abs_diff", r.max_abs_diff},
          {"matches_source", r.matches()},
          {"acquire_seconds", r.acquire_seconds},
          {"store_compute_seconds", r.store_compute_seconds},
          {"source_compute_seconds", r.source_compute_seconds},
          {"cache_hits", r.hits},
          {"cache_misses", r.misses},
          {"bytes_read", r.bytes_read},
          {"ep", EpRunJson(r)}};
}

}  // namespace k3pack::store
