// `run-experts --trace-out`: routed layers run as one stack, with router
// look-ahead predictions recorded in a v2 trace (see k3pack/run_experts.h).
#include <algorithm>
#include <string>

#include "k3pack/run_experts.h"

namespace k3pack::store {

Progress LayerProgress(size_t done, size_t total) {
  Progress p("run", 0, 0, done, total, 0);
  p.unit = "layers";
  return p;
}

Result<LayerStackResult> RunLayerStack(ExpertStore& store, const gguf::ShardSet& source,
                                       const ExpertRunOptions& options, const std::vector<uint32_t>& layers,
                                       const std::vector<std::shared_ptr<ExpertStore>>& rank_stores) {
  if (layers.empty()) return Error("run-experts: no routed layer to run");
  for (size_t i = 1; i < layers.size(); ++i)
    if (layers[i] <= layers[i - 1]) return Error("run-experts: the stack's layers must be ascending");
  LayerStackResult out;
  std::vector<float> hidden;  // the residual stream entering the next layer
  for (size_t i = 0; i < layers.size(); ++i) {
    ExpertRunOptions o = options;
    o.layer = layers[i];
    o.hidden = i == 0 ? options.hidden : &hidden;
    o.residual_out = i + 1 < layers.size();
    if (i + 1 < layers.size()) o.predict_layer = layers[i + 1];
    else o.predict_layer.reset();
    K3_ASSIGN_OR_RETURN(ExpertRunResult r, RunRoutedExperts(store, source, o, rank_stores));
    hidden = std::move(r.hidden_out);
    r.hidden_out.clear();
    out.layers.push_back(std::move(r));
    if (options.progress) options.progress(LayerProgress(i + 1, layers.size()));
  }
  const ExpertRunResult& first = out.layers.front();
  out.predict_k = options.predict_k ? options.predict_k : first.top_k;

  // Accuracy: the share of layer i+1's routes that layer i predicted.
  for (size_t i = 0; i + 1 < out.layers.size(); ++i) {
    const ExpertRunResult &a = out.layers[i], &b = out.layers[i + 1];
    uint64_t routes = 0, right = 0;
    for (uint32_t k = 0; k < b.tokens; ++k) {
      const auto& guess = a.predicted[k];
      for (uint32_t e : b.routed[k]) {
        ++routes;
        if (std::find(guess.begin(), guess.end(), e) != guess.end()) ++right;
      }
    }
    out.layer_routes.push_back(routes);
    out.layer_right.push_back(right);
    out.predicted_routes += routes;
    out.predicted_right += right;
  }

  // Next-token proxy: the same router on the same MoE input. The stack's
  // tokens are independent draws, not a decoded sequence, so its accuracy
  // says little; it exercises the trace field and the timed replay.
  std::vector<std::vector<std::vector<uint32_t>>> next_guess;  // [layer][token]
  if (options.predict_next_token) {
    next_guess.resize(out.layers.size());
    for (size_t i = 0; i < out.layers.size(); ++i) {
      const ExpertRunResult& r = out.layers[i];
      const size_t h = static_cast<size_t>(r.hidden);
      for (uint32_t k = 0; k < r.tokens; ++k) {
        std::span<const float> x(r.hidden_in.data() + k * h, h);
        K3_ASSIGN_OR_RETURN(auto g, RouteHidden(source, r.layer, x, out.predict_k));
        if (k > 0)
          for (uint32_t e : r.routed[k]) {
            ++out.next_token_routes;
            out.next_token_right += std::count(next_guess[i].back().begin(), next_guess[i].back().end(), e);
          }
        next_guess[i].push_back(std::move(g));
      }
    }
  }

  // The trace: the tokens decoded one after another, one record per layer.
  trace::Trace& t = out.trace;
  t.num_experts = first.num_experts;
  t.top_k = first.top_k;
  t.layer_ids = layers;
  t.predict_k = layers.size() > 1 || options.predict_next_token ? out.predict_k : 0;
  std::vector<uint16_t> ids, guess;
  for (uint32_t k = 0; k < first.tokens; ++k) {
    for (size_t i = 0; i < out.layers.size(); ++i) {
      const ExpertRunResult& r = out.layers[i];
      ids.assign(r.routed[k].begin(), r.routed[k].end());
      t.Append(r.layer, 1, 0, false, ids);
      if (!r.predicted.empty()) {
        guess.assign(r.predicted[k].begin(), r.predicted[k].end());
        t.SetPredictions(guess);
      }
      if (!next_guess.empty()) {
        guess.assign(next_guess[i][k].begin(), next_guess[i][k].end());
        t.SetTokenPredictions(guess);
      }
    }
  }
  return out;
}

nlohmann::json LayerStackJson(const LayerStackResult& r) {
  nlohmann::json per = nlohmann::json::array();
  for (size_t i = 0; i < r.layer_routes.size(); ++i)
    per.push_back({{"from_layer", r.layers[i].layer},
                   {"layer", r.layers[i + 1].layer},
                   {"routes", r.layer_routes[i]},
                   {"predicted", r.layer_right[i]},
                   {"accuracy", r.layer_routes[i] ? double(r.layer_right[i]) / double(r.layer_routes[i]) : 0.0}});
  return {{"hidden_state", "moe_input"},
          {"predict_k", r.predict_k},
          {"routes", r.predicted_routes},
          {"predicted", r.predicted_right},
          {"accuracy", r.predicted_routes ? nlohmann::json(r.accuracy()) : nlohmann::json(nullptr)},
          {"per_layer", per},
          {"next_token",
           r.next_token_routes == 0 && r.trace.token_predictions.empty()
               ? nlohmann::json(nullptr)
               : nlohmann::json{{"proxy", "same_layer_router_on_same_input"},
                                {"routes", r.next_token_routes},
                                {"predicted", r.next_token_right},
                                {"accuracy", r.next_token_routes ? nlohmann::json(double(r.next_token_right) /
                                                                                  double(r.next_token_routes))
                                                                 : nlohmann::json(nullptr)}}}};
}

}  // namespace k3pack::store
