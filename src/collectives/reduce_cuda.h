// CUDA kernels of the exact reductions: the functors of reduce_op.h, so a device reduction writes the bytes ReduceHost,
// FinishAvgHost and PremultiplyHost write for the same inputs (finite ones: a GPU's NaN may carry another payload). Launched on
// `stream`; a failed launch is ccUnhandledCudaError. Only built with CCOLL_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ccoll.h"

namespace ccoll {
namespace gpu {

// dst[i] = op(a[i], b[i]) for i < count; dst may be a or b. ccAvg reduces as a sum.
ccResult_t Reduce(void* dst, const void* a, const void* b, size_t count, ccDataType_t dtype, ccRedOp_t op,
                  cudaStream_t stream);
// buf[i] = buf[i] / nranks (ccAvg of integers).
ccResult_t FinishAvg(void* buf, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream);
// dst[i] = src[i] * (1 / nranks) in dtype, a floating-point type (ccAvg of floats; PremultiplyHost). dst may be src.
ccResult_t Premultiply(void* dst, const void* src, size_t count, ccDataType_t dtype, int nranks, cudaStream_t stream);
// dst[i] = own[i] premultiplied + other[i] (ReducePremultipliedHost). dst may be own or other.
ccResult_t ReducePremultiplied(void* dst, const void* own, const void* other, size_t count, ccDataType_t dtype,
                               int nranks, cudaStream_t stream);

// Loads every kernel of this file into the current device's context (core/cuda_result.h: LoadKernel).
ccResult_t LoadReduceKernels();

}  // namespace gpu
}  // namespace ccoll
