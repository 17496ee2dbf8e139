// The request ids of a store acquire, as the policy's CallRows.
#include <optional>
#include <string>

#include "store/store_impl.h"

namespace k3pack::store {

Status CheckRequestId(std::optional<uint64_t> request_id) {
  if (request_id != kNoRequestId) return Status::OK();
  return Error("request id " + std::to_string(kNoRequestId) +
                   " (2^64-1) is reserved: the store uses it for a call or prediction without one",
               ErrorKind::kValue)
      .WithHint("give request ids below 2^64-1, or none");
}

Status CheckRequestIds(std::span<const uint64_t> request_ids, uint64_t rows) {
  const uint64_t count = request_ids.size();
  if (count != 0 && count != 1 && count != rows)
    return Error("request_ids must hold one id for the call or one per row; received " + std::to_string(count) +
                     " for " + std::to_string(rows) + " rows",
                 ErrorKind::kValue);
  for (uint64_t id : request_ids) K3_RETURN_IF_ERROR(CheckRequestId(id));
  return Status::OK();
}

Result<const CallRows*> StoreCallRows(const ObjectSpace& space, const RouteCall& call, std::span<const int64_t> ids,
                                      std::span<const uint64_t> request_ids, std::vector<ObjectId>* keys,
                                      CallRows* out) {
  if (request_ids.empty()) return static_cast<const CallRows*>(nullptr);  // unknown: today's behaviour
  const uint64_t rows = static_cast<uint64_t>(call.rows);
  K3_RETURN_IF_ERROR(CheckRequestIds(request_ids, rows));
  keys->clear();
  // PrepareRoute has checked every id: in range, rows x width.
  for (int64_t e : ids) keys->push_back(space.Id(call.layer_index, static_cast<uint32_t>(e)));
  out->keys = *keys;
  out->requests = request_ids;
  out->width = rows ? static_cast<uint32_t>(ids.size() / rows) : 0;
  return static_cast<const CallRows*>(out);
}

Result<PreparedAcquire> PrepareAcquire(const PackGeometry& geo, uint32_t layer, std::span<const int64_t> shape,
                                       std::span<const int64_t> ids, std::optional<bool> is_prefill,
                                       std::span<const uint64_t> request_ids) {
  PreparedAcquire out;
  K3_ASSIGN_OR_RETURN(out.call, PrepareStoreRoute(geo, layer, shape, ids, is_prefill));
  K3_ASSIGN_OR_RETURN(const CallRows* rows,
                      StoreCallRows(geo.space, out.call, ids, request_ids, &out.row_keys, &out.rows));
  out.has_rows = rows != nullptr;
  return out;
}

}  // namespace k3pack::store
