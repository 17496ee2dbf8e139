// Router look-ahead on the tiny synthetic model (`run-experts --trace-out`):
// layer L+1's router applied to layer L's MoE input, checked against the
// same rule recomputed here from the GGUF tensors; the residual chain
// between layers; exact predictions when the hidden state does not change;
// the v2 trace it writes, and its replay by `trace sweep --timing`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "k3pack/moe.h"
#include "k3pack/quant.h"
#include "k3pack/run_experts.h"
#include "k3pack/trace.h"
#include "../cli_run.h"
#include "built_tiny_model.h"

namespace k3pack::store {
namespace {

using testing_cli::Cli;

class RouterLookaheadTest : public testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() { BuildModel("k3-router-lookahead"); }

  static std::span<const uint8_t> Bytes(const gguf::ShardSet& set, const std::string& name,
                                        const gguf::TensorInfo** info) {
    auto loc = set.FindTensor(name);
    EXPECT_TRUE(loc.has_value()) << name;
    if (!loc) return {};
    *info = loc->info;
    return set.shards()[loc->shard_index]->TensorData(*loc->info);
  }

  // The routing rule restated: the k experts with the highest
  // sigmoid(W x) + exp_probs_b, ties to the lower id, best first.
  static std::vector<uint32_t> TopK(const gguf::ShardSet& set, uint32_t layer, std::span<const float> x, uint32_t k) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    const gguf::TensorInfo* w = nullptr;
    auto wb = Bytes(set, p + "ffn_gate_inp.weight", &w);
    const uint32_t n = static_cast<uint32_t>(w->ne[1]);
    auto logits = moe::RouterLogits(w->type, wb, x, n);
    EXPECT_TRUE(logits.ok());
    std::vector<float> bias(n, 0.0f);
    if (set.FindTensor(p + "exp_probs_b.bias")) {
      const gguf::TensorInfo* b = nullptr;
      auto bb = Bytes(set, p + "exp_probs_b.bias", &b);
      auto decoded = quant::DequantizeRows(b->type, bb, b->ne[0], 1);
      EXPECT_TRUE(decoded.ok());
      bias = *decoded;
    }
    std::vector<float> sel(n);
    for (uint32_t e = 0; e < n; ++e) sel[e] = 1.0f / (1.0f + std::exp(-(*logits)[e])) + bias[e];
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return sel[a] > sel[b]; });
    order.resize(k);
    return order;
  }
};

TEST_F(RouterLookaheadTest, PredictionsAreTheNextRouterOnThisLayersInput) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  const auto layers = store->info().active_layer_ids;
  ASSERT_GE(layers.size(), 2u);
  ExpertRunOptions o;
  o.tokens = 6;
  o.seed = 3;
  auto stack = RunLayerStack(*store, source, o, layers);
  ASSERT_TRUE(stack.ok()) << stack.error().message();
  ASSERT_EQ(stack->layers.size(), layers.size());
  const uint32_t top_k = stack->layers[0].top_k;
  EXPECT_EQ(stack->predict_k, top_k);
  uint64_t routes = 0, right = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const ExpertRunResult& r = stack->layers[i];
    EXPECT_TRUE(r.matches());
    const size_t h = static_cast<size_t>(r.hidden);
    ASSERT_EQ(r.hidden_in.size(), o.tokens * h);
    for (uint32_t k = 0; k < o.tokens; ++k) {
      std::span<const float> x(r.hidden_in.data() + k * h, h);
      // This layer's routes are its own router on its input...
      EXPECT_EQ(r.routed[k], TopK(source, r.layer, x, top_k)) << "layer " << r.layer << " token " << k;
      if (i + 1 == layers.size()) {
        EXPECT_TRUE(r.predicted.empty());
        continue;
      }
      // ...and its predictions are the next layer's router on the same input.
      ASSERT_EQ(r.predicted.size(), o.tokens);
      EXPECT_EQ(r.predicted[k], TopK(source, layers[i + 1], x, top_k)) << "layer " << r.layer << " token " << k;
      for (uint32_t e : stack->layers[i + 1].routed[k]) {
        ++routes;
        right += std::count(r.predicted[k].begin(), r.predicted[k].end(), e);
      }
    }
  }
  EXPECT_EQ(stack->predicted_routes, routes);
  EXPECT_EQ(stack->predicted_right, right);
  ASSERT_TRUE(store->Close().ok());
}

TEST_F(RouterLookaheadTest, EachLayerTakesThePreviousResidualStream) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  const auto layers = store->info().active_layer_ids;
  ExpertRunOptions o;
  o.tokens = 2;
  auto stack = RunLayerStack(*store, source, o, layers);
  ASSERT_TRUE(stack.ok()) << stack.error().message();
  for (size_t i = 0; i + 1 < layers.size(); ++i) {
    const ExpertRunResult &a = stack->layers[i], &b = stack->layers[i + 1];
    const gguf::TensorInfo* up = nullptr;
    auto ub = Bytes(source, "blk." + std::to_string(a.layer) + ".ffn_routed_up.weight", &up);
    const size_t h = static_cast<size_t>(a.hidden), l = static_cast<size_t>(a.latent);
    for (uint32_t k = 0; k < o.tokens; ++k) {
      auto y = moe::RouterLogits(up->type, ub, std::span<const float>(a.from_store.data() + k * l, l),
                                 static_cast<uint32_t>(h));
      ASSERT_TRUE(y.ok());
      double moved = 0;
      for (size_t j = 0; j < h; ++j) {
        EXPECT_EQ(b.hidden_in[k * h + j], a.hidden_in[k * h + j] + (*y)[j]) << "layer " << b.layer << " value " << j;
        moved += std::fabs((*y)[j]);
      }
      EXPECT_GT(moved, 0) << "the routed block must change the stream, or the chain proves nothing";
    }
  }
  ASSERT_TRUE(store->Close().ok());
}

TEST_F(RouterLookaheadTest, UnchangedHiddenStatePredictsTheRouteExactly) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  const auto layers = store->info().active_layer_ids;
  ExpertRunOptions first;
  first.layer = layers[0];
  first.tokens = 5;
  first.seed = 9;
  first.predict_layer = layers[1];
  auto a = RunRoutedExperts(*store, source, first);
  ASSERT_TRUE(a.ok()) << a.error().message();
  // Layer L+1 fed exactly layer L's input: its routes are the predictions.
  ExpertRunOptions second;
  second.layer = layers[1];
  second.tokens = 5;
  second.hidden = &a->hidden_in;
  auto b = RunRoutedExperts(*store, source, second);
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(a->predicted, b->routed);
  // A wider guess starts with the same experts, best first.
  first.predict_k = a->top_k + 3;
  auto wide = RunRoutedExperts(*store, source, first);
  ASSERT_TRUE(wide.ok());
  for (uint32_t k = 0; k < 5; ++k) {
    ASSERT_EQ(wide->predicted[k].size(), a->top_k + 3);
    EXPECT_TRUE(std::equal(b->routed[k].begin(), b->routed[k].end(), wide->predicted[k].begin()));
  }
  // A hidden vector of the wrong size is refused, naming the layer.
  std::vector<float> short_hidden(3);
  second.hidden = &short_hidden;
  auto bad = RunRoutedExperts(*store, source, second);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("layer " + std::to_string(layers[1])), std::string::npos)
      << bad.error().message();
  ASSERT_TRUE(store->Close().ok());
}

TEST_F(RouterLookaheadTest, TraceHoldsRoutesAndPredictionsAndRoundTrips) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  const auto layers = store->info().active_layer_ids;
  ExpertRunOptions o;
  o.tokens = 4;
  o.predict_k = 6;
  auto stack = RunLayerStack(*store, source, o, layers);
  ASSERT_TRUE(stack.ok()) << stack.error().message();
  const trace::Trace& t = stack->trace;
  EXPECT_EQ(t.version(), 2u);
  EXPECT_EQ(t.predict_k, 6u);
  EXPECT_EQ(t.layer_ids, layers);
  ASSERT_EQ(t.records.size(), o.tokens * layers.size());
  // Token-major: token k's records are layers[0..n) in order; only the last layer predicts nothing.
  uint64_t routes = 0, right = 0;
  for (uint32_t k = 0; k < o.tokens; ++k) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const trace::Record& r = t.records[k * layers.size() + i];
      EXPECT_EQ(r.layer, layers[i]);
      EXPECT_EQ(r.rows, 1u);
      EXPECT_FALSE(r.is_prefill);
      auto ids = t.RecordIds(r);
      EXPECT_TRUE(std::equal(ids.begin(), ids.end(), stack->layers[i].routed[k].begin()));
      EXPECT_EQ(r.has_predictions, i + 1 < layers.size());
      if (i == 0) continue;
      auto guess = t.RecordPredictions(t.records[k * layers.size() + i - 1]);
      for (uint16_t e : ids) {
        ++routes;
        right += std::count(guess.begin(), guess.end(), e);
      }
    }
  }
  EXPECT_EQ(stack->predicted_routes, routes);
  EXPECT_EQ(stack->predicted_right, right);

  const std::string path = dir_ + "/lookahead.trace";
  ASSERT_TRUE(trace::WriteTrace(path, t).ok());
  auto back = trace::ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->ids, t.ids);
  EXPECT_EQ(back->predictions, t.predictions);
  EXPECT_EQ(back->predict_k, t.predict_k);
  ASSERT_EQ(back->records.size(), t.records.size());
  for (size_t i = 0; i < t.records.size(); ++i) {
    EXPECT_EQ(back->records[i].has_predictions, t.records[i].has_predictions);
    auto x = back->RecordPredictions(back->records[i]), y = t.RecordPredictions(t.records[i]);
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
  ASSERT_TRUE(store->Close().ok());
}

TEST_F(RouterLookaheadTest, CliWritesTheTraceAndTheTimedSweepReplaysIt) {
  const std::string out = dir_ + "/cli.trace";
  auto run = Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 6 --trace-out " + out + " --json");
  ASSERT_EQ(run.code, 0) << run.out;
  auto j = nlohmann::json::parse(run.out.substr(run.out.find('{')));
  const auto& p = j["prediction"];
  EXPECT_EQ(p["hidden_state"], "moe_input");
  EXPECT_EQ(p["trace"], out);
  const uint64_t routes = p["routes"].get<uint64_t>(), right = p["predicted"].get<uint64_t>();
  EXPECT_GT(routes, 0u);
  EXPECT_NEAR(p["accuracy"].get<double>(), double(right) / double(routes), 1e-12);
  auto t = trace::ReadTrace(out);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(t->predict_k, p["predict_k"].get<uint32_t>());

  // An existing trace is not overwritten without --force.
  auto again = Cli("run-experts --manifest " + manifest_ + " --all-layers --trace-out " + out);
  EXPECT_EQ(again.code, 1) << again.out;
  EXPECT_NE(again.out.find("--trace-out"), std::string::npos) << again.out;
  EXPECT_EQ(Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 6 --trace-out " + out + " --force").code,
            0);
  EXPECT_EQ(Cli("run-experts --manifest " + manifest_ + " --predict-k 3").code, 2);
  // Not even --force makes an input (the manifest, the pack) the trace's output.
  for (const std::string& input : {manifest_, pack_}) {
    auto clash = Cli("run-experts --manifest " + manifest_ + " --all-layers --trace-out " + input + " --force");
    EXPECT_EQ(clash.code, 1) << clash.out;
    EXPECT_NE(clash.out.find("is an input"), std::string::npos) << clash.out;
  }
  EXPECT_TRUE(std::filesystem::exists(manifest_) && std::filesystem::file_size(pack_) > 0);

  auto sweep = Cli("trace sweep --timing --trace " + out + " --manifest " + manifest_ +
                   " --policies lru --sizes 8 --json");
  ASSERT_EQ(sweep.code, 0) << sweep.out;
  auto s = nlohmann::json::parse(sweep.out.substr(sweep.out.find('{')));
  ASSERT_EQ(s["timing"].size(), 3u);  // lru without and with prefetch, Belady
  EXPECT_EQ(s["tokens"], 6);
  EXPECT_TRUE(s["timing"][1]["prefetch"].get<bool>());
  // The replay used the recorded predictions: the prefetch run read some of them.
  EXPECT_GT(s["timing"][1]["prefetch_useful_bytes"].get<uint64_t>() + s["timing"][1]["prefetch_wasted_bytes"].get<uint64_t>(),
            0u);
}

// The next-token proxy (--predict-next-token): every record carries the
// layer's own router on the token's own input, top predict_k, the rule
// restated here; its accuracy is counted against the next token's routes.
TEST_F(RouterLookaheadTest, NextTokenProxyIsTheLayersOwnRouterOnTheSameInput) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  gguf::ShardSet source = Source();
  const auto layers = store->info().active_layer_ids;
  ExpertRunOptions o;
  o.tokens = 4;
  o.predict_k = 6;
  o.predict_next_token = true;
  auto stack = RunLayerStack(*store, source, o, layers);
  ASSERT_TRUE(stack.ok()) << stack.error().message();
  const trace::Trace& t = stack->trace;
  EXPECT_EQ(t.predict_k, 6u);
  uint64_t routes = 0, right = 0;
  for (uint32_t k = 0; k < o.tokens; ++k)
    for (size_t i = 0; i < layers.size(); ++i) {
      const trace::Record& r = t.records[k * layers.size() + i];
      ASSERT_TRUE(r.has_token_predictions);
      const auto& run = stack->layers[i];
      std::span<const float> x(run.hidden_in.data() + k * run.hidden, static_cast<size_t>(run.hidden));
      auto want = TopK(source, layers[i], x, 6);
      auto got = t.RecordTokenPredictions(r);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << "token " << k << " layer " << i;
      // The proxy's first top_k are the token's own routes.
      EXPECT_TRUE(std::equal(run.routed[k].begin(), run.routed[k].end(), got.begin()));
      if (k == 0) continue;
      auto prev = t.RecordTokenPredictions(t.records[(k - 1) * layers.size() + i]);
      for (uint16_t e : t.RecordIds(r)) {
        ++routes;
        right += std::count(prev.begin(), prev.end(), e);
      }
    }
  EXPECT_EQ(stack->next_token_routes, routes);
  EXPECT_EQ(stack->next_token_right, right);
  auto j = LayerStackJson(*stack);
  EXPECT_EQ(j["next_token"]["routes"], routes);
  const std::string path = dir_ + "/next-token.trace";
  ASSERT_TRUE(trace::WriteTrace(path, t).ok());
  auto back = trace::ReadTrace(path);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->token_predictions, t.token_predictions);
  ASSERT_TRUE(store->Close().ok());
  EXPECT_EQ(Cli("run-experts --manifest " + manifest_ + " --predict-next-token").code, 2);
  auto cli = Cli("run-experts --manifest " + manifest_ + " --all-layers --tokens 3 --predict-next-token --trace-out " +
                 dir_ + "/cli-next.trace --json");
  ASSERT_EQ(cli.code, 0) << cli.out;
  auto cj = nlohmann::json::parse(cli.out.substr(cli.out.find('{')));
  EXPECT_EQ(cj["prediction"]["next_token"]["proxy"], "same_layer_router_on_same_input");
  auto sweep = Cli("trace sweep --timing --horizon token --trace " + dir_ + "/cli-next.trace --manifest " + manifest_ +
                   " --policies lru --sizes 8 --json");
  EXPECT_EQ(sweep.code, 0) << sweep.out;
}

}  // namespace
}  // namespace k3pack::store
