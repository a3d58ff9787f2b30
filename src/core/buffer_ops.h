// How an exact schedule touches the memory of one call: its reductions, the final division of an average, its
// copies and its two scratch slots. Host calls use the CPU on host memory (HostBuffers, collectives/buffers.h); a call on
// device buffers that stays on the device uses kernels and copies on a stream of the communicator's
// (collectives/device_buffers.h). Every method returns once its result is in place, so that the schedule can send it.
#pragma once

#include <cstddef>

#include "ccoll.h"

namespace ccoll {

class BufferOps {
 public:
  virtual ~BufferOps() = default;
  // dst[i] = op(a[i], b[i]); dst may be a or b. ccAvg reduces as a sum (collectives/average.h).
  virtual ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype,
                            ccRedOp_t op) = 0;
  // buf[i] /= nranks: the end of a ccAvg of integers.
  virtual ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks) = 0;
  // dst[i] = src[i] * (1 / nranks), rounded to dtype (a floating-point type; reduce_op.h's AverageFactor): the
  // start of a ccAvg of floats. dst may be src; other overlaps are not allowed.
  virtual ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks) = 0;
  // dst[i] = own[i] * (1 / nranks) + other[i] (the factor as Premultiply's, then one step of the sum: for 16-bit types
  // in float, rounded once): a premultiplied ccAvg's sum of this rank's input and a partial sum. dst may be own or
  // other.
  virtual ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count,
                                         ccDataType_t dtype, int nranks) = 0;
  // Memory of the call's kind (host or device) for `bytes`, until ReleaseTemporary(*p).
  virtual ccResult_t Temporary(size_t bytes, void** p) = 0;
  virtual void ReleaseTemporary(void* p) = 0;
  // Copies bytes from src to dst; nothing when they are the same buffer. Other overlaps are not allowed.
  virtual ccResult_t Copy(void* dst, const void* src, size_t bytes) = 0;
  // Scratch slot i (of ccComm::kScratchSlots), sliceBytes long, in the same kind of memory as the call's buffers.
  virtual char* Scratch(int i) = 0;
};

}  // namespace ccoll
