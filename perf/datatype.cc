#include "datatype.h"

#include <algorithm>
#include <cctype>

namespace ccperf {
namespace {

const DTypeInfo kTypes[] = {
    {DType::kFloat32, "float", 4, true, 0x1p-24, 0x1p-149},
    {DType::kFloat16, "half", 2, true, 0x1p-11, 0x1p-24},
    {DType::kBfloat16, "bfloat16", 2, true, 0x1p-8, 0x1p-133},
    {DType::kFloat64, "double", 8, true, 0x1p-53, 0x1p-1074},
    {DType::kInt32, "int32", 4, false, 0, 0},
    {DType::kInt64, "int64", 8, false, 0, 0},
    {DType::kInt8, "int8", 1, false, 0, 0},
    {DType::kUint8, "uint8", 1, false, 0, 0},
    {DType::kUint32, "uint32", 4, false, 0, 0},
    {DType::kUint64, "uint64", 8, false, 0, 0},
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const DTypeInfo& Info(DType t) {
  for (const DTypeInfo& i : kTypes) {
    if (i.type == t) return i;
  }
  return kTypes[0];
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kSum: return "sum";
    case Op::kProd: return "prod";
    case Op::kMax: return "max";
    case Op::kMin: return "min";
    case Op::kAvg: return "avg";
  }
  return "?";
}

bool ParseDType(const std::string& text, DType* out) {
  const std::string s = Lower(text);
  struct Alias {
    const char* name;
    DType type;
  };
  static const Alias kAliases[] = {
      {"float", DType::kFloat32},    {"float32", DType::kFloat32}, {"fp32", DType::kFloat32},
      {"f32", DType::kFloat32},      {"half", DType::kFloat16},    {"float16", DType::kFloat16},
      {"fp16", DType::kFloat16},     {"f16", DType::kFloat16},     {"bfloat16", DType::kBfloat16},
      {"bf16", DType::kBfloat16},    {"double", DType::kFloat64},  {"float64", DType::kFloat64},
      {"fp64", DType::kFloat64},     {"f64", DType::kFloat64},     {"int32", DType::kInt32},
      {"int", DType::kInt32},        {"int64", DType::kInt64},     {"int8", DType::kInt8},
      {"char", DType::kInt8},        {"uint8", DType::kUint8},     {"uint32", DType::kUint32},
      {"uint64", DType::kUint64},
  };
  for (const Alias& a : kAliases) {
    if (s == a.name) {
      *out = a.type;
      return true;
    }
  }
  return false;
}

bool ParseOp(const std::string& text, Op* out) {
  const std::string s = Lower(text);
  for (Op op : {Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg}) {
    if (s == OpName(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

}  // namespace ccperf
