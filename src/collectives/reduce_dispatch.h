// The one switch from ccDataType_t to a storage type, and the one from ccRedOp_t to an operator (see DispatchType
// and DispatchOp in reduce.h): the host loops and the CUDA kernels both dispatch through them.
#pragma once

#include <cstdint>

#include "collectives/reduce_op.h"
#include "compress/float16.h"

namespace ccoll {

template <typename Fn>
void DispatchType(ccDataType_t dtype, Fn&& fn) {
  switch (dtype) {
    case ccInt8: fn(int8_t{}); break;
    case ccUint8: fn(uint8_t{}); break;
    case ccInt32: fn(int32_t{}); break;
    case ccUint32: fn(uint32_t{}); break;
    case ccInt64: fn(int64_t{}); break;
    case ccUint64: fn(uint64_t{}); break;
    case ccFloat16: fn(Half{}); break;
    case ccFloat32: fn(float{}); break;
    case ccFloat64: fn(double{}); break;
    case ccBfloat16: fn(Bf16{}); break;
  }
}

template <typename Fn>
void DispatchOp(ccRedOp_t op, Fn&& fn) {
  switch (op) {
    case ccSum:
    case ccAvg: fn(OpSum()); break;  // an average is a sum until FinishAvg divides it
    case ccProd: fn(OpProd()); break;
    case ccMax: fn(OpMax()); break;
    case ccMin: fn(OpMin()); break;
  }
}

}  // namespace ccoll
