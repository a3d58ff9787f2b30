// [gpu] The CUDA codec kernels against the CPU drivers, byte for byte: the rotation (forward and inverse, counts
// with tails, every block size), the requant encode (bits 1..8, aligned and unaligned groups, every scale format and
// rounding rule, clipping), its decode, the fused hop with one and two arriving messages, and the 16-bit cast hop
// and decode, on inputs with outliers, zeros, denormals, NaN and Inf. Without a CUDA device the binary exits 77 and
// ctest reports the cases as skipped (this machine and CI have none; perf/gpu_check.sh runs them on one).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compress/codec_cuda.h"
#include "compress/float16.h"
#include "compress/quant_cpu.h"
#include "gpu_skip.h"

namespace {

// A device buffer of T, freed with the object.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    void* raw = nullptr;
    REQUIRE(cudaMalloc(&raw, (count ? count : 1) * sizeof(T)) == cudaSuccess);
    p = static_cast<T*>(raw);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void Put(const std::vector<T>& v) {
    REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> Get() const {
    std::vector<T> v(n);
    REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  }
};

// Gaussian values with a few outliers, zeros, denormals and (optionally) non-finite values.
std::vector<float> Inputs(size_t n, uint64_t seed, bool nonFinite) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v) x = normal(gen);
  for (size_t i = 0; i < n; i += 97) v[i] *= 1000.0f;
  for (size_t i = 5; i < n; i += 131) v[i] = 0.0f;
  for (size_t i = 11; i < n; i += 173) v[i] = 1e-40f;
  if (nonFinite && n > 40) {
    v[n / 3] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = std::numeric_limits<float>::infinity();
  }
  return v;
}

bool SameBytes(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

}  // namespace

TEST_CASE("[gpu] rotation: the kernels equal the CPU driver byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (size_t block : {size_t{64}, size_t{1024}, size_t{16384}}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{4099}, size_t{(1 << 18) + 5}}) {
      INFO("block " << block << " count " << count);
      const std::vector<float> in = Inputs(count, count + block, false);
      std::vector<float> cpu(count);
      ccoll::RotateForward(in.data(), cpu.data(), count, block, 0x1234u);
      Dev<float> din(count), dout(count);
      din.Put(in);
      REQUIRE(ccoll::gpu::RotateForward(din.p, dout.p, count, block, 0x1234u, nullptr) == ccSuccess);
      std::vector<float> gpu = dout.Get();
      CHECK(SameBytes(cpu.data(), gpu.data(), count * sizeof(float)));
      ccoll::RotateInverse(cpu.data(), count, block, 0x1234u, 0.25f);
      REQUIRE(ccoll::gpu::RotateInverse(dout.p, count, block, 0x1234u, 0.25f, nullptr) == ccSuccess);
      gpu = dout.Get();
      CHECK(SameBytes(cpu.data(), gpu.data(), count * sizeof(float)));
    }
  }
}

TEST_CASE("[gpu] requant encode, decode and hop: the kernels equal the CPU driver byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  using ccoll::ScaleFormat;
  for (size_t len : {size_t{1}, size_t{33}, size_t{1000}, size_t{65536 + 7}}) {
    for (size_t group : {size_t{32}, size_t{7}, size_t{1024}}) {
      for (int bits : {1, 2, 3, 4, 6, 8}) {
        for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kBf16, ScaleFormat::kFp16}) {
          for (int rounding : {0, 1, 2}) {
            for (float clipK : {0.0f, 2.5f}) {
              INFO("len " << len << " group " << group << " bits " << bits << " format " << static_cast<int>(format)
                          << " rounding " << rounding << " clipK " << clipK);
              ccoll::DitherRule rule;
              rule.rounding = rounding;
              rule.key = 77;
              rule.sharedKey = 99;
              rule.rank = 1;
              rule.nranks = 3;
              // Odd (dithers start at the high half of a word), even, and a slice that crosses 2^32 elements.
              const uint64_t index0 = (len + bits) % 3 == 0 ? 12345 : (len + bits) % 3 == 1 ? 12346
                                                                                                : (1ull << 32) - 100;
              const std::vector<float> local = Inputs(len, len * 31 + bits, len > 100 && clipK == 0.0f);
              const size_t bytes = ccoll::gpu::RequantBytes(len, group, bits, format);
              std::vector<uint16_t> codes(len);
              std::vector<uint8_t> cpuMsg(bytes), cpuHop(bytes);
              REQUIRE(ccoll::EncodeRequantSlice(local.data(), len, index0, group, bits, format, clipK, rule,
                                                codes.data(), cpuMsg.data()) == bytes);
              Dev<float> dLocal(len), dVals(len), dOut(len);
              Dev<uint16_t> dCodes(len);
              Dev<uint8_t> dMsg(bytes), dMsg2(bytes), dHop(bytes);
              dLocal.Put(local);
              REQUIRE(ccoll::gpu::EncodeRequant(dLocal.p, len, index0, group, bits, format, clipK, rule, dCodes.p,
                                                dMsg.p, nullptr) == ccSuccess);
              std::vector<uint8_t> gpuMsg = dMsg.Get();
              CHECK(SameBytes(cpuMsg.data(), gpuMsg.data(), bytes));
              // Decode.
              std::vector<float> cpuOut(len);
              ccoll::DecodeRequantSlice(cpuMsg.data(), len, group, bits, format, codes.data(), cpuOut.data());
              dMsg.Put(cpuMsg);
              REQUIRE(ccoll::gpu::DecodeRequant(dMsg.p, len, group, bits, format, dOut.p, nullptr) == ccSuccess);
              std::vector<float> gpuOut = dOut.Get();
              CHECK(SameBytes(cpuOut.data(), gpuOut.data(), len * sizeof(float)));
              // Hop with one arriving message: local + decode(msg), re-encoded (the CPU codec's SumIn order).
              std::vector<float> sum(len);
              for (size_t j = 0; j < len; ++j) sum[j] = local[j] + cpuOut[j];
              ccoll::EncodeRequantSlice(sum.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuHop.data());
              const void* in[1] = {dMsg.p};
              REQUIRE(ccoll::gpu::HopRequant(in, 1, dLocal.p, len, index0, group, bits, format, clipK, rule, dVals.p,
                                             dCodes.p, dHop.p, nullptr) == ccSuccess);
              std::vector<uint8_t> gpuHop = dHop.Get();
              CHECK(SameBytes(cpuHop.data(), gpuHop.data(), bytes));
              // Two different arriving messages (a tree node): local + decode(a) + decode(b), in that order.
              std::vector<uint8_t> cpuMsg2(bytes);
              const std::vector<float> other = Inputs(len, len * 7 + 3, false);
              ccoll::EncodeRequantSlice(other.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuMsg2.data());
              std::vector<float> cpuOut2(len);
              ccoll::DecodeRequantSlice(cpuMsg2.data(), len, group, bits, format, codes.data(), cpuOut2.data());
              for (size_t j = 0; j < len; ++j) sum[j] = sum[j] + cpuOut2[j];
              ccoll::EncodeRequantSlice(sum.data(), len, index0, group, bits, format, clipK, rule, codes.data(),
                                        cpuHop.data());
              dMsg2.Put(cpuMsg2);
              const void* in2[2] = {dMsg.p, dMsg2.p};
              REQUIRE(ccoll::gpu::HopRequant(in2, 2, dLocal.p, len, index0, group, bits, format, clipK, rule,
                                             dVals.p, dCodes.p, dHop.p, nullptr) == ccSuccess);
              gpuHop = dHop.Get();
              CHECK(SameBytes(cpuHop.data(), gpuHop.data(), bytes));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("[gpu] 16-bit cast hop and decode: the kernels equal the CPU codec byte for byte", "[gpu]") {
  SKIP_WITHOUT_DEVICE();
  for (ccDataType_t wire : {ccBfloat16, ccFloat16}) {
    const size_t len = 100003;
    const std::vector<float> local = Inputs(len, 5, true), other = Inputs(len, 6, false);
    const std::vector<float> third = Inputs(len, 7, false);
    std::vector<uint16_t> msg(len), msg2(len), cpu(len);
    for (size_t i = 0; i < len; ++i) {
      msg[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(other[i]).bits : ccoll::FloatToHalf(other[i]).bits;
      msg2[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(third[i]).bits : ccoll::FloatToHalf(third[i]).bits;
    }
    for (int nin : {0, 1, 2}) {
      INFO((wire == ccBfloat16 ? "bf16" : "fp16") << " nin " << nin);
      for (size_t i = 0; i < len; ++i) {
        auto load = [&](uint16_t b) {
          return wire == ccBfloat16 ? ccoll::Bf16ToFloat(ccoll::Bf16{b}) : ccoll::HalfToFloat(ccoll::Half{b});
        };
        float x = local[i];
        if (nin == 1) x = local[i] + load(msg[i]);
        if (nin == 2) x = local[i] + load(msg[i]) + load(msg2[i]);
        cpu[i] = wire == ccBfloat16 ? ccoll::FloatToBf16(x).bits : ccoll::FloatToHalf(x).bits;
      }
      Dev<float> dLocal(len), dOut(len);
      Dev<uint16_t> dMsg(len), dMsg2(len), dHop(len);
      dLocal.Put(local);
      dMsg.Put(msg);
      dMsg2.Put(msg2);
      const void* in[2] = {dMsg.p, dMsg2.p};
      REQUIRE(ccoll::gpu::CastHop(wire, in, nin, dLocal.p, len, dHop.p, nullptr) == ccSuccess);
      std::vector<uint16_t> gpu = dHop.Get();
      CHECK(SameBytes(cpu.data(), gpu.data(), len * 2));
      REQUIRE(ccoll::gpu::CastDecode(wire, dMsg.p, len, dOut.p, nullptr) == ccSuccess);
      std::vector<float> decoded = dOut.Get();
      size_t same = 0;
      for (size_t i = 0; i < len; ++i) {
        const float want = wire == ccBfloat16 ? ccoll::Bf16ToFloat(ccoll::Bf16{msg[i]})
                                              : ccoll::HalfToFloat(ccoll::Half{msg[i]});
        same += std::memcmp(&want, &decoded[i], 4) == 0 ? 1 : 0;
      }
      CHECK(same == len);
    }
  }
}
