// What a quantization codec derives from its compressor and call, once: the parameters as the element math takes
// them and the call's random streams. The CPU codec (quant.cc) and the device codec (device_codec.cc) share it, so
// both encode the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/codecs.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"

namespace ccoll {

enum QuantRounding { kNearest = 0, kStochastic = 1, kCorrelated = 2 };

struct QuantPlan {
  int bits = 4;
  bool homomorphic = false;
  bool rotate = true;
  size_t block = 1024;       // rotation block
  ScaleFormat format = ScaleFormat::kFp32;
  float clipK = 0.0f;        // clip point in units of the group's rms (0: no clipping)
  bool gatherExact = true;   // homomorphic: the all-gather carries the integer sums
  int rank = 0, nranks = 1;
  size_t group = 32;         // elements per scale
  int laneBits = 4;          // bits per code on the wire (homomorphic: room for the sum of nranks codes)
  uint32_t signKey = 0;      // the rotation's signs
  DitherRule rule;           // the dithers of every encode

  // Bytes of a requant message of len values: the scales, then the packed codes.
  size_t RequantBytes(size_t len) const;
  // The Codec's message sizes for a slice of len values (both codecs of the plan send the same messages).
  size_t MaxWireBytes(size_t len) const;
  size_t HopBytes(size_t len) const;
  size_t GatherBytes(size_t len) const;
};

QuantPlan MakeQuantPlan(const ccCompressor& c, const CodecCall& call);

}  // namespace ccoll
