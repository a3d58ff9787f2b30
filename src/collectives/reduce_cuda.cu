// The exact reductions on the GPU (reduce_cuda.h): a grid-stride loop per (datatype, operator), each element through
// the same Arith load/store and operator functors as the host loops in reduce.cc.
#include <cuda_runtime.h>

#include <type_traits>

#include "collectives/reduce.h"
#include "collectives/reduce_cuda.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // enough to fill an H200 several times over; the loop covers the rest

unsigned Blocks(size_t count) {
  const size_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

template <typename T, typename Op>
__global__ void ReduceKernel(T* dst, const T* a, const T* b, size_t count, Op op) {
  using A = Arith<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = A::Store(op(A::Load(a[i]), A::Load(b[i])));
  }
}

template <typename T>
__global__ void FinishAvgKernel(T* buf, size_t count, int nranks) {
  using A = Arith<T>;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    buf[i] = A::Store(DivideByRanks(A::Load(buf[i]), nranks));
  }
}

template <typename T>
__global__ void PremultiplyKernel(T* dst, const T* src, size_t count, int nranks) {
  using A = Arith<T>;
  const auto factor = AverageFactor<T>(nranks);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = A::Store(A::Load(src[i]) * factor);
  }
}

template <typename T>
__global__ void ReducePremultipliedKernel(T* dst, const T* own, const T* other, size_t count, int nranks) {
  using A = Arith<T>;
  const auto factor = AverageFactor<T>(nranks);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = A::Store(OpSum()(A::Load(own[i]) * factor, A::Load(other[i])));
  }
}

template <typename T, typename Op>
void LaunchReduce(void* dst, const void* a, const void* b, size_t count, Op op, cudaStream_t stream) {
  ReduceKernel<T, Op><<<Blocks(count), kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                              static_cast<const T*>(b), count, op);
}

}  // namespace

ccResult_t LoadReduceKernels() {
  const ccDataType_t types[] = {ccInt8,    ccUint8,   ccInt32,   ccUint32,  ccInt64,
                                ccUint64,  ccFloat16, ccFloat32, ccFloat64, ccBfloat16};
  const ccRedOp_t ops[] = {ccSum, ccProd, ccMax, ccMin};  // (ccAvg is ccSum's kernel)
  ccResult_t r = ccSuccess;
  for (ccDataType_t dtype : types) {
    DispatchType(dtype, [&](auto tag) {
      using T = decltype(tag);
      for (ccRedOp_t op : ops) {
        DispatchOp(op, [&](auto fn) {
          if (r == ccSuccess) r = LoadKernel(ReduceKernel<T, decltype(fn)>, "loading ReduceKernel");
        });
      }
      if (r == ccSuccess) r = LoadKernel(FinishAvgKernel<T>, "loading FinishAvgKernel");
      if constexpr (!std::is_integral<T>::value) {
        if (r == ccSuccess) r = LoadKernel(PremultiplyKernel<T>, "loading PremultiplyKernel");
        if (r == ccSuccess) r = LoadKernel(ReducePremultipliedKernel<T>, "loading ReducePremultipliedKernel");
      }
    });
  }
  return r;
}

ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op,
                  cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    DispatchOp(op, [&](auto fn) { LaunchReduce<T>(dst, a, b, count, fn, stream); });
  });
  return Launched("reduction kernel launch");
}

ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    FinishAvgKernel<T><<<Blocks(count), kThreads, 0, stream>>>(static_cast<T*>(buf), count, nranks);
  });
  return Launched("average kernel launch");
}

ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral<T>::value) {
      PremultiplyKernel<T><<<Blocks(count), kThreads, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src),
                                                                   count, nranks);
    }
  });
  return Launched("average premultiply kernel launch");
}

ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                               int nranks, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DispatchType(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral<T>::value) {
      ReducePremultipliedKernel<T><<<Blocks(count), kThreads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(own), static_cast<const T*>(other), count, nranks);
    }
  });
  return Launched("average reduction kernel launch");
}

}  // namespace gpu
}  // namespace ccoll
