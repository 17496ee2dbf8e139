#include "k3pack/trace.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "util/file.h"

namespace k3pack::trace {
namespace {

constexpr char kMagic[8] = {'K', '3', 'T', 'R', 'A', 'C', 'E', '\0'};
constexpr uint32_t kMaxVersion = 2;
constexpr uint32_t kFlagPrefill = 1u, kFlagRowRequests = 2u, kFlagPredictions = 4u,
                   kFlagTokenPredictions = 8u;

template <typename T>
void Put(std::string* s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64/aarch64)
  s->append(b, sizeof(T));
}

struct Cursor {
  std::string_view s;
  size_t pos = 0;
  template <typename T>
  bool Get(T* v) {
    if (pos + sizeof(T) > s.size()) return false;
    std::memcpy(v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
};

}  // namespace

void Trace::Append(uint32_t layer, uint32_t rows, uint32_t request, bool prefill, std::span<const uint16_t> route_ids) {
  Record r{layer, rows, request, prefill, ids.size()};
  records.push_back(r);
  ids.insert(ids.end(), route_ids.begin(), route_ids.end());
}

void Trace::SetRowRequests(std::span<const uint32_t> requests) {
  Record& r = records.back();
  r.has_row_requests = true;
  r.row_request_offset = row_requests.size();
  row_requests.insert(row_requests.end(), requests.begin(), requests.end());
}

void Trace::SetPredictions(std::span<const uint16_t> predicted) {
  Record& r = records.back();
  r.has_predictions = true;
  r.prediction_offset = predictions.size();
  predictions.insert(predictions.end(), predicted.begin(), predicted.end());
}

void Trace::SetTokenPredictions(std::span<const uint16_t> predicted) {
  Record& r = records.back();
  r.has_token_predictions = true;
  r.token_prediction_offset = token_predictions.size();
  token_predictions.insert(token_predictions.end(), predicted.begin(), predicted.end());
}

uint32_t Trace::version() const {
  if (predict_k != 0) return 2;
  for (const Record& r : records)
    if (r.has_row_requests || r.has_predictions || r.has_token_predictions) return 2;
  return 1;
}

std::string EncodeTrace(const Trace& t) {
  std::string out;
  out.reserve(40 + t.layer_ids.size() * 4 + t.records.size() * 16 + t.ids.size() * 2);
  out.append(kMagic, 8);
  const uint32_t version = t.version();
  Put<uint32_t>(&out, version);
  Put<uint32_t>(&out, t.num_experts);
  Put<uint32_t>(&out, t.top_k);
  Put<uint32_t>(&out, static_cast<uint32_t>(t.layer_ids.size()));
  Put<uint64_t>(&out, t.records.size());
  if (version >= 2) Put<uint32_t>(&out, t.predict_k);
  for (uint32_t l : t.layer_ids) Put<uint32_t>(&out, l);
  for (const Record& r : t.records) {
    Put<uint32_t>(&out, r.layer);
    Put<uint32_t>(&out, r.rows);
    Put<uint32_t>(&out, r.request);
    Put<uint32_t>(&out, (r.is_prefill ? kFlagPrefill : 0u) | (r.has_row_requests ? kFlagRowRequests : 0u) |
                            (r.has_predictions ? kFlagPredictions : 0u) |
                            (r.has_token_predictions ? kFlagTokenPredictions : 0u));
    auto ids = t.RecordIds(r);
    out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
    if (r.has_row_requests)
      out.append(reinterpret_cast<const char*>(t.row_requests.data() + r.row_request_offset),
                 size_t{r.rows} * sizeof(uint32_t));
    auto pred = t.RecordPredictions(r);
    out.append(reinterpret_cast<const char*>(pred.data()), pred.size() * sizeof(uint16_t));
    auto next = t.RecordTokenPredictions(r);
    out.append(reinterpret_cast<const char*>(next.data()), next.size() * sizeof(uint16_t));
  }
  return out;
}

Status CheckModelFits(uint64_t layers, uint32_t experts) {
  if (experts == 0 || experts > 65536)
    return Error("a trace holds 1..65536 experts per layer (ids are 16-bit); this model has " +
                 std::to_string(experts));
  if (layers > kMaxObjects / experts)
    return Error(std::to_string(layers) + " layers x " + std::to_string(experts) + " experts = " +
                 std::to_string(layers * experts) + " objects, more than a trace may declare (" + kMaxObjectsText +
                 "; docs/FORMATS.md): trace at most " + std::to_string(kMaxObjects / experts) + " layers");
  return Status::OK();
}

Status WriteTrace(const std::string& path, const Trace& t) { return WriteFileAtomic(path, EncodeTrace(t)); }

Result<Trace> ReadTrace(const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string data, ReadFileToString(path));
  return ParseTrace(data, path);
}

namespace {

// Reads a trace file front to back; every count is checked against the bytes
// left before anything is read or allocated by it.
class TraceParser {
 public:
  TraceParser(std::string_view data, const std::string& path) : data_(data), path_(path), c_{data, 8} {}

  Result<Trace> Parse() {
    const std::string size = std::to_string(data_.size()) + " bytes";
    if (data_.empty()) return Bad("the file is empty (a trace starts with the magic K3TRACE\\0)");
    // A prefix of the magic is a file cut short, not some other file.
    const size_t magic_part = std::min<size_t>(data_.size(), 8);
    if (std::memcmp(data_.data(), kMagic, magic_part) != 0) return Bad("bad magic (a trace starts with K3TRACE\\0)");
    if (data_.size() < 32) return Bad("truncated header: the file holds " + size + ", a trace header is at least 32");
    K3_RETURN_IF_ERROR(ParseHeader());
    K3_RETURN_IF_ERROR(ParseLayerList());
    t_.records.reserve(n_records_);
    for (uint64_t i = 0; i < n_records_; ++i) K3_RETURN_IF_ERROR(ParseRecord(i));
    if (c_.pos != data_.size())
      return Bad(std::to_string(data_.size() - c_.pos) + " trailing bytes at offset " + std::to_string(c_.pos) +
                 ", after the " + std::to_string(n_records_) + " records the header declares");
    return std::move(t_);
  }

 private:
  Error Bad(const std::string& why) const { return Error(path_ + ": not a k3pack trace: " + why); }

  Status ParseHeader() {
    c_.Get(&version_);
    c_.Get(&t_.num_experts);
    c_.Get(&t_.top_k);
    c_.Get(&n_layers_);
    c_.Get(&n_records_);
    if (version_ == 0 || version_ > kMaxVersion)
      return Bad("unsupported version " + std::to_string(version_) + " (this build reads 1 and 2)");
    if (t_.top_k == 0 || t_.num_experts == 0 || t_.num_experts > 65536)
      return Bad("invalid dimensions: " + std::to_string(t_.num_experts) + " experts (1..65536), top_k " +
                 std::to_string(t_.top_k) + " (at least 1)");
    // A row routes top_k of the layer's experts; this also keeps rows x top_k
    // far from overflowing in the size checks below.
    if (t_.top_k > t_.num_experts)
      return Bad("top_k " + std::to_string(t_.top_k) + " exceeds " + std::to_string(t_.num_experts) + " experts");
    if (version_ >= 2) {
      if (!c_.Get(&t_.predict_k))
        return Bad("truncated header: the file holds " + std::to_string(data_.size()) +
                   " bytes, a v2 trace header is at least 36");
      if (t_.predict_k > t_.num_experts)
        return Bad("predict_k " + std::to_string(t_.predict_k) + " exceeds " + std::to_string(t_.num_experts) +
                   " experts");
    }
    // Every record takes at least 16 bytes (its fixed fields): a count past
    // that is a damaged header, caught before anything is reserved for it.
    if (n_records_ > data_.size() / 16 + 1)
      return Bad("the header declares " + std::to_string(n_records_) + " records, but the file holds only " +
                 std::to_string(data_.size()) + " bytes (a record takes at least 16)");
    return Status::OK();
  }

  Status ParseLayerList() {
    if (n_layers_ > (data_.size() - c_.pos) / 4)
      return Bad("the header declares " + std::to_string(n_layers_) + " layers, a " +
                 std::to_string(uint64_t{n_layers_} * 4) + "-byte layer list at offset " + std::to_string(c_.pos) +
                 ", but the file holds only " + std::to_string(data_.size() - c_.pos) + " bytes after the header");
    if (uint64_t{n_layers_} * t_.num_experts > kMaxObjects)
      return Bad(std::to_string(n_layers_) + " layers x " + std::to_string(t_.num_experts) + " experts = " +
                 std::to_string(uint64_t{n_layers_} * t_.num_experts) + " objects, more than a trace may declare (" +
                 kMaxObjectsText + "; docs/FORMATS.md)");
    t_.layer_ids.reserve(n_layers_);
    for (uint32_t i = 0; i < n_layers_; ++i) {
      const size_t at = c_.pos;
      uint32_t l = 0;
      c_.Get(&l);  // in the file: checked against its size above
      if (!t_.layer_ids.empty() && l <= t_.layer_ids.back())
        return Bad("layer ids are not ascending: layer id " + std::to_string(l) + " at offset " + std::to_string(at) +
                   " follows " + std::to_string(t_.layer_ids.back()) + " (entry " + std::to_string(i) + " of the " +
                   std::to_string(n_layers_) + " the header declares" +
                   (version_ >= 2 ? "; a v2 header has predict_k before the list, which a v1 body marked v2 shifts)"
                                  : ")"));
      t_.layer_ids.push_back(l);
    }
    return Status::OK();
  }

  // A record's fixed fields that break a rule. Records carry no length:
  // where the one before wrote more or fewer ids than its rows and the
  // header's top_k and predict_k say, this record's fields are that one's
  // ids, and the fault is blamed here; the hint says so.
  Error BadFields(uint64_t i, size_t start, const std::string& why) const {
    Error e = Bad(why);
    if (i == 0) return e;
    return e.WithHint("record " + std::to_string(i) + " is read from byte " + std::to_string(start) +
                      ", where record " + std::to_string(i - 1) + "'s ids end by its row count, top_k " +
                      std::to_string(t_.top_k) + " and predict_k " + std::to_string(t_.predict_k) +
                      ": a writer that put more or fewer ids in record " + std::to_string(i - 1) +
                      " (a prediction list longer than predict_k) shifts every record after it");
  }

  Status ParseRecord(uint64_t i) {
    const size_t start = c_.pos;
    uint32_t layer, rows, request, flags;
    if (!c_.Get(&layer) || !c_.Get(&rows) || !c_.Get(&request) || !c_.Get(&flags))
      return Bad("truncated at record " + std::to_string(i) + ": its 16-byte fields start at offset " +
                 std::to_string(start) + " of " + std::to_string(data_.size()) + " bytes (the header declares " +
                 std::to_string(n_records_) + " records)");
    const std::string at = " at record " + std::to_string(i);
    if (rows == 0) return BadFields(i, start, "0 rows" + at + " (a call routes at least one token)");
    // Every consumer looks the layer up in the header's list.
    if (!std::binary_search(t_.layer_ids.begin(), t_.layer_ids.end(), layer))
      return BadFields(i, start, "layer " + std::to_string(layer) + at + " is not in the header's layer list");
    const uint64_t n = uint64_t{rows} * t_.top_k;
    if (n > (data_.size() - c_.pos) / 2) return Cut("truncated ids" + at, n * 2);
    if (version_ >= 2) {
      if (flags & ~(kFlagPrefill | kFlagRowRequests | kFlagPredictions | kFlagTokenPredictions)) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "%x", flags);
        return BadFields(i, start, "unknown flag bits 0x" + std::string(hex) + at);
      }
      if ((flags & kFlagPredictions) && t_.predict_k == 0)
        return BadFields(i, start, "predictions flagged" + at + " but the header's predict_k is 0");
      if ((flags & kFlagTokenPredictions) && t_.predict_k == 0)
        return BadFields(i, start, "next-token predictions flagged" + at + " but the header's predict_k is 0");
    } else {
      flags &= kFlagPrefill;  // v1 readers ignored the other bits
    }
    Record r{layer, rows, request, (flags & kFlagPrefill) != 0, t_.ids.size()};
    // Every consumer indexes per-expert tables by these ids (found by trace_fuzz).
    K3_RETURN_IF_ERROR(ReadIds(n, t_.top_k, "truncated ids", "expert id ", at, &t_.ids, &r.offset));
    if (flags & kFlagRowRequests) {
      if (c_.pos + uint64_t{rows} * 4 > data_.size()) return Cut("truncated row requests" + at, uint64_t{rows} * 4);
      r.has_row_requests = true;
      r.row_request_offset = t_.row_requests.size();
      t_.row_requests.resize(t_.row_requests.size() + rows);
      std::memcpy(t_.row_requests.data() + r.row_request_offset, data_.data() + c_.pos, size_t{rows} * 4);
      c_.pos += size_t{rows} * 4;
    }
    // Predicted ids (next layer, then next token): rows * predict_k each.
    const uint64_t np = uint64_t{rows} * t_.predict_k;
    if (flags & kFlagPredictions) {
      K3_RETURN_IF_ERROR(ReadIds(np, t_.predict_k, "truncated predictions", "predicted expert id ", at,
                                 &t_.predictions, &r.prediction_offset));
      r.has_predictions = true;
    }
    if (flags & kFlagTokenPredictions) {
      K3_RETURN_IF_ERROR(ReadIds(np, t_.predict_k, "truncated next-token predictions",
                                 "next-token predicted expert id ", at, &t_.token_predictions,
                                 &r.token_prediction_offset));
      r.has_token_predictions = true;
    }
    t_.records.push_back(r);
    return Status::OK();
  }

  // A field that runs past the end of the file, with where it starts.
  Error Cut(const std::string& what, uint64_t bytes) const {
    return Bad(what + ": " + std::to_string(bytes) + " bytes from offset " + std::to_string(c_.pos) +
               ", the file holds " + std::to_string(data_.size()) + " (the header declares " +
               std::to_string(n_records_) + " records)");
  }

  // Appends n expert ids, rows of `width`, to `dst` (their start in
  // *offset), each below num_experts and none twice in a row; `truncated` is
  // the error when the file ends first. A router's top-k (or a predictor's)
  // names distinct experts: a repeat is a damaged or padded row, and every
  // consumer would silently count it as one route.
  Status ReadIds(uint64_t n, uint32_t width, const std::string& truncated, const std::string& what,
                 const std::string& at, std::vector<uint16_t>* dst, uint64_t* offset) {
    if (c_.pos + n * 2 > data_.size()) return Cut(truncated + at, n * 2);
    *offset = dst->size();
    dst->resize(dst->size() + n);
    std::memcpy(dst->data() + *offset, data_.data() + c_.pos, n * 2);
    c_.pos += n * 2;
    if (seen_in_row_.empty()) seen_in_row_.assign(t_.num_experts, 0);
    for (uint64_t k = 0; k < n; ++k) {
      const uint16_t e = (*dst)[*offset + k];
      if (e >= t_.num_experts)
        return Bad(what + std::to_string(e) + at + " is not below " + std::to_string(t_.num_experts) + " experts");
      if (k % width == 0) ++row_serial_;
      if (seen_in_row_[e] == row_serial_)
        return Bad(what + std::to_string(e) + at + " appears twice in row " + std::to_string(k / width) +
                   " (a row names " + std::to_string(width) + " distinct experts)");
      seen_in_row_[e] = row_serial_;
    }
    return Status::OK();
  }

  std::string_view data_;
  const std::string& path_;
  Cursor c_;
  Trace t_;
  uint32_t version_ = 0, n_layers_ = 0;
  uint64_t n_records_ = 0;
  // seen_in_row_[e] == row_serial_: e is already in the row being read.
  std::vector<uint64_t> seen_in_row_;
  uint64_t row_serial_ = 0;
};

}  // namespace

Result<Trace> ParseTrace(std::string_view data, const std::string& path) { return TraceParser(data, path).Parse(); }

uint64_t CountTokens(const Trace& t) {
  uint32_t lowest = UINT32_MAX;
  for (const Record& r : t.records) lowest = std::min(lowest, r.layer);
  uint64_t tokens = 0;
  for (const Record& r : t.records)
    if (r.layer == lowest) tokens += r.rows;
  return tokens;
}

std::optional<double> MeasuredReuse(const Trace& t) {
  // Compare consecutive tokens of the same request and layer, whatever
  // other requests' rows come in between.
  struct Key {
    uint32_t request;
    size_t layer;
    bool operator<(const Key& k) const { return request != k.request ? request < k.request : layer < k.layer; }
  };
  std::map<Key, std::vector<uint16_t>> prev;
  uint64_t shared = 0, total = 0;
  std::vector<uint16_t> cur, both;
  for (const Record& r : t.records) {
    auto it = std::lower_bound(t.layer_ids.begin(), t.layer_ids.end(), r.layer);
    if (it == t.layer_ids.end() || *it != r.layer) continue;
    size_t li = it - t.layer_ids.begin();
    auto ids = t.RecordIds(r);
    for (uint32_t row = 0; row < r.rows; ++row) {
      cur.assign(ids.begin() + size_t{row} * t.top_k, ids.begin() + size_t{row + 1} * t.top_k);
      std::sort(cur.begin(), cur.end());
      auto [p, fresh] = prev.try_emplace(Key{t.RowRequest(r, row), li});
      if (!fresh) {
        both.clear();
        std::set_intersection(cur.begin(), cur.end(), p->second.begin(), p->second.end(), std::back_inserter(both));
        shared += both.size();
        total += cur.size();
      }
      p->second = cur;
    }
  }
  if (total == 0) return std::nullopt;
  return static_cast<double>(shared) / static_cast<double>(total);
}

}  // namespace k3pack::trace
