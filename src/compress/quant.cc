// The quantization codec: randomized Hadamard rotation, then b-bit codes on a uniform grid per group of elements.
//
// requant (DynamiQ-style): every message carries its own per-group scales (in the scale format) followed by the
//   packed b-bit codes; each hop decodes, adds its local rotated slice in fp32 and re-encodes with fresh scales.
// homomorphic (THC-style): the per-group scales are agreed before the data phase (max over ranks, the metadata
//   all-reduce); codes travel in lanes of b + ceil(log2 n) bits, so a hop adds its own codes to the incoming lanes
//   with one multi-word integer addition and nothing is decoded inside the ring. The owner's integer sums go to
//   the all-gather exactly, or requantized to b bits.
//
// requant needs no metadata, so when the schedule allows it (PipelinePrepareAndFinish) its rotation is lazy:
// Prepare only records the buffers; a rotation block is rotated the first time a hop reads any of its elements,
// and rotated back as soon as the all-gather has decoded all of them. Both passes then run between the ring's
// transfers instead of before and after the whole ring, with the same arithmetic per block as the eager passes
// (the same bytes).
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compress/bitpack.h"
#include "compress/codecs.h"
#include "compress/hadamard.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"
#include "compress/rng.h"

namespace ccoll {
namespace {

enum Rounding { kNearest = 0, kStochastic = 1, kCorrelated = 2 };

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
    meta->clear();
    if (pipeline_ && rotate_ && !homomorphic_) {
      PlanLazyRotation(input, work, count);
      return;
    }
    if (rotate_) {
      RotateForward(input, work, count, block_, signKey_);
    } else if (work != input) {
      std::memcpy(work, input, count * sizeof(float));
    }
    if (!homomorphic_) return;
    // One scale per global group, agreed as the max over ranks. Non-finite groups report +inf, which survives any
    // max order, so every rank decodes that group to non-finite values.
    size_t groups = (count + group_ - 1) / group_;
    meta->resize(groups);
    for (size_t g = 0; g < groups; ++g) {
      size_t begin = g * group_, n = begin + group_ < count ? group_ : count - begin;
      (*meta)[g] = GroupScaleOf(work + begin, n, clipK_);
    }
  }

  void SetMeta(const std::vector<float>& agreed) override { scales_ = agreed; }

  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
          void* wireOut) override {
    if (homomorphic_) {
      size_t bytes = EncodeLanes(local, off, len, wireOut);
      for (int k = 0; k < nin; ++k) AddPackedStreams(wireOut, wireOut, wiresIn[k], bytes);
      return bytes;
    }
    if (lazy_) EnsureRotated(off, len);
    if (nin == 0) return EncodeRequant(local, off, len, wireOut);
    Grow(len);
    return HopRequantSlice(wiresIn, nin, local, len, off, group_, bits_, format_, clipK_, Rule(), vals_.data(),
                           codes_.data(), wireOut);
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    if (!homomorphic_ || gatherExact_) return Hop(wiresIn, nin, local, off, len, wireOut);
    // The integer sums, decoded, are requantized to b bits with fresh scales for the all-gather.
    sums_.resize(PackedBytes(len, laneBits_));  // grows to one slice once, then is reused
    Hop(wiresIn, nin, local, off, len, sums_.data());
    Grow(len);
    DecodeLanes(sums_.data(), off, len, vals_.data());
    return EncodeRequant(vals_.data(), off, len, wireOut);
  }

  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    if (homomorphic_ && gatherExact_) {
      DecodeLanes(wire, off, len, out);
    } else {
      DecodeRequant(wire, len, out);
      if (lazy_) FinishDecoded(off, len);
    }
  }

  void PipelinePrepareAndFinish(bool average) override {
    pipeline_ = true;
    average_ = average;
  }

  void Finish(float* work, size_t count, bool average) override {
    if (lazy_) return;  // every block was rotated back when its last slice was decoded
    const float scale = average ? 1.0f / static_cast<float>(nranks_) : 1.0f;
    if (rotate_) {
      RotateInverse(work, count, block_, signKey_, scale);
    } else if (average) {
      for (size_t i = 0; i < count; ++i) work[i] *= scale;
    }
  }

 private:
  // Rotation blocks are ForEachRotationBlock's: full blocks of block_, then a tail of smaller powers of two.
  void PlanLazyRotation(const float* input, float* work, size_t count) {
    lazy_ = true;
    input_ = input;
    work_ = work;
    full_ = count / block_;
    tail_.clear();
    const size_t tail0 = full_ * block_;
    ForEachRotationBlock(count - tail0, block_, [&](size_t off, size_t len) { tail_.push_back({tail0 + off, len}); });
    const size_t blocks = full_ + tail_.size();
    rotated_.assign(blocks, 0);
    decoded_.assign(blocks, 0);
    finishScale_ = average_ ? 1.0f / static_cast<float>(nranks_) : 1.0f;
  }

  size_t BlockOf(size_t i) const {
    if (i < full_ * block_) return i / block_;
    size_t b = 0;
    while (i >= tail_[b].off + tail_[b].len) ++b;
    return full_ + b;
  }
  void BlockSpan(size_t b, size_t* off, size_t* len) const {
    if (b < full_) {
      *off = b * block_;
      *len = block_;
    } else {
      *off = tail_[b - full_].off;
      *len = tail_[b - full_].len;
    }
  }

  // Rotates every block that [off, off+len) touches and that is not rotated yet (from the input into work).
  void EnsureRotated(size_t off, size_t len) {
    if (len == 0) return;
    for (size_t b = BlockOf(off), last = BlockOf(off + len - 1); b <= last; ++b) {
      if (rotated_[b]) continue;
      rotated_[b] = 1;
      size_t bo, bl;
      BlockSpan(b, &bo, &bl);
      RotateBlockForward(input_ + bo, work_ + bo, bl, bo, signKey_);
    }
  }

  // [off, off+len) of work holds decoded sums now: rotates back (and averages) every block that is complete.
  void FinishDecoded(size_t off, size_t len) {
    if (len == 0) return;
    for (size_t b = BlockOf(off), last = BlockOf(off + len - 1); b <= last; ++b) {
      size_t bo, bl;
      BlockSpan(b, &bo, &bl);
      const size_t lo = off > bo ? off : bo, hi = off + len < bo + bl ? off + len : bo + bl;
      decoded_[b] += static_cast<uint32_t>(hi - lo);
      if (decoded_[b] == bl) RotateBlockInverse(work_ + bo, bl, bo, signKey_, finishScale_);
    }
  }

  size_t RequantBytes(size_t len) const {
    return ((len + group_ - 1) / group_) * ScaleBytes(format_) + PackedBytes(len, bits_);
  }

  void Grow(size_t len) {
    if (vals_.size() < len) vals_.resize(len);  // one slice; grows once, then is reused
    if (codes_.size() < len) codes_.resize(len);
  }

  DitherRule Rule() const {
    DitherRule rule;
    rule.rounding = (rounding_ == kCorrelated && !homomorphic_) ? kStochastic : rounding_;
    rule.key = ditherKey_;
    rule.sharedKey = sharedKey_;
    rule.rank = rank_;
    rule.nranks = nranks_;
    return rule;
  }

  size_t EncodeLanes(const float* local, size_t off, size_t len, void* wireOut) {
    Grow(len);
    return EncodeLanesSlice(local, len, off, group_, scales_.data(), bits_, laneBits_, Rule(), codes_.data(), wireOut);
  }

  void DecodeLanes(const void* wire, size_t off, size_t len, float* out) {
    Grow(len);
    DecodeLanesSlice(wire, len, off, group_, scales_.data(), bits_, laneBits_, nranks_, codes_.data(), out);
  }

  size_t EncodeRequant(const float* v, size_t off, size_t len, void* wireOut) {
    Grow(len);
    return EncodeRequantSlice(v, len, off, group_, bits_, format_, clipK_, Rule(), codes_.data(), wireOut);
  }

  void DecodeRequant(const void* wire, size_t len, float* out) {
    Grow(len);
    DecodeRequantSlice(wire, len, group_, bits_, format_, codes_.data(), out);
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
  std::vector<float> vals_;     // one slice of values being re-encoded
  std::vector<uint16_t> codes_;  // one slice of codes
  std::vector<char> sums_;     // homomorphic with a requantized all-gather: the owner's lane sums of a slice
  // Lazy rotation (requant with rotation).
  struct Span {
    size_t off, len;
  };
  bool pipeline_ = false;  // the schedule allows lazy rotation
  bool average_ = false;
  bool lazy_ = false;      // this call rotates lazily
  const float* input_ = nullptr;
  float* work_ = nullptr;
  size_t full_ = 0;              // blocks of block_ elements from index 0
  std::vector<Span> tail_;       // the smaller blocks after them
  std::vector<uint8_t> rotated_;   // per block: rotated into work
  std::vector<uint32_t> decoded_;  // per block: elements the all-gather has decoded
  float finishScale_ = 1.0f;
};

}  // namespace

bool QuantFitsRanks(const ccCompressor& c, int nranks, std::string* why) {
  constexpr int kMaxLaneBits = 16;  // codes are uint16_t; the packer takes 1..16 bits
  const int bits = static_cast<int>(c.Get(ccParamBits));
  if (c.Get(ccParamMode) != ccQuantHomomorphic || bits + CeilLog2(nranks) <= kMaxLaneBits) return true;
  *why = "homomorphic sums of " + std::to_string(bits) + "-bit codes over " + std::to_string(nranks) + " ranks need " +
         std::to_string(bits + CeilLog2(nranks)) + "-bit lanes, more than " + std::to_string(kMaxLaneBits) +
         (kMaxLaneBits > CeilLog2(nranks) ? "; use at most " + std::to_string(kMaxLaneBits - CeilLog2(nranks)) +
                                                 " bits or mode=requant"
                                           : std::string("; use mode=requant"));
  return false;
}

std::unique_ptr<Codec> MakeQuantCodec(const ccCompressor& c, const CodecCall& call) {
  return std::make_unique<QuantCodec>(c, call);
}

}  // namespace ccoll
