// Value checks: ssm_a (the -exp(A_log) transform SGLang inverts), the folded
// attention-residual scores, and NaN/Inf in the small F32 vectors.
#include <cmath>
#include <cstring>
#include <limits>

#include "doctor/internal.h"
#include "k3pack/names.h"
#include "k3pack/quant.h"
#include "loader/values.h"

namespace k3pack::doctor {

const char* SsmAFormName(SsmAForm f) {
  switch (f) {
    case SsmAForm::kNegExp: return "neg-exp";
    case SsmAForm::kTinyNegative: return "tiny-negative";
    case SsmAForm::kRawALog: return "raw-a-log";
    case SsmAForm::kMixedForms: return "mixed-forms";
    case SsmAForm::kAllZero: return "all-zero";
    case SsmAForm::kZeroedElements: return "zeroed-elements";
    case SsmAForm::kNonFinite: return "non-finite";
    case SsmAForm::kNormLike: return "norm-like";
    case SsmAForm::kImplausible: return "implausible";
  }
  return "?";
}

SsmAStats ClassifySsmA(std::span<const float> v) {
  SsmAStats s;
  s.count = v.size();
  double sum = 0;
  bool first = true;
  for (float x : v) {
    if (!std::isfinite(x)) {
      ++s.nonfinite;
      continue;
    }
    if (x < 0) ++s.negative;
    else if (x == 0) ++s.zero;
    else ++s.positive;
    sum += x;
    if (first || x < s.min) s.min = x;
    if (first || x > s.max) s.max = x;
    first = false;
  }
  const uint64_t finite = s.count - s.nonfinite;
  s.mean = finite ? sum / static_cast<double>(finite) : 0;
  if (s.nonfinite > 0) {
    s.form = SsmAForm::kNonFinite;
  } else if (s.count == 0 || s.zero == s.count) {
    s.form = SsmAForm::kAllZero;
  } else if (s.positive == 0 && s.zero > 0) {
    // -exp(A_log) rounds to 0 only for A_log below about -17 (F16) or -103
    // (F32), far outside a trained model's range, and a raw A_log with exact
    // zeros and nothing positive is no likelier: the zeros are lost elements
    // (a hole in a copy). Refused, never "repaired" as raw A_log.
    s.form = SsmAForm::kZeroedElements;
  } else if (s.negative == s.count) {
    s.form = -s.max < kTinyMagnitude ? SsmAForm::kTinyNegative : SsmAForm::kNegExp;
  } else {
    bool clustered = s.positive == s.count && s.count >= 2 && s.mean >= 0.25 && s.mean <= 4.0;
    for (float x : v) clustered = clustered && std::fabs(x - s.mean) <= kNormSpread * s.mean;
    if (clustered) s.form = SsmAForm::kNormLike;
    else if (s.max > kMaxRawALog) s.form = SsmAForm::kImplausible;
    else if (s.min < -1.0) s.form = SsmAForm::kMixedForms;
    else s.form = SsmAForm::kRawALog;
  }
  return s;
}

namespace {
// The types DecodeFloatTensor reads.
bool IsPlainFloat(GgmlType type) { return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16; }
}  // namespace

std::optional<std::vector<float>> DecodeFloatTensor(GgmlType type, std::span<const uint8_t> bytes) {
  if (!IsPlainFloat(type)) return std::nullopt;
  const size_t esize = type == GgmlType::F32 ? 4 : 2;
  auto r = quant::DequantizeRows(type, bytes, static_cast<int64_t>(bytes.size() / esize), 1);
  if (!r.ok()) return std::nullopt;
  return std::move(r).value();
}

Result<std::vector<uint8_t>> EncodeFloatTensor(GgmlType type, std::span<const float> values) {
  std::vector<uint8_t> out;
  if (type == GgmlType::F32) {
    out.resize(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  if (type != GgmlType::F16 && type != GgmlType::BF16) {
    return Error("cannot encode values as " + std::string(GgmlTypeName(type)) + " (only F32, F16, BF16)");
  }
  out.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = type == GgmlType::F16 ? loader::FloatToHalfBits(values[i]) : loader::FloatToBFloatBits(values[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

namespace internal {

namespace {

// blk.N.ssm_a with N what SGLang's `\d+` takes (any Unicode decimal digit).
bool IsSsmAName(const std::string& name) {
  auto mapped = kimi::MapTensorName(name);
  return mapped.ok() && mapped->targets.front().transform == kimi::TargetTransform::kALog;
}

std::string Describe(const SsmAStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%llu values in [%.6g, %.6g], mean %.6g: %llu negative, %llu zero, %llu positive",
                static_cast<unsigned long long>(s.count), s.min, s.max, s.mean,
                static_cast<unsigned long long>(s.negative), static_cast<unsigned long long>(s.zero),
                static_cast<unsigned long long>(s.positive));
  std::string out = buf;
  if (s.nonfinite) out += ", " + std::to_string(s.nonfinite) + " NaN/Inf";
  return out;
}

nlohmann::json StatsJson(const SsmAStats& s) {
  return {{"form", SsmAFormName(s.form)}, {"count", s.count},   {"negative", s.negative},
          {"zero", s.zero},               {"positive", s.positive}, {"nonfinite", s.nonfinite},
          {"min", s.min},                 {"max", s.max},         {"mean", s.mean}};
}

// F64 values as floats of the same form: sign, zero and finiteness kept.
// Rounded plainly, -1e-50 became -0.0 ("a zero") and -1e300 -inf ("not
// finite"), where SGLang's float64 log(-raw) takes both.
std::vector<float> F64AsFloatForms(std::span<const uint8_t> bytes) {
  std::vector<float> out(bytes.size() / 8);
  for (size_t i = 0; i < out.size(); ++i) {
    double d;
    std::memcpy(&d, bytes.data() + 8 * i, 8);
    const double a = std::fabs(d);
    using limits = std::numeric_limits<float>;
    if (!std::isfinite(d) || d == 0) out[i] = static_cast<float>(d);
    else if (a > limits::max()) out[i] = std::copysign(limits::max(), d);
    else if (a < limits::denorm_min()) out[i] = std::copysign(limits::denorm_min(), d);
    else out[i] = static_cast<float>(d);
  }
  return out;
}

constexpr const char* kNotFinite = "Kimi-K3 GGUF ssm_a must contain finite floating values";
constexpr const char* kNotNegExp = "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values";

}  // namespace

std::vector<SsmAVerdict> ExamineSsmA(const ShardView& view, const std::function<void(uint64_t)>& decoded) {
  std::vector<SsmAVerdict> out;
  for (const std::string& name : view.order) {
    if (!IsSsmAName(name)) continue;
    const Located& loc = *view.Find(name);
    SsmAVerdict v;
    v.name = name;
    v.shard = loc.shard;
    v.info = loc.info;
    const Shard& sh = view.shards[loc.shard];
    if (sh.DataReadable(*loc.info)) {
      // Any type the quant module decodes (a quantized ssm_a is still
      // described, though only F32/F16/BF16 can be repaired in place).
      const gguf::TensorInfo& t = *loc.info;
      if (t.type == GgmlType::F64) {
        v.values = F64AsFloatForms(sh.Bytes(t));
        v.stats = ClassifySsmA(v.values);
      } else if (quant::CanDequantize(t.type) && t.ne[0] > 0) {
        auto vals = quant::DequantizeRows(t.type, sh.Bytes(t), t.ne[0], t.n_rows());
        if (vals.ok()) {
          v.values = std::move(vals).value();
          v.stats = ClassifySsmA(v.values);
        }
      }
      if (decoded) decoded(loc.info->nbytes);
    }
    out.push_back(std::move(v));
  }
  return out;
}

namespace {

// A residual score as SGLang's name table has it (two targets: projection
// and norm), whose values it splits and so holds to a vector; another name
// ending in _res_score.weight is its KeyError first.
bool IsResidualScore(const std::string& name) {
  auto mapped = kimi::MapTensorName(name);
  return mapped.ok() && mapped->table == kimi::NameTable::kResidual;
}

// Which tensors the small-vector scan decodes (ssm_a is examined apart).
bool ScannedForNonFinite(const std::string& name, const gguf::TensorInfo& t, const Shard& sh) {
  const bool res = IsResidualScore(name);
  if (IsSsmAName(name) || t.nbytes > (64u << 20) || !sh.DataReadable(t)) return false;
  return (res || t.n_dims == 1) && IsPlainFloat(t.type);
}

}  // namespace

void CheckValues(const ShardView& view, const ModelContext& m, Collector& out, const ProgressFn& progress,
                 bool ssm_a_only) {
  // Totals first, so a bar can show an ETA: every tensor this pass reads.
  Progress p("doctor values", 0, 0, 0, 0, 0);
  p.unit = "tensors";
  for (const std::string& name : view.order) {
    const Located& loc = *view.Find(name);
    const Shard& sh = view.shards[loc.shard];
    if ((IsSsmAName(name) && sh.DataReadable(*loc.info)) || (!ssm_a_only && ScannedForNonFinite(name, *loc.info, sh))) {
      p.total_bytes += loc.info->nbytes;
      ++p.total_objects;
    }
  }
  auto advance = [&](uint64_t bytes) {
    p.done_bytes += bytes;
    ++p.done_objects;
    if (progress) progress(p);
  };
  for (const SsmAVerdict& v : ExamineSsmA(view, advance)) {
    const gguf::TensorInfo& t = *v.info;
    const Shard& sh = view.shards[v.shard];
    if (!sh.DataReadable(t)) continue;  // reported as gguf-truncated
    // Shape: what SGLang's A_log loader takes, as the stream checks it.
    if (m.dims) {
      const int64_t H = m.dims->heads;
      const auto shape = t.shape();
      if (kimi::SsmAHeadsOf(shape) != H) {
        std::string like;
        const std::string layer = v.name.substr(0, v.name.rfind('.') + 1);
        for (const auto& [ename, et] : m.expected) {
          if (ename != v.name && ename.rfind(layer, 0) == 0 && et.ShapeMatches(shape)) like += (like.empty() ? "" : ", ") + ename;
        }
        Finding& f = out.Add("ssm-a-shape", v.name,
                             "shape " + NeList(shape) + ", expected {" + std::to_string(H) + "} or {1, " +
                                 std::to_string(H) + ", 1, 1} (attention.head_count)" +
                                 (like.empty() ? "" : "; the shape of " + like + ": probably that tensor mapped here"),
                             {}, sh.path);
        f.details = {{"shape", shape}, {"expected", {H}}, {"matches", like}};
      }
    }
    const GgmlTypeInfo* ti = GgmlTypeInfoFor(t.type);
    // F64 is floating to SGLang too (gguf-py hands it out as float64).
    if (t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::F64) {
      std::string msg = "stored as " + std::string(GgmlTypeName(t.type));
      if (t.type == GgmlType::BF16) msg += " (gguf-py returns BF16 as raw uint8 bytes)";
      else if (ti != nullptr && ti->quantized) msg += " (a quantized type: a weight matrix may have been mapped here)";
      if (v.stats) msg += "; values: " + Describe(*v.stats);
      Finding& f = out.Add("ssm-a-not-float", v.name, msg, kNotFinite, sh.path);
      f.details = {{"dtype", std::string(GgmlTypeName(t.type))}};
      if (v.stats) f.details["values"] = StatsJson(*v.stats);
      continue;
    }
    if (!v.stats) continue;
    const SsmAStats& s = *v.stats;
    const char* code = nullptr;
    std::string sg = kNotNegExp;
    switch (s.form) {
      case SsmAForm::kNegExp: break;
      case SsmAForm::kTinyNegative: code = "ssm-a-tiny"; sg.clear(); break;
      case SsmAForm::kRawALog: code = "ssm-a-raw-a-log"; break;
      case SsmAForm::kMixedForms: code = "ssm-a-mixed-forms"; break;
      case SsmAForm::kAllZero:
      case SsmAForm::kZeroedElements: code = "ssm-a-zero"; break;
      case SsmAForm::kNonFinite: code = "ssm-a-nonfinite"; sg = kNotFinite; break;
      case SsmAForm::kNormLike: code = "ssm-a-looks-like-norm"; break;
      case SsmAForm::kImplausible: code = "ssm-a-implausible"; break;
    }
    if (code == nullptr) continue;
    Finding& f = out.Add(code, v.name, Describe(s), sg, sh.path);
    f.details = StatsJson(s);
    if (s.form == SsmAForm::kRawALog) {
      f.fix = "Run `k3pack repair " + view.dir + " OUT --fix ssm-a` to write a copy with " + v.name +
              " = -exp(A_log), or re-export the GGUF with the transform.";
    }
  }

  // Residual scores SGLang's stream refuses by their shape alone: found
  // without reading a byte, so the build gate (which reads only ssm_a)
  // refuses them too; it called them loadable.
  for (const std::string& name : view.order) {
    const Located& loc = *view.Find(name);
    const gguf::TensorInfo& t = *loc.info;
    if (IsResidualScore(name) && t.n_dims != 1) {
      Finding& f = out.Add("res-score-not-vector", name, "shape " + NeList(t.shape()) + " is not a vector",
                           "Kimi-K3 attention-residual score must be a vector, got " + NumpyShapeRepr(t.shape()),
                           view.shards[loc.shard].path);
      f.details = {{"shape", t.shape()}};
    }
  }
  if (ssm_a_only) return;
  // The small float vectors' values.
  for (const std::string& name : view.order) {
    const Located& loc = *view.Find(name);
    const gguf::TensorInfo& t = *loc.info;
    const Shard& sh = view.shards[loc.shard];
    if (!ScannedForNonFinite(name, t, sh)) continue;
    auto vals = DecodeFloatTensor(t.type, sh.Bytes(t));
    advance(t.nbytes);
    if (!vals) continue;
    uint64_t bad = 0;
    for (float x : *vals) bad += !std::isfinite(x);
    if (bad) {
      Finding& f = out.Add("tensor-nonfinite", name,
                           std::to_string(bad) + " of " + std::to_string(vals->size()) + " values are NaN/Inf", {},
                           sh.path);
      f.details = {{"nonfinite", bad}, {"count", vals->size()}};
    }
  }
}

}  // namespace internal
}  // namespace k3pack::doctor
