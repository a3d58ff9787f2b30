// 16-bit gradients (bfloat16, float16) through the float32 codecs: widened exactly into a float32 working copy, and
// the float32 result narrowed back with round-to-nearest-even (float16.h). The narrowing is a function of the float32
// result alone, so every rank still ends with the same bytes. Host code; on the device, the cast codec's decode and
// its hop without arriving messages do the same (codec_cuda.h).
#pragma once

#include <cstddef>

#include "ccoll.h"

namespace ccoll {

// True for the 16-bit float types a compressed all-reduce takes besides float32.
bool IsHalfFloat(ccDataType_t dtype);

// out[i] = in[i] as float (exact); in holds count values of `dtype` (ccBfloat16 or ccFloat16).
void Widen(ccDataType_t dtype, const void* in, size_t count, float* out);
// out[i] = in[i] rounded to `dtype` (nearest, ties to even; NaN stays NaN, overflow becomes infinity).
void Narrow(ccDataType_t dtype, const float* in, size_t count, void* out);

// The 16-bit cast codec's hop (cast16.cc): out[i] = (local[i] + in[0][i] + ... + in[nin-1][i]) rounded to `dtype`
// (16-bit), the nin (0..2) inputs of `dtype` widened exactly and added in float in that order. Where lost is not null,
// lost[i] = that sum minus its rounding (exact).
void NarrowSum(ccDataType_t dtype, const float* local, const void* const* in, int nin, size_t count, void* out,
               float* lost);

// lost[i] = (v[i] minus v[i] rounded to `dtype`) * share (the product only where share is not 1), or 0 where that is
// not finite (v overflows 16 bits, or is not finite itself), added to lost[i] when `add`: what narrowing v rounds
// away, as NarrowSum's `lost` with no inputs gives it, scaled (a sparsifier's error feedback keeps each rank's share
// of what its 16-bit result rounds away: collectives/sparse.h).
void NarrowingLoss(ccDataType_t dtype, const float* v, size_t count, float share, bool add, float* lost);
// out[i] = v[i] rounded to `dtype` (as Narrow), and lost[i] += (v[i] - out[i]) * share where that is finite (as
// NarrowingLoss), then lost[i] = 0 where the sum is not: an error-feedback memory keeping its share of what narrowing
// the result rounds away, in the pass that narrows it (PowerSGD: collectives/lowrank.h).
void NarrowKeeping(ccDataType_t dtype, const float* v, size_t count, float share, float* lost, void* out);

// Fused forms for the codecs that read and write 16-bit data themselves (the sparsifiers, PowerSGD), the same bytes
// as a widened copy would give: acc[i] += in[i] as float (float32 or 16-bit input), reporting whether every input
// value was finite and whether every sum is (what a sparsifier would otherwise make passes of its own for); and
// out[0..count) = value rounded to `dtype`, as Narrow would round it.
struct AddReport {
  bool inputFinite = true;
  bool sumsFinite = true;
};
AddReport AddChecked(ccDataType_t dtype, const void* in, size_t count, float* acc);
// Whether every one of the count values of `dtype` (float32, bfloat16 or float16) at `in` is finite.
bool AllFinite(ccDataType_t dtype, const void* in, size_t count);
void FillNarrowed(ccDataType_t dtype, float value, size_t count, void* out);

}  // namespace ccoll
