// The codec "kernels" of compress/codec_cuda.h for the fake CUDA runtime: each one is queued on its stream and runs
// the CPU driver of the same element math there. The device codec's plumbing (copies, scratch, stream order, the
// schedule around it) is then tested without a GPU; that the real kernels write the CPU drivers' bytes is
// tests/test_gpu.cc's job on a device. Pointer arrays are copied at launch, as kernel arguments are.
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "compress/bitpack.h"
#include "compress/codec_cuda.h"
#include "compress/codecs.h"
#include "compress/quant_cpu.h"
#include "fake_launch.h"

namespace cctest {
namespace {

std::atomic<uint64_t> gLaunches{0};

ccResult_t Launch(cudaStream_t stream, std::function<void()> op) {
  gLaunches.fetch_add(1);
  FakeLaunch(stream, std::move(op));
  return ccSuccess;
}

}  // namespace

uint64_t FakeCodecKernelLaunches() { return gLaunches.load(); }

}  // namespace cctest

namespace ccoll {
namespace gpu {

using cctest::Launch;

ccResult_t RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey,
                         cudaStream_t stream) {
  return Launch(stream, [=] { ccoll::RotateForward(in, out, count, block, signKey); });
}

ccResult_t RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale, cudaStream_t stream) {
  return Launch(stream, [=] { ccoll::RotateInverse(x, count, block, signKey, scale); });
}

size_t RequantBytes(size_t len, size_t group, int bits, ScaleFormat format) {
  return ((len + group - 1) / group) * ScaleBytes(format) + PackedBytes(len, bits);
}

ccResult_t HopRequant(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                      size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                      uint16_t* codes, void* wireOut, cudaStream_t stream) {
  const void* in0 = nin > 0 ? wiresIn[0] : nullptr;
  const void* in1 = nin > 1 ? wiresIn[1] : nullptr;
  return Launch(stream, [=] {
    if (nin == 0) {
      EncodeRequantSlice(local, len, index0, group, bits, format, clipK, rule, codes, wireOut);
    } else {
      const void* in[2] = {in0, in1};
      HopRequantSlice(in, nin, local, len, index0, group, bits, format, clipK, rule, vals, codes, wireOut);
    }
  });
}

ccResult_t DecodeRequant(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, float* out,
                         cudaStream_t stream) {
  return Launch(stream, [=] {
    std::vector<uint16_t> codes(len);
    DecodeRequantSlice(wire, len, group, bits, format, codes.data(), out);
  });
}

ccResult_t CastHop(ccDataType_t wire, const void* const* wiresIn, int nin, const float* local, size_t len,
                   void* wireOut, cudaStream_t stream) {
  const void* in0 = nin > 0 ? wiresIn[0] : nullptr;
  const void* in1 = nin > 1 ? wiresIn[1] : nullptr;
  return Launch(stream, [=] {
    const void* in[2] = {in0, in1};
    MakeCast16Codec(wire, CodecCall())->Hop(in, nin, local, 0, len, wireOut);
  });
}

ccResult_t CastDecode(ccDataType_t wire, const void* in, size_t len, float* out, cudaStream_t stream) {
  return Launch(stream, [=] { MakeCast16Codec(wire, CodecCall())->DecodeGather(in, 0, len, out); });
}

ccResult_t Scale(float* x, size_t count, float factor, bool divide, cudaStream_t stream) {
  return Launch(stream, [=] {
    for (size_t i = 0; i < count; ++i) x[i] = divide ? x[i] / factor : x[i] * factor;
  });
}

}  // namespace gpu
}  // namespace ccoll
