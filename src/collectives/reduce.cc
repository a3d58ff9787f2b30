#include "collectives/reduce.h"

#include <type_traits>

#include "collectives/reduce_op.h"
#include "compress/cpu_clones.h"
#include "core/error.h"

namespace ccoll {
namespace {

template <typename T, typename Op>
void ReduceLoop(T* dst, const T* a, const T* b, size_t count, Op op) {
  using A = Arith<T>;
  for (size_t i = 0; i < count; ++i) dst[i] = A::Store(op(A::Load(a[i]), A::Load(b[i])));
}

}  // namespace

CC_HOT CC_FLATTEN void ReduceHost(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype,
                                  ccRedOp_t op) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto fn) {
      ReduceLoop(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, fn);
    });
  });
}

CC_HOT CC_FLATTEN void FinishAvgHost(void* buf, size_t count, ccDataType_t dtype, int nranks) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = Arith<T>;
    T* p = static_cast<T*>(buf);
    for (size_t i = 0; i < count; ++i) p[i] = A::Store(DivideByRanks(A::Load(p[i]), nranks));
  });
}

CC_HOT CC_FLATTEN void PremultiplyHost(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral<T>::value) {
      using A = Arith<T>;
      const T* in = static_cast<const T*>(src);
      T* out = static_cast<T*>(dst);
      const auto factor = AverageFactor<T>(nranks);
      for (size_t i = 0; i < count; ++i) out[i] = A::Store(A::Load(in[i]) * factor);
    }
  });
}

CC_HOT CC_FLATTEN void ReducePremultipliedHost(void* dst, const void* own, const void* other, size_t count,
                                               ccDataType_t dtype, int nranks) {
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral<T>::value) {
      using A = Arith<T>;
      const T* mine = static_cast<const T*>(own);
      const T* rest = static_cast<const T*>(other);
      T* out = static_cast<T*>(dst);
      const auto factor = AverageFactor<T>(nranks);
      for (size_t i = 0; i < count; ++i) out[i] = A::Store(OpSum()(A::Load(mine[i]) * factor, A::Load(rest[i])));
    }
  });
}

bool IsFloatType(ccDataType_t dtype) {
  return dtype == ccFloat16 || dtype == ccBfloat16 || dtype == ccFloat32 || dtype == ccFloat64;
}

size_t DataTypeSize(ccDataType_t dtype) {
  switch (dtype) {
    case ccInt8: return 1;
    case ccUint8: return 1;
    case ccInt32: return 4;
    case ccUint32: return 4;
    case ccInt64: return 8;
    case ccUint64: return 8;
    case ccFloat16: return 2;
    case ccFloat32: return 4;
    case ccFloat64: return 8;
    case ccBfloat16: return 2;
  }
  return 0;
}

const char* DataTypeName(ccDataType_t dtype) {
  switch (dtype) {
    case ccInt8: return "int8";
    case ccUint8: return "uint8";
    case ccInt32: return "int32";
    case ccUint32: return "uint32";
    case ccInt64: return "int64";
    case ccUint64: return "uint64";
    case ccFloat16: return "float16";
    case ccFloat32: return "float32";
    case ccFloat64: return "float64";
    case ccBfloat16: return "bfloat16";
  }
  return "unknown";
}

const char* RedOpName(ccRedOp_t op) {
  switch (op) {
    case ccSum: return "sum";
    case ccProd: return "prod";
    case ccMax: return "max";
    case ccMin: return "min";
    case ccAvg: return "avg";
  }
  return "unknown";
}

bool IsValidRedOp(int op) { return op >= ccSum && op <= ccAvg; }

bool IsValidDataType(int dtype) {
  switch (dtype) {
    case ccInt8:
    case ccUint8:
    case ccInt32:
    case ccUint32:
    case ccInt64:
    case ccUint64:
    case ccFloat16:
    case ccFloat32:
    case ccFloat64:
    case ccBfloat16: return true;
    default: return false;
  }
}

ccResult_t CheckDataType(const char* fn, int dtype, int rank) {
  if (dtype == static_cast<int>(CC_DATATYPE_REFUSED)) {
    return Fail(ccInvalidArgument, "%s: refused by its caller on rank %d (datatype CC_DATATYPE_REFUSED)", fn, rank);
  }
  if (!IsValidDataType(dtype)) {
    return Fail(ccInvalidArgument, "%s: datatype %d is not a ccDataType_t supported by ccoll (rank %d)", fn, dtype,
                rank);
  }
  return ccSuccess;
}

}  // namespace ccoll
