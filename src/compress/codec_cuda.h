// CUDA drivers of the codecs' element math (the same __host__ __device__ functions as the CPU drivers in
// quant_cpu.h and cast16.cc, built without FMA contraction), so that a GPU encode writes the same bytes as the CPU
// encode of the same input. Every pointer is device memory; work is queued on `stream` and nothing waits for it.
// Only built with CCOLL_ENABLE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ccoll.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"

namespace ccoll {
namespace gpu {

// The rotation of quant_cpu.h's RotateForward / RotateInverse (one thread block per rotation block, the block held
// in shared memory; block <= 16384).
ccResult_t RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey,
                         cudaStream_t stream);
ccResult_t RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale, cudaStream_t stream);

// Bytes of a requant message of len values.
size_t RequantBytes(size_t len, size_t group, int bits, ScaleFormat format);

// EncodeRequantSlice: per group a scale, then the packed codes. One thread per group; when a group's codes end on a
// byte boundary (group * bits % 8 == 0) it packs them itself, otherwise `codes` (len values of scratch) holds them
// for a packing pass. The message has RequantBytes(len, group, bits, format) bytes.
ccResult_t EncodeRequant(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                         float clipK, const DitherRule& rule, uint16_t* codes, void* wireOut, cudaStream_t stream);
ccResult_t DecodeRequant(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, float* out,
                         cudaStream_t stream);
// The requant hop, fused: decode the nin (0..2) arriving messages, add them to `local` (local first, then the
// messages in order, in fp32), and encode the sum with fresh scales. vals: len floats of scratch.
ccResult_t HopRequant(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                      size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                      uint16_t* codes, void* wireOut, cudaStream_t stream);

// The 16-bit cast codec (wire ccBfloat16 or ccFloat16): out = round(local + in[0] + in[1]) (nin 0..2), and decode.
ccResult_t CastHop(ccDataType_t wire, const void* const* wiresIn, int nin, const float* local, size_t len,
                   void* wireOut, cudaStream_t stream);
ccResult_t CastDecode(ccDataType_t wire, const void* in, size_t len, float* out, cudaStream_t stream);

// x[i] = x[i] / factor (divide) or x[i] * factor: the average of the codecs without rotation, as their CPU Finish
// computes it.
ccResult_t Scale(float* x, size_t count, float factor, bool divide, cudaStream_t stream);

}  // namespace gpu
}  // namespace ccoll
