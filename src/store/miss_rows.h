// The call a tier behind another one sees: only the front tier's misses
// reach it. With request ids, each missed object goes on as a route of the
// first row (request) of the call that asked for it, in rows of one request
// each (padded to the route width with the row's last route: acquires keep
// duplicates), so a request-aware policy behind the front still learns per
// request. Used by the device tier and by its model in the timed replay.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace k3pack::store {

// The request of each of `items` (ascending, each among `routes`): that of
// the first row of `routes` (rows x width) holding it, in one pass over the
// routes; `requests` holds one id for the call or one per row.
template <typename T>
void FirstRowRequests(std::span<const T> routes, size_t width, std::span<const uint64_t> requests,
                      std::span<const T> items, std::vector<uint64_t>* out) {
  out->assign(items.size(), requests.empty() ? 0 : requests[0]);
  if (requests.size() <= 1) return;
  std::vector<uint8_t> found(items.size(), 0);
  for (size_t i = 0; i < routes.size(); ++i) {
    const auto it = std::lower_bound(items.begin(), items.end(), routes[i]);
    if (it == items.end() || *it != routes[i]) continue;
    const size_t j = static_cast<size_t>(it - items.begin());
    if (!found[j]) (*out)[j] = requests[i / width];
    found[j] = 1;
  }
}

// Lays `misses` out as rows of `width` routes. `requests`: each miss's
// request (empty: unknown, one group and no row requests). `route_of[j]` is
// the route that carries misses[j].
template <typename T>
void MissRows(std::span<const T> misses, std::span<const uint64_t> requests, size_t width, std::vector<T>* routes,
              std::vector<uint64_t>* row_requests, std::vector<size_t>* route_of) {
  std::vector<size_t> order(misses.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  if (!requests.empty())
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return requests[x] < requests[y]; });
  routes->clear();
  row_requests->clear();
  route_of->assign(misses.size(), 0);
  for (size_t g = 0; g < order.size();) {
    size_t end = requests.empty() ? order.size() : g + 1;
    while (end < order.size() && requests[order[end]] == requests[order[g]]) ++end;
    for (size_t j = g; j < end; ++j) {
      (*route_of)[order[j]] = routes->size();
      routes->push_back(misses[order[j]]);
    }
    while (routes->size() % width != 0) routes->push_back(routes->back());
    if (!requests.empty()) row_requests->resize(routes->size() / width, requests[order[g]]);
    g = end;
  }
}

}  // namespace k3pack::store
