// The one switch from ccDataType_t to a storage type (see DispatchType in reduce.h).
#pragma once

#include <cstdint>

#include "compress/float16.h"

namespace ccoll {

template <typename Fn>
void DispatchType(ccDataType_t dtype, Fn&& fn) {
  switch (dtype) {
    case ccInt32: fn(int32_t{}); break;
    case ccInt64: fn(int64_t{}); break;
    case ccFloat16: fn(Half{}); break;
    case ccFloat32: fn(float{}); break;
    case ccFloat64: fn(double{}); break;
    case ccBfloat16: fn(Bf16{}); break;
  }
}

}  // namespace ccoll
