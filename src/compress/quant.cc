// The quantization codec: randomized Hadamard rotation, then b-bit codes on a uniform grid per group of elements.
//
// requant (DynamiQ-style): every message carries its own per-group scales (in the scale format) followed by the
//   packed b-bit codes; each hop decodes, adds its local rotated slice in fp32 and re-encodes with fresh scales.
// homomorphic (THC-style): the per-group scales are agreed before the data phase (max over ranks, the metadata
//   all-reduce); codes travel in lanes of b + ceil(log2 n) bits, so a hop adds its own codes to the incoming lanes
//   with one multi-word integer addition and nothing is decoded inside the ring. The owner's integer sums go to
//   the all-gather exactly, or requantized to b bits.
#include <cmath>
#include <cstring>
#include <limits>

#include "compress/bitpack.h"
#include "compress/codecs.h"
#include "compress/hadamard.h"
#include "compress/quant_math.h"
#include "compress/rng.h"

namespace ccoll {
namespace {

enum Rounding { kNearest = 0, kStochastic = 1, kCorrelated = 2 };

// max(|x|) that keeps a non-finite value once it has seen one.
inline float MaxAbsSticky(float m, float x) {
  float a = std::fabs(x);
  return (a > m || a != a) ? a : m;
}

// k with P(|N(0,1)| > k) = p, by bisection on erfc (done once per codec).
float ClipMultiplier(double p) {
  if (p <= 0.0) return 0.0f;
  double lo = 0.0, hi = 40.0;
  for (int i = 0; i < 100; ++i) {
    double mid = 0.5 * (lo + hi);
    if (std::erfc(mid / std::sqrt(2.0)) > p) lo = mid; else hi = mid;
  }
  return static_cast<float>(0.5 * (lo + hi));
}

int CeilLog2(int n) {
  int b = 0;
  while ((1 << b) < n) ++b;
  return b;
}

class QuantCodec : public Codec {
 public:
  QuantCodec(const ccCompressor& c, const CodecCall& call)
      : bits_(static_cast<int>(c.Get(ccParamBits))),
        levels_(Levels(bits_)),
        homomorphic_(c.Get(ccParamMode) == ccQuantHomomorphic),
        rotate_(c.Get(ccParamRotation) != 0),
        block_(static_cast<size_t>(c.Get(ccParamRotationBlock))),
        format_(static_cast<ScaleFormat>(c.Get(ccParamScaleFormat))),
        clipK_(ClipMultiplier(static_cast<double>(c.Get(ccParamClipPpm)) / 1e6)),
        rounding_(static_cast<int>(c.Get(ccParamRounding))),
        gatherExact_(c.Get(ccParamGatherPayload) == 0),
        rank_(call.rank),
        nranks_(call.nranks) {
    int64_t g = c.Get(ccParamGroupSize);
    group_ = g > 0 ? static_cast<size_t>(g) : (homomorphic_ ? block_ : 32);
    laneBits_ = homomorphic_ ? bits_ + CeilLog2(nranks_) : bits_;
    signKey_ = StreamKey(call.seed, call.call, ~0u, kPurposeRotation);
    ditherKey_ = StreamKey(call.seed, call.call, static_cast<uint32_t>(rank_), kPurposeDither);
    sharedKey_ = StreamKey(call.seed, call.call, ~0u, kPurposeShared);
    tmp_.resize(group_);
  }

  size_t MaxWireBytes(size_t len) const override {
    size_t lanes = PackedBytes(len, laneBits_);
    size_t requant = RequantBytes(len);
    return lanes > requant ? lanes : requant;
  }
  size_t HopBytes(size_t, size_t len) const override {
    return homomorphic_ ? PackedBytes(len, laneBits_) : RequantBytes(len);
  }
  size_t GatherBytes(size_t, size_t len) const override {
    return homomorphic_ && gatherExact_ ? PackedBytes(len, laneBits_) : RequantBytes(len);
  }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    if (work != input) std::memcpy(work, input, count * sizeof(float));
    if (rotate_) {
      ForEachRotationBlock(count, block_, [&](size_t off, size_t len) { RotateBlock(work + off, len, off, signKey_); });
    }
    meta->clear();
    if (!homomorphic_) return;
    // One scale per global group, agreed as the max over ranks. Non-finite groups report +inf, which survives any
    // max order, so every rank decodes that group to non-finite values.
    size_t groups = (count + group_ - 1) / group_;
    meta->resize(groups);
    for (size_t g = 0; g < groups; ++g) {
      size_t begin = g * group_, end = begin + group_ < count ? begin + group_ : count;
      float m = 0.0f;
      double sq = 0.0;
      for (size_t i = begin; i < end; ++i) {
        m = MaxAbsSticky(m, work[i]);
        sq += static_cast<double>(work[i]) * work[i];
      }
      float s = GroupScale(m, static_cast<float>(std::sqrt(sq / static_cast<double>(end - begin))), clipK_);
      (*meta)[g] = s <= std::numeric_limits<float>::max() ? s : std::numeric_limits<float>::infinity();
    }
  }

  void SetMeta(const std::vector<float>& agreed) override { scales_ = agreed; }

  size_t EncodeFirst(const float* local, size_t off, size_t len, void* wireOut) override {
    if (homomorphic_) return EncodeLanes(local, off, len, wireOut);
    return EncodeRequant(off, len, wireOut, [&](size_t j) { return local[j]; });
  }

  size_t Hop(const void* wireIn, const float* local, size_t off, size_t len, void* wireOut) override {
    if (homomorphic_) {
      size_t bytes = EncodeLanes(local, off, len, wireOut);
      AddPackedStreams(wireOut, wireOut, wireIn, bytes);
      return bytes;
    }
    RequantReader in(wireIn, len, group_, bits_, format_);
    return EncodeRequant(off, len, wireOut, [&](size_t j) { return in.Next() + local[j]; });
  }

  size_t ReduceFinal(const void* wireIn, const float* local, size_t off, size_t len, void* wireOut) override {
    if (!homomorphic_) return Hop(wireIn, local, off, len, wireOut);
    if (gatherExact_) return Hop(wireIn, local, off, len, wireOut);
    // The integer sums, decoded, are requantized to b bits with fresh scales for the all-gather.
    sums_.resize(PackedBytes(len, laneBits_));  // grows to one slice once, then is reused
    size_t bytes = EncodeLanes(local, off, len, sums_.data());
    AddPackedStreams(sums_.data(), sums_.data(), wireIn, bytes);
    LaneReader in(sums_.data(), this, off);
    return EncodeRequant(off, len, wireOut, [&](size_t) { return in.Next(); });
  }

  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    if (homomorphic_ && gatherExact_) {
      LaneReader in(wire, this, off);
      for (size_t j = 0; j < len; ++j) out[j] = in.Next();
      return;
    }
    RequantReader in(wire, len, group_, bits_, format_);
    for (size_t j = 0; j < len; ++j) out[j] = in.Next();
  }

  void Finish(float* work, size_t count, bool average) override {
    if (rotate_) {
      ForEachRotationBlock(count, block_,
                           [&](size_t off, size_t len) { UnrotateBlock(work + off, len, off, signKey_); });
    }
    if (average) {
      const float n = static_cast<float>(nranks_);
      for (size_t i = 0; i < count; ++i) work[i] /= n;
    }
  }

 private:
  // Reads a requant message sequentially: per group a scale, then b-bit codes.
  class RequantReader {
   public:
    RequantReader(const void* wire, size_t len, size_t group, int bits, ScaleFormat format)
        : scales_(static_cast<const uint8_t*>(wire)),
          codes_(static_cast<const uint8_t*>(wire) + ((len + group - 1) / group) * ScaleBytes(format)),
          group_(group), bits_(bits), levels_(Levels(bits)), format_(format) {}
    float Next() {
      if (left_ == 0) {
        s_ = LoadScale(scales_, format_);
        scales_ += ScaleBytes(format_);
        float inv;
        GridOf(s_, levels_, &step_, &inv);
        left_ = group_;
      }
      --left_;
      return DequantizeCode(codes_.Get(bits_), step_, s_);
    }

   private:
    const uint8_t* scales_;
    BitReader codes_;
    size_t group_;
    int bits_;
    uint32_t levels_;
    ScaleFormat format_;
    size_t left_ = 0;
    float s_ = 0, step_ = 0;
  };

  // Reads integer lane sums and decodes them with the agreed scales: x = C * step - n * s.
  class LaneReader {
   public:
    LaneReader(const void* wire, const QuantCodec* codec, size_t off) : in_(wire), c_(codec), i_(off) {}
    float Next() {
      size_t g = i_ / c_->group_;
      float s = c_->scales_[g], step, inv;
      GridOf(s, c_->levels_, &step, &inv);
      ++i_;
      return static_cast<float>(in_.Get(c_->laneBits_)) * step - static_cast<float>(c_->nranks_) * s;
    }

   private:
    BitReader in_;
    const QuantCodec* c_;
    size_t i_;
  };

  size_t RequantBytes(size_t len) const {
    return ((len + group_ - 1) / group_) * ScaleBytes(format_) + PackedBytes(len, bits_);
  }

  float DitherAt(uint64_t i) const {
    switch (rounding_) {
      case kNearest: return 0.5f;
      case kCorrelated:
        if (homomorphic_) return StratifiedDither(Dither(sharedKey_, i), rank_, nranks_);
        return Dither(ditherKey_, i);
      default: return Dither(ditherKey_, i);
    }
  }

  // Codes of this rank's slice in lanes, with the agreed scales.
  size_t EncodeLanes(const float* local, size_t off, size_t len, void* wireOut) const {
    BitWriter out(wireOut);
    size_t j = 0;
    while (j < len) {
      size_t g = (off + j) / group_;
      size_t end = (g + 1) * group_ - off;
      if (end > len) end = len;
      float s = scales_[g], step, inv;
      GridOf(s, levels_, &step, &inv);
      for (; j < end; ++j) out.Put(QuantizeCode(local[j], inv, s, levels_, DitherAt(off + j)), laneBits_);
    }
    out.Flush();
    return PackedBytes(len, laneBits_);
  }

  // A requant message of values value(j), j in [0, len): scales of slice-local groups, then b-bit codes.
  template <typename Value>
  size_t EncodeRequant(size_t off, size_t len, void* wireOut, Value&& value) {
    size_t groups = (len + group_ - 1) / group_;
    uint8_t* scales = static_cast<uint8_t*>(wireOut);
    BitWriter out(scales + groups * ScaleBytes(format_));
    for (size_t g = 0; g < groups; ++g) {
      size_t begin = g * group_, n = len - begin < group_ ? len - begin : group_;
      float m = 0.0f;
      double sq = 0.0;
      for (size_t k = 0; k < n; ++k) {
        float v = value(begin + k);
        tmp_[k] = v;
        m = MaxAbsSticky(m, v);
        sq += static_cast<double>(v) * v;
      }
      float s = RoundScaleUp(GroupScale(m, static_cast<float>(std::sqrt(sq / static_cast<double>(n))), clipK_),
                             format_);
      StoreScale(scales + g * ScaleBytes(format_), s, format_);
      s = LoadScale(scales + g * ScaleBytes(format_), format_);  // exactly what the decoder will read
      float step, inv;
      GridOf(s, levels_, &step, &inv);
      for (size_t k = 0; k < n; ++k) {
        out.Put(QuantizeCode(tmp_[k], inv, s, levels_, DitherAt(off + begin + k)), bits_);
      }
    }
    out.Flush();
    return RequantBytes(len);
  }

  const int bits_;
  const uint32_t levels_;
  const bool homomorphic_;
  const bool rotate_;
  const size_t block_;
  const ScaleFormat format_;
  const float clipK_;
  const int rounding_;
  const bool gatherExact_;
  const int rank_;
  const int nranks_;
  size_t group_ = 32;
  int laneBits_ = 0;
  uint32_t signKey_ = 0, ditherKey_ = 0, sharedKey_ = 0;
  std::vector<float> scales_;  // homomorphic: the agreed scale of every global group
  std::vector<float> tmp_;     // one group of values being re-encoded
  std::vector<char> sums_;     // homomorphic with a requantized all-gather: the owner's lane sums of a slice
};

}  // namespace

std::unique_ptr<Codec> MakeQuantCodec(const ccCompressor& c, const CodecCall& call) {
  return std::make_unique<QuantCodec>(c, call);
}

}  // namespace ccoll
