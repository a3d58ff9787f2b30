// The 16-bit baseline codec: values travel as bf16 or fp16 (round to nearest even), every hop adds in fp32 and
// rounds once. With an f32 "wire" it is the exact identity codec the sparsifiers use for their values. On request it
// records what each of this rank's roundings took away (the sparsifiers' error feedback).
#include <cstring>
#include <type_traits>

#include "compress/codecs.h"
#include "compress/float16.h"
#include "compress/widen.h"

namespace ccoll {
namespace {

// The wire type's ccDataType_t: float32 (the identity codec), or a 16-bit type whose loops are widen.h's.
template <typename W>
constexpr ccDataType_t kWireType = std::is_same<W, float>::value ? ccFloat32
                                   : std::is_same<W, Half>::value ? ccFloat16 : ccBfloat16;

template <typename W>
class CastCodec : public Codec {
 public:
  size_t MaxWireBytes(size_t len) const override { return len * sizeof(W); }
  size_t HopBytes(size_t, size_t len) const override { return len * sizeof(W); }
  size_t GatherBytes(size_t, size_t len) const override { return len * sizeof(W); }

  // fp16 holds magnitudes up to 65504 only: for an average, each rank divides its input by nranks before the ring (as
  // NCCL's fp16 average premultiplies), so that an average that fits in fp16 stays finite where the sum would not.
  // bf16 has float32's range: its sum is divided at the end, one rounding fewer. (DeviceCastCodec does the same.)
  void PipelinePrepareAndFinish(bool average) override { divideFirst_ = average && kWireType<W> == ccFloat16; }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    if (divideFirst_) {
      const float n = static_cast<float>(nranks_);
      for (size_t i = 0; i < count; ++i) work[i] = input[i] / n;
    } else if (work != input) {
      std::memcpy(work, input, count * sizeof(float));
    }
    meta->clear();
  }

  // Sums in fp32 in a fixed order (local, then the inputs in order) and rounds once.
  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len, void* wireOut) override {
    if constexpr (kWireType<W> != ccFloat32) {
      NarrowSum(kWireType<W>, local, wiresIn, nin, len, wireOut, rounding_ != nullptr ? rounding_ + off : nullptr);
    } else {  // nothing is lost, and the sum is in float already
      float* out = static_cast<float*>(wireOut);
      const float* a = nin > 0 ? static_cast<const float*>(wiresIn[0]) : nullptr;
      const float* b = nin > 1 ? static_cast<const float*>(wiresIn[1]) : nullptr;
      for (size_t i = 0; i < len; ++i) {
        float v = local[i];
        if (nin > 0) v += a[i];
        if (nin > 1) v += b[i];
        out[i] = v;
      }
    }
    return len * sizeof(W);
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    return Hop(wiresIn, nin, local, off, len, wireOut);
  }

  void DecodeGather(const void* wire, size_t, size_t len, float* out) override {
    if constexpr (kWireType<W> != ccFloat32) {
      Widen(kWireType<W>, wire, len, out);
    } else {
      std::memmove(out, wire, len * sizeof(float));
    }
  }

  void Finish(float* work, size_t count, bool average) override {
    if (!average || divideFirst_) return;
    const float n = static_cast<float>(nranks_);
    for (size_t i = 0; i < count; ++i) work[i] /= n;
  }

  CastCodec(int nranks, float* rounding) : nranks_(nranks), rounding_(rounding) {}

 private:
  int nranks_;
  bool divideFirst_ = false;  // Prepare divided by nranks (an fp16 average), so Finish does not
  float* rounding_;  // null, or where Hop and ReduceFinal write sum - rounded sum, at each element's offset
};

}  // namespace

std::unique_ptr<Codec> MakeCast16Codec(ccDataType_t wireType, const CodecCall& call, float* rounding) {
  if (wireType == ccFloat16) return std::make_unique<CastCodec<Half>>(call.nranks, rounding);
  if (wireType == ccFloat32) return std::make_unique<CastCodec<float>>(call.nranks, nullptr);  // nothing is lost
  return std::make_unique<CastCodec<Bf16>>(call.nranks, rounding);
}

}  // namespace ccoll
