#include "compress/compressor.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace ccoll {
namespace {

constexpr unsigned kCast16 = 1u << 0, kQuant = 1u << 1, kTopk = 1u << 2, kRandk = 1u << 3, kPowerSGD = 1u << 4;
constexpr unsigned kSparse = kTopk | kRandk;

const CompressorParamInfo kParams[] = {
    {ccParamBits, "bits", 1, 8, kQuant},
    {ccParamMode, "mode", 0, 1, kQuant},
    {ccParamRotation, "rotation", 0, 1, kQuant},
    {ccParamRotationBlock, "block", 64, 16384, kQuant},
    {ccParamGroupSize, "group", 0, 1 << 20, kQuant},
    {ccParamScaleFormat, "scale", 0, 2, kQuant},
    {ccParamClipPpm, "clip", 0, 999999, kQuant},
    {ccParamRounding, "rounding", 0, 2, kQuant},
    {ccParamGatherPayload, "gather", 0, 1, kQuant},
    {ccParamDensityPpm, "density", 1, 1000000, kSparse},
    {ccParamChunkSize, "chunk", 1, 1 << 24, kSparse},
    {ccParamErrorFeedback, "ef", 0, 1, kSparse | kPowerSGD},
    {ccParamValueType, "dtype", ccFloat16, ccBfloat16, kCast16 | kSparse | kPowerSGD},
    {ccParamUnbiased, "unbiased", 0, 1, kRandk},
    {ccParamRank, "rank", 1, 64, kPowerSGD},
    {ccParamRows, "rows", 0, int64_t{1} << 40, kPowerSGD},
    {ccParamCols, "cols", 0, int64_t{1} << 40, kPowerSGD},
    {ccParamWarmStart, "warm", 0, 1, kPowerSGD},
    {ccParamStartIter, "start", 0, INT64_MAX, kPowerSGD},
    {ccParamOrthoEpsilon, "eps", 0, 1000000000000, kPowerSGD},
    {ccParamSeed, "seed", 0, INT64_MAX, kCast16 | kQuant | kSparse | kPowerSGD},
    {static_cast<ccCompressorParam_t>(0), nullptr, 0, 0, 0}};

}  // namespace

int64_t DefaultParamValue(ccCompressorKind_t kind, ccCompressorParam_t p) {
  switch (p) {
    case ccParamBits: return 4;
    case ccParamMode: return ccQuantRequant;
    case ccParamRotation: return 1;
    case ccParamRotationBlock: return 1024;
    case ccParamGroupSize: return 0;
    case ccParamScaleFormat: return 1;
    case ccParamClipPpm: return 0;
    case ccParamRounding: return 1;
    case ccParamGatherPayload: return 0;
    case ccParamDensityPpm: return 100000;
    case ccParamChunkSize: return 1024;
    case ccParamErrorFeedback: return 1;
    case ccParamValueType: return kind == ccCompressCast16 ? ccBfloat16 : ccFloat32;
    case ccParamUnbiased: return 0;
    case ccParamRank: return 4;
    case ccParamRows: return 0;
    case ccParamCols: return 0;
    case ccParamWarmStart: return 1;
    case ccParamStartIter: return 0;
    case ccParamOrthoEpsilon: return 0;
    case ccParamSeed: return 0x5eed;
  }
  return 0;
}

// Symbolic values of the parameters that have them, first spelling canonical.
const ParamWord* ParamWords(ccCompressorParam_t p) {
  static const ParamWord mode[] = {{"homomorphic", 0}, {"requant", 1}, {nullptr, 0}};
  static const ParamWord rotation[] = {{"none", 0}, {"rht", 1}, {nullptr, 0}};
  static const ParamWord scale[] = {{"fp32", 0}, {"bf16", 1}, {"fp16", 2}, {nullptr, 0}};
  static const ParamWord rounding[] = {{"nearest", 0}, {"stochastic", 1}, {"correlated", 2}, {nullptr, 0}};
  static const ParamWord gather[] = {{"exact", 0}, {"requant", 1}, {nullptr, 0}};
  static const ParamWord dtype[] = {{"f32", ccFloat32}, {"bf16", ccBfloat16}, {"fp16", ccFloat16}, {"float32", ccFloat32},
                               {"float", ccFloat32}, {"bfloat16", ccBfloat16}, {"float16", ccFloat16},
                               {"half", ccFloat16}, {nullptr, 0}};
  static const ParamWord flag[] = {{"0", 0}, {"1", 1}, {"off", 0}, {"on", 1}, {"false", 0}, {"true", 1}, {nullptr, 0}};
  switch (p) {
    case ccParamMode: return mode;
    case ccParamRotation: return rotation;
    case ccParamScaleFormat: return scale;
    case ccParamRounding: return rounding;
    case ccParamGatherPayload: return gather;
    case ccParamValueType: return dtype;
    case ccParamErrorFeedback:
    case ccParamUnbiased:
    case ccParamWarmStart: return flag;
    default: return nullptr;
  }
}

double ParamTextScale(ccCompressorParam_t p) {
  switch (p) {
    case ccParamClipPpm:
    case ccParamDensityPpm: return 1e6;
    case ccParamOrthoEpsilon: return 1e12;
    default: return 0.0;
  }
}

bool ParseParamValue(const CompressorParamInfo& info, const std::string& text, int64_t* out) {
  if (const ParamWord* words = ParamWords(info.param)) {
    for (const ParamWord* w = words; w->text; ++w) {
      if (text == w->text) {
        *out = w->value;
        return true;
      }
    }
    if (info.param != ccParamErrorFeedback && info.param != ccParamUnbiased && info.param != ccParamWarmStart) {
      return false;
    }
  }
  // A number starts with a digit (or the '.' of a fraction): no sign, no blank.
  const char first = text.empty() ? '\0' : text[0];
  errno = 0;
  char* end = nullptr;
  if (const double scale = ParamTextScale(info.param); scale != 0.0) {
    if (!std::isdigit(static_cast<unsigned char>(first)) && first != '.') return false;
    // Decimal only: strtod also reads hexadecimal floats ("0x1p-3").
    if (text.find_first_not_of("0123456789.eE+-") != std::string::npos) return false;
    double v = std::strtod(text.c_str(), &end);
    if (errno != 0 || end == text.c_str() || *end != '\0' || !(v >= 0.0 && v <= 1.0)) return false;
    *out = static_cast<int64_t>(std::llround(v * scale));
    return v == 0.0 || *out != 0;  // not a value too small for the unit, quietly 0
  }
  if (!std::isdigit(static_cast<unsigned char>(first))) return false;
  const bool hex = text.size() > 2 && first == '0' && (text[1] == 'x' || text[1] == 'X');
  // Digits only after the prefix: strtoll would take a second "0x" in base 16, and blanks or a sign anywhere.
  if (text.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789", hex ? 2 : 0) != std::string::npos) {
    return false;
  }
  long long v = std::strtoll(text.c_str() + (hex ? 2 : 0), &end, hex ? 16 : 10);  // never octal
  if (errno != 0 || end == text.c_str() + (hex ? 2 : 0) || *end != '\0') return false;
  *out = v;
  return true;
}

std::string ParamValueProblem(int kind, const CompressorParamInfo& info, int64_t value) {
  if (value < info.lo || value > info.hi) return "out of range";
  if (info.param == ccParamRotationBlock && (value & (value - 1)) != 0) return "not a power of two";
  if (info.param == ccParamValueType) {
    const bool ok = kind == ccCompressCast16 ? (value == ccBfloat16 || value == ccFloat16)
                                             : (value == ccFloat32 || value == ccBfloat16);
    if (!ok) return std::string("not a wire type of ") + KindName(kind);
  }
  return "";
}

std::string ParamValueForms(int kind, const CompressorParamInfo& info) {
  if (const ParamWord* words = ParamWords(info.param)) {
    std::vector<const char*> allowed;
    for (const ParamWord* w = words; w->text; ++w) {
      if (ParamValueProblem(kind, info, w->value).empty()) allowed.push_back(w->text);
    }
    std::string forms;
    for (size_t i = 0; i < allowed.size(); ++i) {
      forms += std::string(i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    }
    return forms;
  }
  char range[128];
  if (const double scale = ParamTextScale(info.param); scale != 0.0) {
    std::snprintf(range, sizeof range, "a number from %g to %g, in steps of %g", static_cast<double>(info.lo) / scale,
                  static_cast<double>(info.hi) / scale, 1.0 / scale);
  } else {
    std::snprintf(range, sizeof range, "%s from %lld to %lld",
                  info.param == ccParamRotationBlock ? "a power of two" : "an integer", static_cast<long long>(info.lo),
                  static_cast<long long>(info.hi));
  }
  return range;
}

bool CompressorCombinationValid(const ccCompressor& c, std::string* why) {
  if (c.kind == ccCompressQuant && c.Get(ccParamRounding) == 2 && c.Get(ccParamMode) != ccQuantHomomorphic) {
    *why = "rounding=correlated needs mode=homomorphic (requant hops round each partial sum on its own scales)";
    return false;
  }
  if (c.kind == ccCompressRandk && c.Get(ccParamUnbiased) != 0 && c.Get(ccParamErrorFeedback) != 0) {
    // Error feedback keeps the input minus what was sent; with what is sent scaled by 1/density that is the input
    // times 1 - 1/density, a memory that grows from call to call (not a contraction). Dropping the sent chunks
    // instead, as before, counted every unit of memory 1/density times over.
    *why = "unbiased=1 needs ef=0 (error feedback cannot take back values scaled by 1/density: its memory would "
           "grow from call to call)";
    return false;
  }
  return true;
}

unsigned KindBit(int kind) {
  switch (kind) {
    case ccCompressCast16: return kCast16;
    case ccCompressQuant: return kQuant;
    case ccCompressTopkChunk: return kTopk;
    case ccCompressRandk: return kRandk;
    case ccCompressPowerSGD: return kPowerSGD;
    default: return 0;
  }
}

const char* KindName(int kind) {
  switch (kind) {
    case ccCompressCast16: return "cast16";
    case ccCompressQuant: return "quant";
    case ccCompressTopkChunk: return "topk";
    case ccCompressRandk: return "randk";
    case ccCompressPowerSGD: return "powersgd";
  }
  return "unknown";
}

const CompressorParamInfo* ParamInfoTable() { return kParams; }

const CompressorParamInfo* FindParam(int param) {
  for (const CompressorParamInfo* p = kParams; p->name; ++p) {
    if (p->param == param) return p;
  }
  return nullptr;
}

const CompressorParamInfo* FindParamByName(const std::string& name) {
  for (const CompressorParamInfo* p = kParams; p->name; ++p) {
    if (name == p->name) return p;
  }
  return nullptr;
}

std::string CompressorSpec(const ccCompressor& c) {
  std::string s = KindName(c.kind);
  char sep = ':';
  for (const CompressorParamInfo* p = kParams; p->name; ++p) {
    auto it = c.values.find(p->param);
    if (it == c.values.end()) continue;
    std::string text;
    if (const ParamWord* words = ParamWords(p->param)) {
      for (const ParamWord* w = words; w->text; ++w) {
        if (w->value == it->second) {
          text = w->text;
          break;
        }
      }
    }
    if (text.empty()) {
      if (const double scale = ParamTextScale(p->param); scale != 0.0) {
        // The shortest decimal that reads back as the same units: the call check compares these texts, so two
        // values must never print alike (with "%g", eps 1e-12 and 0.9999995e-12 both printed "1").
        char buf[40];
        for (int digits = 6; digits <= 17; ++digits) {
          std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(it->second) / scale);
          if (std::llround(std::strtod(buf, nullptr) * scale) == it->second) break;
        }
        text = buf;
      } else {
        text = std::to_string(it->second);
      }
    }
    s += sep;
    s += p->name;
    s += '=';
    s += text;
    sep = ',';
  }
  if (!c.shapes.empty()) {
    s += sep;
    s += "shapes=";
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      if (i > 0) s += '+';
      s += std::to_string(c.shapes[i].rows);
      if (c.shapes[i].cols != 1) s += "x" + std::to_string(c.shapes[i].cols);
    }
  }
  return s;
}

bool ParseShapes(const std::string& text, std::vector<TensorShape>* shapes) {
  shapes->clear();
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t plus = text.find('+', pos);
    if (plus == std::string::npos) plus = text.size();
    std::string item = text.substr(pos, plus - pos);
    // ROWS or ROWSxCOLS in decimal digits: strtoll alone would skip blanks and take a sign.
    if (item.empty() || item.find_first_not_of("0123456789x") != std::string::npos || item[0] == 'x') return false;
    size_t x = item.find('x');
    TensorShape shape;
    char* end = nullptr;
    errno = 0;
    long long rows = std::strtoll(item.c_str(), &end, 10);
    if (errno != 0 || end == item.c_str() || rows <= 0) return false;
    long long cols = 1;
    if (x != std::string::npos) {
      if (static_cast<size_t>(end - item.c_str()) != x) return false;
      const char* colText = item.c_str() + x + 1;
      cols = std::strtoll(colText, &end, 10);
      if (errno != 0 || end == colText || cols <= 0) return false;
    }
    if (*end != '\0' || rows > (1LL << 40) || cols > (1LL << 40)) return false;
    shape.rows = rows;
    shape.cols = cols;
    shapes->push_back(shape);
    pos = plus + 1;
  }
  return !shapes->empty();
}

}  // namespace ccoll
