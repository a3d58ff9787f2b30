// Host loops of the exact reductions, dispatched once per call from (datatype, op) to a typed template.
#pragma once

#include <cstddef>

#include "ccoll.h"

namespace ccoll {

// dst[i] = op(a[i], b[i]) for i < count. dst may be a or b (in place); other overlaps are not allowed.
// ccAvg reduces as a sum here; FinishAvg divides once at the end.
void ReduceHost(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op);

// buf[i] = buf[i] / nranks: the last step of ccAvg of integers, done by the rank that owns the finished sum so every
// rank gets the same bits.
void FinishAvgHost(void* buf, size_t count, ccDataType_t dtype, int nranks);
// dst[i] = src[i] * (1 / nranks) in dtype, a floating-point type (AverageFactor): a rank's input to a ccAvg of
// floats (collectives/average.h). dst may be src.
void PremultiplyHost(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks);
// dst[i] = own[i] * (1 / nranks) + other[i] in dtype, a floating-point type: the factor rounded to dtype as in
// PremultiplyHost, the product and the sum computed as one step of ReduceHost's sum (for 16-bit types in float,
// rounded to dtype once). dst may be own or other.
void ReducePremultipliedHost(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                             int nranks);
// ccFloat16, ccBfloat16, ccFloat32 and ccFloat64.
bool IsFloatType(ccDataType_t dtype);

// Size in bytes of one element; 0 for an unknown datatype.
size_t DataTypeSize(ccDataType_t dtype);
const char* DataTypeName(ccDataType_t dtype);
const char* RedOpName(ccRedOp_t op);
// Validation of raw integers from the C API (before they are treated as the enums).
bool IsValidRedOp(int op);
bool IsValidDataType(int dtype);
// ccSuccess for a valid datatype, else ccInvalidArgument with a sentence for `fn` on `rank`: that its caller refused
// the call (CC_DATATYPE_REFUSED) or that the datatype is not one ccoll supports.
ccResult_t CheckDataType(const char* fn, int dtype, int rank);

// Calls fn(T{}) with T the storage type of dtype. dtype must be valid.
template <typename Fn>
void DispatchType(ccDataType_t dtype, Fn&& fn);
// Calls fn(Op{}) with Op the operator functor of op (reduce_op.h; OpSum for ccAvg). op must be valid.
template <typename Fn>
void DispatchOp(ccRedOp_t op, Fn&& fn);

}  // namespace ccoll

#include "collectives/reduce_dispatch.h"
