// The BufferOps of one exact schedule call (core/buffer_ops.h): for a call whose buffers are device memory that stays
// on the device (args.onDevice), the communicator's device ops (collectives/device_buffers.h); else the CPU on host
// memory, with the communicator's host scratch.
#pragma once

#include "collectives/coll_args.h"
#include "core/buffer_ops.h"

struct ccComm;

namespace ccoll {

class HostBuffers : public BufferOps {
 public:
  explicit HostBuffers(ccComm* comm) : comm_(comm) {}
  ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op) override;
  ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks) override;
  ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks) override;
  ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                                 int nranks) override;
  ccResult_t Temporary(size_t bytes, void** p) override;
  void ReleaseTemporary(void* p) override;
  ccResult_t Copy(void* dst, const void* src, size_t bytes) override;
  char* Scratch(int i) override;

 private:
  ccComm* comm_;
};

class CallBuffers {
 public:
  CallBuffers(ccComm* comm, const CollArgs& a);
  BufferOps* operator->() { return ops_; }
  BufferOps* get() { return ops_; }

 private:
  HostBuffers host_;
  BufferOps* ops_;
};

// A one-rank communicator's reduction of count elements (all-reduce, reduce, reduce-scatter): its input, through the
// type's rules for results (ccoll.h): a 16-bit float NaN becomes the type's one quiet NaN whatever the op, and so does
// a float32 or float64 NaN under max and min, as with more ranks; an average divides by 1.
ccResult_t OneRankReduction(CallBuffers& mem, const CollArgs& a, size_t count);

}  // namespace ccoll
