#include "collectives/buffers.h"

#include <cstdlib>
#include <cstring>

#include "collectives/reduce.h"
#include "core/comm.h"
#include "core/error.h"

namespace ccoll {

ccResult_t HostBuffers::Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype,
                               ccRedOp_t op) {
  ReduceHost(dst, a, b, count, dtype, op);
  return ccSuccess;
}

ccResult_t HostBuffers::FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks) {
  FinishAvgHost(buf, count, dtype, nranks);
  return ccSuccess;
}

ccResult_t HostBuffers::Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks) {
  PremultiplyHost(dst, src, count, dtype, nranks);
  return ccSuccess;
}

ccResult_t HostBuffers::ReducePremultiplied(void* dst, const void* own, const void* other, size_t count,
                                            ccDataType_t dtype, int nranks) {
  ReducePremultipliedHost(dst, own, other, count, dtype, nranks);
  return ccSuccess;
}

ccResult_t HostBuffers::Temporary(size_t bytes, void** p) {
  *p = std::malloc(bytes > 0 ? bytes : 1);
  if (*p == nullptr) return Fail(ccSystemError, "rank %d: out of host memory for %zu bytes", comm_->rank, bytes);
  return ccSuccess;
}

void HostBuffers::ReleaseTemporary(void* p) { std::free(p); }

ccResult_t HostBuffers::Copy(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
  return ccSuccess;
}

char* HostBuffers::Scratch(int i) { return comm_->ScratchSlot(i); }

// Every caller that runs an exact schedule with onDevice made the device ops first (EnsureDeviceBuffers in
// collectives/device_buffers.h).
CallBuffers::CallBuffers(ccComm* comm, const CollArgs& a)
    : host_(comm), ops_(a.onDevice ? comm->deviceBuffers.get() : static_cast<BufferOps*>(&host_)) {}

ccResult_t OneRankReduction(CallBuffers& mem, const CollArgs& a, size_t count) {
  const bool half = a.dtype == ccFloat16 || a.dtype == ccBfloat16;
  const bool extremum = (a.op == ccMax || a.op == ccMin) && IsFloatType(a.dtype);
  if (count > 0 && (half || extremum)) {
    // x max x is x, bit for bit (-0 included), and NaN is the one quiet NaN: the reductions' own rules.
    CC_CHECK(mem->Reduce(a.recv, a.send, a.send, count, a.dtype, ccMax));
  } else {
    CC_CHECK(mem->Copy(a.recv, a.send, count * a.eltSize));
  }
  if (a.op == ccAvg) CC_CHECK(mem->FinishAvg(a.recv, count, a.dtype, 1));
  return ccSuccess;
}

}  // namespace ccoll
