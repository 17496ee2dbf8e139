// k3pack._k3pack.SlotCache (binds include/k3pack/slot_cache.h): the engine
// under k3pack.sglang.KimiGGMLExpertPackStore. The slot memory is a torch
// tensor the Python side allocates; its address comes in as an int. Every
// call is one C++ call with the GIL released: no per-route Python work.
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>

#include "common.h"
#include "k3pack/slot_cache.h"

namespace k3py {
namespace {

namespace store = k3pack::store;

void* Pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

}  // namespace

void RegisterSlotCache(py::module_& m) {
  py::class_<store::SlotCache>(m, "SlotCache",
                               "SGLang's slot-level expert cache over a pack; slots live in caller memory.")
      .def(py::init([](const std::string& pack_path, const std::string& manifest_path, const std::string& policy,
                       const std::string& io_backend, bool direct_io, const py::object& read_splits,
                       const py::object& queue_depth, const py::object& stage_slots,
                       const py::object& host_cache_bytes, bool verify_pack_sha256,
                       const py::object& cache_vram_reserve_mib, const py::object& expected_layers,
                       const py::object& expected_experts, const py::object& expected_top_k,
                       const py::object& ep_size, const py::object& ep_rank) {
             store::SlotCacheOptions o;
             o.store.ep = EpRankArg(ep_size, ep_rank);
             o.store.ep_names = kEpKeywordNames;
             o.store.policy = policy;
             o.store.io_backend = io_backend;
             o.store.direct_io = direct_io;
             o.store.read_splits = StoreCountArg(read_splits, "read_splits", store::kMaxReadSplits, INT64_MIN, INT64_MAX);
             o.store.queue_depth = StoreCountArg(queue_depth, "queue_depth", store::kMaxReadCount, INT64_MIN, INT64_MAX);
             o.host_cache_bytes = IntInRange<uint64_t>(host_cache_bytes, "host_cache_bytes", 0, UINT64_MAX);
             o.store.verify_pack_sha256 = verify_pack_sha256;
             o.store.expected_layers = OptionalIntInRange<uint32_t>(expected_layers, "expected_layers", 0, UINT32_MAX);
             o.store.expected_experts = OptionalIntInRange<uint32_t>(expected_experts, "expected_experts", 0, UINT32_MAX);
             o.store.expected_top_k = OptionalIntInRange<uint32_t>(expected_top_k, "expected_top_k", 0, UINT32_MAX);
             o.stage_slots = static_cast<uint32_t>(StoreCountArg(stage_slots, "stage_slots", store::kMaxStageSlots, 0, UINT32_MAX));
             o.cache_vram_reserve_mib = IntInRange<int64_t>(cache_vram_reserve_mib, "cache_vram_reserve_mib", INT64_MIN, INT64_MAX);
             k3pack::Result<std::unique_ptr<store::SlotCache>> r = [&] {
               NoGil nogil;
               return store::SlotCache::Open(pack_path, manifest_path, o);
             }();
             return Unwrap(std::move(r));
           }),
           py::arg("pack_path"), py::arg("manifest_path"), py::kw_only(), py::arg("policy") = "reuse-lfu-lru-v2",
           py::arg("io_backend") = "pread", py::arg("direct_io") = false, py::arg("read_splits") = 1,
           py::arg("queue_depth") = 16, py::arg("stage_slots") = 16, py::arg("host_cache_bytes") = 0,
           py::arg("verify_pack_sha256") = false, py::arg("cache_vram_reserve_mib") = 0,
           py::arg("expected_layers") = py::none(), py::arg("expected_experts") = py::none(),
           py::arg("expected_top_k") = py::none(), py::arg("ep_size") = py::none(),
           py::arg("ep_rank") = py::none())
      .def_property_readonly("ep_size", [](const store::SlotCache& c) { return c.info().ep.size; })
      .def_property_readonly("ep_rank", [](const store::SlotCache& c) { return c.info().ep.rank; })
      .def_property_readonly("owned_experts", [](const store::SlotCache& c) {
        return py::make_tuple(c.info().owned_experts.first, c.info().owned_experts.end);
      })
      .def_property_readonly("slot_bytes", &store::SlotCache::slot_bytes)
      .def_property_readonly("attached", &store::SlotCache::attached)
      .def_property_readonly("top_k", [](const store::SlotCache& c) { return c.info().top_k; })
      .def_property_readonly("num_hidden_layers", [](const store::SlotCache& c) { return c.info().num_hidden_layers; })
      .def_property_readonly("num_experts", [](const store::SlotCache& c) { return c.info().num_experts; })
      .def_property_readonly("active_layer_ids", [](const store::SlotCache& c) { return c.info().active_layer_ids; })
      .def_property_readonly("role_offsets", [](const store::SlotCache& c) { return c.info().role_offsets; })
      .def_property_readonly("role_bytes", [](const store::SlotCache& c) { return c.info().role_bytes; })
      .def_property_readonly("index_sha256", [](const store::SlotCache& c) { return c.info().index_sha256; })
      .def("attach_host", [](store::SlotCache& c, uintptr_t address, const py::object& slot_count) {
        const uint32_t slots = IntInRange<uint32_t>(slot_count, "slot_count", 0, UINT32_MAX);
        Check(c.AttachHost(static_cast<uint8_t*>(Pointer(address)), slots));
      }, py::arg("address"), py::arg("slot_count"))
      .def("attach_cuda", [](store::SlotCache& c, uintptr_t address, const py::object& slot_count,
                             const py::object& device) {
        const uint32_t slots = IntInRange<uint32_t>(slot_count, "slot_count", 0, UINT32_MAX);
        Check(c.AttachCuda(Pointer(address), slots, IntInRange<int>(device, "device", 0, INT_MAX)));
      }, py::arg("address"), py::arg("slot_count"), py::arg("device"))
      .def("acquire", [](store::SlotCache& c, py::object layer_arg, py::object ids, std::optional<bool> is_prefill,
                         uintptr_t stream, py::object request_ids) {
        const uint32_t layer = LayerArg(layer_arg);
        std::vector<int64_t> shape;
        std::vector<int64_t> v = IntegerIdsArg(ids, "topk_ids", &shape);
        std::vector<uint64_t> requests = RequestIdsArg(request_ids);
        k3pack::Result<std::vector<int32_t>> r = InterruptibleWithoutGil("waiting for room in the expert cache", [&] {
          return c.Acquire(layer, v, shape, is_prefill, Pointer(stream), requests);
        });
        std::vector<int32_t> slots = Unwrap(std::move(r));
        py::array_t<int32_t> out(static_cast<py::ssize_t>(slots.size()));
        std::copy(slots.begin(), slots.end(), out.mutable_data());
        return out;
      }, py::arg("layer"), py::arg("topk_ids"), py::arg("is_prefill") = py::none(), py::arg("stream") = 0,
         py::arg("request_ids") = py::none(),
         "topk_ids: int array [tokens, top_k]; request_ids: None, the call's request id or one per row; returns "
         "int32 slots in route order")
      .def("mark_used", [](store::SlotCache& c, py::object slots, uintptr_t stream) {
        std::vector<int32_t> s;
        for (int64_t v : IntegerIdsArg(slots, "slot_indices"))  // out of int32: still "out of range" below
          s.push_back(static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)));
        k3pack::Status st;
        {
          NoGil nogil;
          st = c.MarkUsed(s, Pointer(stream));
        }
        Check(st);
      }, py::arg("slots"), py::arg("stream") = 0)
      .def("prefetch", PredictionMethod("prefetch", &store::SlotCache::Prefetch), py::arg("layer"), py::arg("expert_ids"),
           py::kw_only(), py::arg("request_id") = py::none())
      .def("keep", PredictionMethod("keep", &store::SlotCache::Keep), py::arg("layer"), py::arg("expert_ids"), py::kw_only(),
           py::arg("request_id") = py::none(), "keep hints for the host tier without reads (ExpertStore.keep)")
      .def("snapshot", [](const store::SlotCache& c) {
        // Snapshot() waits for the cache's lock, which an acquire on another
        // thread holds while it reads: never wait for it holding the GIL.
        std::string text;
        {
          NoGil nogil;
          text = c.Snapshot().dump();
        }
        return py::module_::import("json").attr("loads")(text);
      }, "SGLang's stats dict (same keys) plus k3pack's under 'k3pack'")
      .def("close", [](store::SlotCache& c) {
        k3pack::Status st;
        {
          NoGil nogil;
          st = c.Close();
        }
        Check(st);
      });
}

}  // namespace k3py
