// k3pack.ExpertStore (binds include/k3pack/store.h): SGLang's
// KimiGGMLExpertPackStore as a host-memory expert cache. acquire() returns
// the expert objects' bytes as read-only numpy views (zero-copy into the
// cache); a view stays valid after mark_used() or eviction. An Acquisition
// that is dropped without mark_used() is released when it is destroyed, so
// an exception between acquire and mark_used never pins objects for good.
#include <pybind11/stl.h>

#include <memory>

#include "common.h"
#include "k3pack/store.h"
#include "store/store_impl.h"

namespace k3py {
namespace {

namespace store = k3pack::store;

struct PyRoute {
  uint32_t layer = 0, expert = 0;
  py::object bytes, up, gate, down;
};

struct PyAcquisition {
  std::shared_ptr<store::ExpertStore> owner;
  store::Acquisition acq;
  std::vector<PyRoute> routes;
  PyAcquisition() = default;
  PyAcquisition(const PyAcquisition&) = delete;
  PyAcquisition& operator=(const PyAcquisition&) = delete;
  // Unreleased pins would protect these objects from eviction for the rest
  // of the store's life (every later acquire that needs their room fails).
  // Without the GIL where it may be let go: a stats flush may be due.
  ~PyAcquisition() {
    if (!owner || acq.ticket == 0) return;
    NoGil nogil(std::nothrow);
    (void)owner->MarkUsed(acq);
  }
};

// Releases `a` (idempotent) without the GIL: MarkUsed may write the stats
// file when stats_flush_interval is due.
void Release(store::ExpertStore& st, PyAcquisition& a) {
  k3pack::Status status;
  {
    NoGil nogil;
    status = st.MarkUsed(a.acq);
  }
  Check(status);
}

py::object View(std::span<const uint8_t> s, const std::shared_ptr<const void>& owner) {
  return ReadOnlyView(Dtype("|u1"), {static_cast<int64_t>(s.size())}, s.data(), owner);
}

std::shared_ptr<PyAcquisition> Wrap(std::shared_ptr<store::ExpertStore> st, store::Acquisition&& a) {
  auto out = std::make_shared<PyAcquisition>();
  out->owner = std::move(st);
  out->acq = std::move(a);
  for (const auto& v : out->acq.routes) {
    out->routes.push_back({v.layer, v.expert, View(v.bytes, v.owner), View(v.up, v.owner), View(v.gate, v.owner),
                           View(v.down, v.owner)});
  }
  return out;
}

py::object Snapshot(const store::ExpertStore& self) {
  std::string text;
  {
    NoGil nogil;  // waits for the store's lock
    text = self.Snapshot().dump();
  }
  return py::module_::import("json").attr("loads")(text);
}

void CloseStore(store::ExpertStore& self) {
  k3pack::Status st;
  {
    NoGil nogil;  // waits for reads in flight, writes the stats file
    st = self.Close();
  }
  Check(st);
}

}  // namespace

std::optional<k3pack::ep::Rank> EpRankArg(const py::object& ep_size, const py::object& ep_rank) {
  if (ep_size.is_none() && ep_rank.is_none()) return std::nullopt;
  if (ep_size.is_none() || ep_rank.is_none())
    Raise(k3pack::Error("ep_size and ep_rank go together: pass both (or neither, for a rank pack's own rank)"));
  const py::int_ size = IndexArg(ep_size, "ep_size"), rank = IndexArg(ep_rank, "ep_rank");
  const std::string size_text = py::repr(size).cast<std::string>();
  if (size < py::int_(1)) Raise(k3pack::Error("ep_size must be at least 1, got " + size_text));
  const uint32_t n = IntInRange<uint32_t>(size, "ep_size", 1, UINT32_MAX);
  if (rank < py::int_(0) || rank >= size)
    Raise(k3pack::Error("ep_rank " + py::repr(rank).cast<std::string>() + " is out of range for ep_size " +
                        size_text + " (ranks are 0.." + std::to_string(n - 1) + ")"));
  return k3pack::ep::Rank{n, rank.cast<uint32_t>()};
}

void RegisterStore(py::module_& m) {
  m.def("_check_stats_path", [](const std::string& path) { Check(k3pack::store::CheckStatsFile(path)); },
        py::arg("path"),
        "raise unless the store may write its stats at path (nothing there, or a stats file; FileExistsError "
        "otherwise)");
  py::class_<PyRoute>(m, "ExpertView",
                      "One routed expert object: whole bytes and the up/gate/down role views (read-only uint8 "
                      "numpy arrays, zero-copy into the store's cache; they keep their bytes alive after "
                      "mark_used, eviction and close).")
      .def_readonly("layer", &PyRoute::layer, "the layer id of the route")
      .def_readonly("expert", &PyRoute::expert, "the global expert id of the route")
      .def_readonly("bytes", &PyRoute::bytes, "the whole object, in the pack's physical order up | gate | down")
      .def_readonly("up", &PyRoute::up, "the up projection's GGML blocks")
      .def_readonly("gate", &PyRoute::gate, "the gate projection's GGML blocks")
      .def_readonly("down", &PyRoute::down, "the down projection's GGML blocks")
      .def("__repr__", [](const PyRoute& r) {
        return "ExpertView(layer=" + std::to_string(r.layer) + ", expert=" + std::to_string(r.expert) + ")";
      });

  py::class_<PyAcquisition, std::shared_ptr<PyAcquisition>>(m, "Acquisition",
                                                           "The result of ExpertStore.acquire: views in route order.")
      .def_property_readonly("layer", [](const PyAcquisition& a) { return a.acq.layer; }, "the layer acquired")
      .def_property_readonly("routes", [](const PyAcquisition& a) { return a.routes; },
                             "a list of ExpertView, one per route in route order (tokens x top_k, duplicates kept)")
      .def_property_readonly("experts", [](const PyAcquisition& a) {
        std::vector<uint32_t> e;
        for (const auto& r : a.routes) e.push_back(r.expert);
        return e;
      }, "the expert id of each route, in route order")
      .def_property_readonly("released", [](const PyAcquisition& a) { return a.acq.ticket == 0; },
                             "True once mark_used() (or the with block) has released the call")
      .def("__len__", [](const PyAcquisition& a) { return a.routes.size(); }, "the number of routes")
      .def("__getitem__", [](const PyAcquisition& a, const py::object& index) {
        // As a list's: any int (one past ssize_t is out of range, not
        // pybind11's "incompatible function arguments"), negative from the end.
        if (!PyIndex_Check(index.ptr()))
          throw py::type_error("Acquisition indices must be integers, not " + TypeNameOf(index));
        const auto n = static_cast<int64_t>(a.routes.size());
        int64_t i = IntArg(index, "index").value_or(INT64_MIN);  // past int64: out of range either way
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw py::index_error("Acquisition index out of range");
        return a.routes[static_cast<size_t>(i)];
      }, "the ExpertView of route i (negative i counts from the end)")
      .def("mark_used", [](PyAcquisition& a) { Release(*a.owner, a); },
           "release this call's objects for eviction (idempotent); the views stay valid. An Acquisition "
           "dropped without it is released when it is garbage-collected")
      .def("__enter__", [](py::object self) { return self; }, "returns the Acquisition itself")
      .def("__exit__", [](PyAcquisition& a, py::args) {
        Release(*a.owner, a);
        return false;
      }, "mark_used()");

  py::class_<store::ExpertStore, std::shared_ptr<store::ExpertStore>>(
      m, "ExpertStore", "Host-memory expert cache over a GGMLMOEPACKv1 pack (SGLang's store semantics).")
      .def(py::init([](const std::string& pack_path, const std::string& manifest_path, const py::object& cache_bytes,
                       const std::string& policy, const std::string& io_backend, bool direct_io,
                       const py::object& read_splits, const py::object& queue_depth,
                       const py::object& stats_flush_interval, const std::string& stats_path, bool verify_pack_sha256,
                       const py::object& expected_layers, const py::object& expected_experts,
                       const py::object& expected_top_k, const py::object& ep_size, const py::object& ep_rank,
                       const std::string& prefetch_mode, const py::object& prefetch_budget_bytes,
                       const py::object& prefetch_queue_depth, bool keep_predicted) {
             store::StoreOptions o;
             o.ep = EpRankArg(ep_size, ep_rank);
             o.ep_names = kEpKeywordNames;
             o.prefetch_mode = prefetch_mode;
             o.prefetch_budget_bytes = IntInRange<uint64_t>(prefetch_budget_bytes, "prefetch_budget_bytes", 0, UINT64_MAX);
             o.prefetch_queue_depth = CountArg(prefetch_queue_depth, "prefetch_queue_depth", 0, INT64_MAX);
             o.keep_predicted = keep_predicted;
             // Not positive: SGLang's 'must be positive', in the library's words (a uint64 holds no -1).
             if (const py::int_ c = IndexArg(cache_bytes, "cache_bytes"); c < py::int_(1)) {
               Raise(store::NotPositiveError("cache_bytes", py::repr(c).cast<std::string>()));
             }
             o.cache_bytes = IntInRange<uint64_t>(cache_bytes, "cache_bytes", 1, UINT64_MAX);
             o.policy = policy;
             o.io_backend = io_backend;
             o.direct_io = direct_io;
             o.read_splits = StoreCountArg(read_splits, "read_splits", store::kMaxReadSplits, INT64_MIN, INT64_MAX);
             o.queue_depth = StoreCountArg(queue_depth, "queue_depth", store::kMaxReadCount, INT64_MIN, INT64_MAX);
             o.stats_flush_interval = CountArg(stats_flush_interval, "stats_flush_interval", 0, INT64_MAX);
             o.stats_path = stats_path;
             o.verify_pack_sha256 = verify_pack_sha256;
             o.expected_layers = OptionalIntInRange<uint32_t>(expected_layers, "expected_layers", 0, UINT32_MAX);
             o.expected_experts = OptionalIntInRange<uint32_t>(expected_experts, "expected_experts", 0, UINT32_MAX);
             o.expected_top_k = OptionalIntInRange<uint32_t>(expected_top_k, "expected_top_k", 0, UINT32_MAX);
             k3pack::Result<std::shared_ptr<store::ExpertStore>> r = [&] {
               NoGil nogil;
               return store::ExpertStore::Open(pack_path, manifest_path, o);
             }();
             return Unwrap(std::move(r));
           }),
           py::arg("pack_path"), py::arg("manifest_path"), py::kw_only(), py::arg("cache_bytes") = 4096ull << 20,
           py::arg("policy") = "reuse-lfu-lru-v2", py::arg("io_backend") = "pread", py::arg("direct_io") = false,
           py::arg("read_splits") = 1, py::arg("queue_depth") = 16, py::arg("stats_flush_interval") = 0,
           py::arg("stats_path") = "", py::arg("verify_pack_sha256") = false,
           py::arg("expected_layers") = py::none(), py::arg("expected_experts") = py::none(),
           py::arg("expected_top_k") = py::none(), py::arg("ep_size") = py::none(),
           py::arg("ep_rank") = py::none(), py::arg("prefetch_mode") = "staged",
           py::arg("prefetch_budget_bytes") = 0, py::arg("prefetch_queue_depth") = 0,
           py::arg("keep_predicted") = true,
           "opens the pack after SGLang's start-up checks (manifest, header, every index entry, index digest); "
           "cache_bytes: the host-memory budget of resident objects; the other options: docs/python.md")
      .def("acquire", [](std::shared_ptr<store::ExpertStore> self, py::object layer_arg, py::object topk_ids,
                         std::optional<bool> is_prefill, py::object request_ids) {
        const uint32_t layer = LayerArg(layer_arg);
        std::vector<int64_t> shape;
        std::vector<int64_t> ids = IntegerIdsArg(topk_ids, "topk_ids", &shape);
        std::vector<uint64_t> requests = RequestIdsArg(request_ids);
        k3pack::Result<store::Acquisition> r = InterruptibleWithoutGil(
            "waiting for room in the expert cache", [&] { return self->Acquire(layer, ids, shape, is_prefill, requests); });
        return Wrap(self, Unwrap(std::move(r)));
      }, py::arg("layer"), py::arg("topk_ids"), py::kw_only(), py::arg("is_prefill") = py::none(),
         py::arg("request_ids") = py::none(),
         "topk_ids: integer array [tokens, top_k] (numpy, a CPU torch tensor or nested lists); request_ids: None "
         "(unknown), the call's request id or one per row (the request-aware and adaptive policies learn from "
         "them); returns an Acquisition (views in route order). Release it with mark_used() or a with block")
      .def("acquire_token", [](std::shared_ptr<store::ExpertStore> self, py::object layer_arg, py::object expert_ids) {
        const uint32_t layer = LayerArg(layer_arg);
        std::vector<int64_t> ids = IntegerIdsArg(expert_ids, "expert_ids");
        k3pack::Result<store::Acquisition> r = InterruptibleWithoutGil(
            "waiting for room in the expert cache", [&] { return self->AcquireToken(layer, ids); });
        return Wrap(self, Unwrap(std::move(r)));
      }, py::arg("layer"), py::arg("expert_ids"), "one decode token: exactly top_k expert ids")
      .def("prefetch", PredictionMethod("prefetch", &store::ExpertStore::Prefetch), py::arg("layer"), py::arg("expert_ids"),
           py::kw_only(), py::arg("request_id") = py::none(),
           "start reading experts of `layer` without waiting; request_id: the request whose next token was "
           "predicted (its keep hints and staged reads then outlive other requests' acquires of the layer)")
      .def("keep", PredictionMethod("keep", &store::ExpertStore::Keep), py::arg("layer"), py::arg("expert_ids"),
           py::kw_only(), py::arg("request_id") = py::none(),
           "keep hints without reads: the resident ones of expert_ids are kept until request_id's next acquire "
           "of `layer` (e.g. next-token predictions); raises when keep_predicted is off")
      .def("mark_used", [](store::ExpertStore& self, PyAcquisition& a) { Release(self, a); }, py::arg("acquisition"), "release an Acquisition of this store (the same as acquisition.mark_used())")
      .def("snapshot", &Snapshot, "SGLang's stats dict (same keys) plus k3pack's under 'k3pack'")
      .def("stats", &Snapshot, "the same as snapshot()")
      .def("write_stats", [](const store::ExpertStore& self) {
        k3pack::Status st;
        {
          NoGil nogil;
          st = self.WriteStats();
        }
        Check(st);
      }, "write the stats file now (stats_path must be set; SGLang's format, temp file then rename)")
      .def("close", &CloseStore,
           "wait for reads in flight, write the stats file (when stats_path is set) and close the pack; idempotent. "
           "Views already handed out stay valid; acquire and prefetch then raise RuntimeError")
      .def("__enter__", [](py::object self) { return self; }, "returns the store itself")
      .def("__exit__", [](store::ExpertStore& self, py::args) {
        CloseStore(self);
        return false;
      }, "close()")
      .def_property_readonly("info", [](const store::ExpertStore& self) {
        const store::StoreInfo& i = self.info();
        py::dict d;
        d["pack_path"] = i.pack_path;
        d["manifest_path"] = i.manifest_path;
        d["profile"] = i.profile;
        d["num_hidden_layers"] = i.num_hidden_layers;
        d["num_experts"] = i.num_experts;
        d["top_k"] = i.top_k;
        d["active_layer_ids"] = i.active_layer_ids;
        d["object_bytes"] = i.object_bytes;
        d["role_offsets"] = i.role_offsets;
        d["role_bytes"] = i.role_bytes;
        d["index_sha256"] = i.index_sha256;
        d["index_count"] = i.index_count;
        d["data_start"] = i.data_start;
        d["pack_size"] = i.pack_size;
        d["cache_bytes"] = i.cache_bytes;
        d["effective_capacity_objects"] = i.effective_capacity_objects;
        d["open_seconds"] = i.open_seconds;
        d["ep_size"] = i.ep.size;
        d["ep_rank"] = i.ep.rank;
        d["owned_experts"] = py::make_tuple(i.owned_experts.first, i.owned_experts.end);
        return d;
      }, "the pack's layout facts (a dict: layers, experts, top_k, object and role bytes per active layer, "
         "index digest, cache budget, EP rank ...)");
}

}  // namespace k3py
