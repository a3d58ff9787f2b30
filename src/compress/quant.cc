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
// (the same bytes). homomorphic needs every rotated value for its scales before the ring, so only its rotation back
// is lazy; but its pre-pass splits into segments (SegmentAlign), so that over a network the call runs segment by
// segment with the next segment's rotation and scales in the current one's waits (collectives/compressed.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compress/bitpack.h"
#include "compress/codecs.h"
#include "compress/quant.h"
#include "compress/hadamard.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"
#include "compress/widen.h"
#include "compress/rng.h"

namespace ccoll {
namespace {

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
  QuantCodec(const ccCompressor& c, const CodecCall& call) : plan_(MakeQuantPlan(c, call)) {}

  size_t MaxWireBytes(size_t len) const override { return plan_.MaxWireBytes(len); }
  size_t HopBytes(size_t, size_t len) const override { return plan_.HopBytes(len); }
  size_t GatherBytes(size_t, size_t len) const override { return plan_.GatherBytes(len); }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    meta->clear();
    if (pipeline_ && plan_.rotate && !plan_.homomorphic) {
      PlanLazyRotation(input, work, count, /*rotated=*/false);
      return;
    }
    if (plan_.rotate) {
      RotateForward(input, work, count, plan_.block, plan_.signKey);
      // homomorphic: the scales need every rotated value before the ring, but the rotation back can run inside it.
      if (pipeline_) PlanLazyRotation(input, work, count, /*rotated=*/true);
    } else if (work != input) {
      std::memcpy(work, input, count * sizeof(float));
    }
    if (!plan_.homomorphic) return;
    // One scale per global group, agreed as the max over ranks. Non-finite groups report +inf, which survives any
    // max order, so every rank decodes that group to non-finite values.
    meta->resize(MetaCount(0, count));
    GroupScales(work, 0, count, meta->data());
  }

  void SetMeta(const std::vector<float>& agreed) override { scales_ = agreed; }

  // The homomorphic pre-pass (rotation, then a scale per group) splits at boundaries of whole groups and rotation
  // blocks; with the exact all-gather the lane sums do not depend on which rank owns which slice, so a segmented call
  // computes the bytes of one ring over the whole buffer.
  size_t SegmentAlign() const override {
    if (!pipeline_ || !plan_.homomorphic || !plan_.gatherExact) return 0;
    if (!plan_.rotate) return plan_.group;
    const size_t big = std::max(plan_.group, plan_.block), small = std::min(plan_.group, plan_.block);
    return big % small == 0 ? big : 0;
  }

  void BeginSegments(const float* input, float* work, size_t count) override {
    input_ = input;
    work_ = work;
    scales_.assign((count + plan_.group - 1) / plan_.group, 0.0f);
    if (plan_.rotate) PlanLazyRotation(input, work, count, /*rotated=*/true);  // rotated by PrepareRange
  }

  size_t MetaCount(size_t begin, size_t end) const override {
    return (end - begin + plan_.group - 1) / plan_.group;
  }

  // [begin, end): whole rotation blocks (ForEachRotationBlock's, from BlockOf) and groups, or the buffer's end.
  void PrepareRange(size_t begin, size_t end, float* meta) override {
    if (begin == end) return;
    if (plan_.rotate) {
      for (size_t b = BlockOf(begin), last = BlockOf(end - 1); b <= last; ++b) {
        size_t bo, bl;
        BlockSpan(b, &bo, &bl);
        RotateBlockForward(input_ + bo, work_ + bo, bl, bo, plan_.signKey);
      }
    } else if (work_ != input_) {
      std::memcpy(work_ + begin, input_ + begin, (end - begin) * sizeof(float));
    }
    GroupScales(work_, begin, end, meta);
  }

  void SetMetaRange(size_t begin, size_t end, const float* agreed) override {
    std::copy(agreed, agreed + MetaCount(begin, end), scales_.begin() + static_cast<std::ptrdiff_t>(begin / plan_.group));
  }

  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
          void* wireOut) override {
    if (plan_.homomorphic) {
      size_t bytes = EncodeLanes(local, off, len, wireOut);
      for (int k = 0; k < nin; ++k) AddPackedStreams(wireOut, wireOut, wiresIn[k], bytes);
      return bytes;
    }
    if (lazy_) EnsureRotated(off, len);
    if (nin == 0) return EncodeRequant(local, off, len, wireOut);
    Grow(len);
    return HopRequantSlice(wiresIn, nin, local, len, off, plan_.group, plan_.bits, plan_.format, plan_.clipK,
                           plan_.rule, vals_.data(), codes_.data(), wireOut);
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    if (!plan_.homomorphic || plan_.gatherExact) return Hop(wiresIn, nin, local, off, len, wireOut);
    // The integer sums, decoded, are requantized to b bits with fresh scales for the all-gather.
    sums_.resize(PackedBytes(len, plan_.laneBits));  // grows to one slice once, then is reused
    Hop(wiresIn, nin, local, off, len, sums_.data());
    Grow(len);
    DecodeLanes(sums_.data(), off, len, vals_.data());
    return EncodeRequant(vals_.data(), off, len, wireOut);
  }

  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    if (plan_.homomorphic && plan_.gatherExact) {
      DecodeLanes(wire, off, len, out);
    } else {
      DecodeRequant(wire, len, out);
    }
    if (lazy_) FinishDecoded(off, len);
  }

  void PipelinePrepareAndFinish(bool average) override {
    pipeline_ = true;
    average_ = average;
  }

  bool PipelineHalfData(ccDataType_t dtype, const void* input, void* output) override {
    if (!pipeline_ || !plan_.rotate || plan_.homomorphic) return false;  // only the lazy rotation reads by blocks
    halfType_ = dtype;
    halfIn_ = static_cast<const uint16_t*>(input);
    halfOut_ = static_cast<uint16_t*>(output);
    return true;
  }

  void Finish(float* work, size_t count, bool average) override {
    if (lazy_) return;  // every block was rotated back when its last slice was decoded
    const float scale = average ? 1.0f / static_cast<float>(plan_.nranks) : 1.0f;
    if (plan_.rotate) {
      RotateInverse(work, count, plan_.block, plan_.signKey, scale);
    } else if (average) {
      for (size_t i = 0; i < count; ++i) work[i] *= scale;
    }
  }

 private:
  // Rotation blocks are ForEachRotationBlock's: full blocks of plan_.block, then a tail of smaller powers of two.
  // rotated: work holds every block rotated already (homomorphic), and only the rotation back is lazy.
  void PlanLazyRotation(const float* input, float* work, size_t count, bool rotated) {
    lazy_ = true;
    input_ = input;
    work_ = work;
    full_ = count / plan_.block;
    tail_.clear();
    const size_t tail0 = full_ * plan_.block;
    ForEachRotationBlock(count - tail0, plan_.block,
                         [&](size_t off, size_t len) { tail_.push_back({tail0 + off, len}); });
    const size_t blocks = full_ + tail_.size();
    rotated_.assign(blocks, rotated ? 1 : 0);
    decoded_.assign(blocks, 0);
    finishScale_ = average_ ? 1.0f / static_cast<float>(plan_.nranks) : 1.0f;
  }

  size_t BlockOf(size_t i) const {
    if (i < full_ * plan_.block) return i / plan_.block;
    size_t b = 0;
    while (i >= tail_[b].off + tail_[b].len) ++b;
    return full_ + b;
  }
  void BlockSpan(size_t b, size_t* off, size_t* len) const {
    if (b < full_) {
      *off = b * plan_.block;
      *len = plan_.block;
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
      if (halfIn_ != nullptr) {
        Widen(halfType_, halfIn_ + bo, bl, work_ + bo);  // while the block is in L1 for the rotation
        RotateBlockForward(work_ + bo, work_ + bo, bl, bo, plan_.signKey);
      } else {
        RotateBlockForward(input_ + bo, work_ + bo, bl, bo, plan_.signKey);
      }
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
      if (decoded_[b] != bl) continue;
      RotateBlockInverse(work_ + bo, bl, bo, plan_.signKey, finishScale_);
      if (halfOut_ != nullptr) Narrow(halfType_, work_ + bo, bl, halfOut_ + bo);
    }
  }

  // GroupScaleOf of every group of work[begin, end) (begin a multiple of the group) into meta, in order.
  void GroupScales(const float* work, size_t begin, size_t end, float* meta) const {
    for (size_t at = begin; at < end; at += plan_.group) {
      *meta++ = GroupScaleOf(work + at, std::min(plan_.group, end - at), plan_.clipK);
    }
  }

  void Grow(size_t len) {
    if (vals_.size() < len) vals_.resize(len);  // one slice; grows once, then is reused
    if (codes_.size() < len) codes_.resize(len);
  }

  size_t EncodeLanes(const float* local, size_t off, size_t len, void* wireOut) {
    Grow(len);
    return EncodeLanesSlice(local, len, off, plan_.group, scales_.data(), plan_.bits, plan_.laneBits, plan_.rule,
                            codes_.data(), wireOut);
  }

  void DecodeLanes(const void* wire, size_t off, size_t len, float* out) {
    Grow(len);
    DecodeLanesSlice(wire, len, off, plan_.group, scales_.data(), plan_.bits, plan_.laneBits, plan_.nranks,
                     codes_.data(), out);
  }

  size_t EncodeRequant(const float* v, size_t off, size_t len, void* wireOut) {
    Grow(len);
    return EncodeRequantSlice(v, len, off, plan_.group, plan_.bits, plan_.format, plan_.clipK, plan_.rule,
                              codes_.data(), wireOut);
  }

  void DecodeRequant(const void* wire, size_t len, float* out) {
    Grow(len);
    DecodeRequantSlice(wire, len, plan_.group, plan_.bits, plan_.format, codes_.data(), out);
  }

  const QuantPlan plan_;
  std::vector<float> scales_;  // homomorphic: the agreed scale of every global group
  std::vector<float> vals_;     // one slice of values being re-encoded
  std::vector<uint16_t> codes_;  // one slice of codes
  std::vector<char> sums_;     // homomorphic with a requantized all-gather: the owner's lane sums of a slice
  // Lazy rotation (requant with rotation; homomorphic with rotation only rotates back lazily).
  struct Span {
    size_t off, len;
  };
  bool pipeline_ = false;  // the schedule allows lazy rotation
  ccDataType_t halfType_ = ccBfloat16;  // 16-bit data, widened and narrowed by the lazy rotation's blocks
  const uint16_t* halfIn_ = nullptr;
  uint16_t* halfOut_ = nullptr;
  bool average_ = false;
  bool lazy_ = false;      // this call rotates lazily
  const float* input_ = nullptr;
  float* work_ = nullptr;
  size_t full_ = 0;              // blocks of plan_.block elements from index 0
  std::vector<Span> tail_;       // the smaller blocks after them
  std::vector<uint8_t> rotated_;   // per block: rotated into work
  std::vector<uint32_t> decoded_;  // per block: elements the all-gather has decoded
  float finishScale_ = 1.0f;
};

}  // namespace

size_t QuantPlan::RequantBytes(size_t len) const {
  return ((len + group - 1) / group) * ScaleBytes(format) + PackedBytes(len, bits);
}

size_t QuantPlan::MaxWireBytes(size_t len) const {
  const size_t lanes = PackedBytes(len, laneBits), requant = RequantBytes(len);
  return lanes > requant ? lanes : requant;
}

size_t QuantPlan::HopBytes(size_t len) const { return homomorphic ? PackedBytes(len, laneBits) : RequantBytes(len); }

size_t QuantPlan::GatherBytes(size_t len) const {
  return homomorphic && gatherExact ? PackedBytes(len, laneBits) : RequantBytes(len);
}

QuantPlan MakeQuantPlan(const ccCompressor& c, const CodecCall& call) {
  QuantPlan p;
  p.bits = static_cast<int>(c.Get(ccParamBits));
  p.homomorphic = c.Get(ccParamMode) == ccQuantHomomorphic;
  p.rotate = c.Get(ccParamRotation) != 0;
  p.block = static_cast<size_t>(c.Get(ccParamRotationBlock));
  p.format = static_cast<ScaleFormat>(c.Get(ccParamScaleFormat));
  p.clipK = ClipMultiplier(static_cast<double>(c.Get(ccParamClipPpm)) / 1e6);
  p.gatherExact = c.Get(ccParamGatherPayload) == 0;
  p.rank = call.rank;
  p.nranks = call.nranks;
  const int64_t g = c.Get(ccParamGroupSize);
  p.group = g > 0 ? static_cast<size_t>(g) : (p.homomorphic ? p.block : 32);
  p.laneBits = p.homomorphic ? p.bits + CeilLog2(p.nranks) : p.bits;
  p.signKey = StreamKey(call.seed, call.call, ~0u, kPurposeRotation);
  // Correlated (stratified) rounding needs every rank to round the same groups on the same grid, as homomorphic
  // codes do; a call that asks for it with requant is refused (CompressorCombinationValid).
  p.rule.rounding = static_cast<int>(c.Get(ccParamRounding));
  p.rule.key = StreamKey(call.seed, call.call, static_cast<uint32_t>(call.rank), kPurposeDither);
  p.rule.sharedKey = StreamKey(call.seed, call.call, ~0u, kPurposeShared);
  p.rule.rank = call.rank;
  p.rule.nranks = call.nranks;
  return p;
}

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
