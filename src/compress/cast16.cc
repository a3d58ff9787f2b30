// The 16-bit baseline codec: values travel as bf16 or fp16 (round to nearest even), every hop adds in fp32 and
// rounds once. With an f32 "wire" it is the exact identity codec the sparsifiers use for their values. On request it
// records what each of this rank's roundings took away (the sparsifiers' error feedback).
#include <cstring>

#include "compress/codecs.h"
#include "compress/float16.h"

namespace ccoll {
namespace {

template <typename W>
struct Wire;
template <>
struct Wire<Bf16> {
  static float Load(Bf16 v) { return Bf16ToFloat(v); }
  static Bf16 Store(float v) { return FloatToBf16(v); }
};
template <>
struct Wire<Half> {
  static float Load(Half v) { return HalfToFloat(v); }
  static Half Store(float v) { return FloatToHalf(v); }
};
template <>
struct Wire<float> {
  static float Load(float v) { return v; }
  static float Store(float v) { return v; }
};

template <typename W>
class CastCodec : public Codec {
 public:
  size_t MaxWireBytes(size_t len) const override { return len * sizeof(W); }
  size_t HopBytes(size_t, size_t len) const override { return len * sizeof(W); }
  size_t GatherBytes(size_t, size_t len) const override { return len * sizeof(W); }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    if (work != input) std::memcpy(work, input, count * sizeof(float));
    meta->clear();
  }

  // Sums in fp32 in a fixed order (local, then the inputs in order) and rounds once.
  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len, void* wireOut) override {
    W* out = static_cast<W*>(wireOut);
    const W* a = nin > 0 ? static_cast<const W*>(wiresIn[0]) : nullptr;
    const W* b = nin > 1 ? static_cast<const W*>(wiresIn[1]) : nullptr;
    if (rounding_ != nullptr) {
      float* lost = rounding_ + off;
      for (size_t i = 0; i < len; ++i) {
        float v = local[i];
        if (nin > 0) v += Wire<W>::Load(a[i]);
        if (nin > 1) v += Wire<W>::Load(b[i]);
        out[i] = Wire<W>::Store(v);
        lost[i] = v - Wire<W>::Load(out[i]);  // exact: a float minus its own 16-bit rounding
      }
    } else if (nin == 0) {
      for (size_t i = 0; i < len; ++i) out[i] = Wire<W>::Store(local[i]);
    } else if (nin == 1) {
      for (size_t i = 0; i < len; ++i) out[i] = Wire<W>::Store(local[i] + Wire<W>::Load(a[i]));
    } else {
      for (size_t i = 0; i < len; ++i) out[i] = Wire<W>::Store(local[i] + Wire<W>::Load(a[i]) + Wire<W>::Load(b[i]));
    }
    return len * sizeof(W);
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    return Hop(wiresIn, nin, local, off, len, wireOut);
  }

  void DecodeGather(const void* wire, size_t, size_t len, float* out) override {
    const W* in = static_cast<const W*>(wire);
    for (size_t i = 0; i < len; ++i) out[i] = Wire<W>::Load(in[i]);
  }

  void Finish(float* work, size_t count, bool average) override {
    if (!average) return;
    const float n = static_cast<float>(nranks_);
    for (size_t i = 0; i < count; ++i) work[i] /= n;
  }

  CastCodec(int nranks, float* rounding) : nranks_(nranks), rounding_(rounding) {}

 private:
  int nranks_;
  float* rounding_;  // null, or where Hop and ReduceFinal write sum - rounded sum, at each element's offset
};

}  // namespace

std::unique_ptr<Codec> MakeCast16Codec(ccDataType_t wireType, const CodecCall& call, float* rounding) {
  if (wireType == ccFloat16) return std::make_unique<CastCodec<Half>>(call.nranks, rounding);
  if (wireType == ccFloat32) return std::make_unique<CastCodec<float>>(call.nranks, nullptr);  // nothing is lost
  return std::make_unique<CastCodec<Bf16>>(call.nranks, rounding);
}

}  // namespace ccoll
