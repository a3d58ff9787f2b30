// Factories of the codecs, from a compressor's parameters and the call's shape.
#pragma once

#include <memory>
#include <string>

#include "compress/codec.h"
#include "compress/compressor.h"

namespace ccoll {

// Everything a codec needs to know about one call.
struct CodecCall {
  int rank = 0;
  int nranks = 1;
  uint64_t seed = 0;
  uint64_t call = 0;  // the compressor's call counter: fresh randomness every call, the same on every rank
};

// 16-bit wire, fp32 accumulation. wireType: ccBfloat16, ccFloat16, or ccFloat32 (exact; the sparsifiers' f32
// values). With `rounding` (as many floats as the call's elements; left untouched with a float32 wire), every
// encode of this rank writes what its rounding took away, fp32 sum minus the 16-bit value sent, at the element's
// offset. A ring or tree schedule encodes each element once per rank (a partial sum, or the final sum), so the
// ranks' roundings add up to the sum of the inputs minus the result (but for the fp32 additions' own rounding): the
// sparsifiers' error feedback keeps them.
std::unique_ptr<Codec> MakeCast16Codec(ccDataType_t wireType, const CodecCall& call, float* rounding = nullptr);

// Rotation + b-bit quantization, homomorphic or requantizing (parameters from the compressor).
std::unique_ptr<Codec> MakeQuantCodec(const ccCompressor& c, const CodecCall& call);

// Homomorphic quantization adds codes in lanes of bits + ceil(log2 nranks) bits, and codes are at most 16 bits wide:
// false, with the reason, when the compressor's bits and the group size do not fit (e.g. 8 bits on 257 ranks).
bool QuantFitsRanks(const ccCompressor& c, int nranks, std::string* why);

}  // namespace ccoll
