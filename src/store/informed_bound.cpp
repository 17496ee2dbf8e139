// The distribution-informed demand-only bound of `trace sweep` (simulate.h):
// the generator's true popularity, drifted token by token, in the shared
// demand-bound loop (demand_bound.h).
#include <algorithm>
#include <utility>

#include "store/demand_bound.h"

namespace k3pack::store {
namespace {

class InformedModel {
 public:
  InformedModel(const trace::TrueDistribution& truth, uint32_t E) : truth_(truth), E_(E), reqs_(truth.initial.size()) {
    for (uint32_t s = 0; s < truth.swaps.size(); ++s)
      if (truth.swaps[s].request < reqs_.size()) reqs_[truth.swaps[s].request].swaps.push_back(s);
  }
  void Start(uint32_t q) { reqs_[q].w = truth_.initial[q]; }
  void End(uint32_t q) { std::vector<float>().swap(reqs_[q].w); }
  bool Route(uint32_t, uint32_t, const std::vector<uint16_t>&, const std::vector<uint16_t>&) { return false; }
  template <class Changed>
  void Token(uint32_t q, uint32_t tokens, Changed&& changed) {
    Req& r = reqs_[q];
    while (r.next_swap < r.swaps.size() && truth_.swaps[r.swaps[r.next_swap]].token <= tokens) {
      const auto& s = truth_.swaps[r.swaps[r.next_swap++]];
      std::swap(r.w[size_t{s.layer_index} * E_ + s.a], r.w[size_t{s.layer_index} * E_ + s.b]);
      changed(s.layer_index, s.a);
      changed(s.layer_index, s.b);
    }
  }
  double Fresh(uint32_t q, uint32_t li, uint32_t e, double draws) const {
    return std::min(1.0, draws * reqs_[q].w[size_t{li} * E_ + e]);
  }

 private:
  struct Req {
    std::vector<float> w;         // [layer][expert], drifted to the current token
    std::vector<uint32_t> swaps;  // indices into truth.swaps, token order
    size_t next_swap = 0;
  };
  const trace::TrueDistribution& truth_;
  const uint32_t E_;
  std::vector<Req> reqs_;
};

}  // namespace

Result<SimResult> SimulateInformed(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                   uint64_t slots, const trace::TrueDistribution& truth) {
  InformedModel model(truth, space.num_experts);
  return RunDemandBound("informed", t, seq, space, slots, truth, model);
}

Result<SimResult> SimulateInformedNext(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                       uint64_t slots, const trace::TrueDistribution& truth) {
  InformedModel model(truth, space.num_experts);
  return RunDemandBound("informed+next", t, seq, space, slots, truth, model, /*know_next=*/true);
}

}  // namespace k3pack::store
