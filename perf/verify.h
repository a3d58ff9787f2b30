// Known answers for the all-reduce benchmarks: deterministic inputs keyed by (seed, rank, element index), the fp64
// reference computed from them on the fly (nothing the size of the buffers is stored), and the comparison of a
// result against it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "datatype.h"

namespace ccperf {

// Float input distributions (-D). Integers and products always use the iid rules.
enum class Dist { kIid, kCorr, kHeavy };

struct InputSpec {
  DType dtype = DType::kFloat32;
  Op op = Op::kSum;
  uint64_t seed = 0;
  Dist dist = Dist::kIid;
};

// Writes rank `rank`'s inputs for elements [0, count) into buf. Floats are N(0, 1)-like (Irwin-Hall of four
// uniforms, |x| < 3.5), or 1 + x/16 for prod so that products stay near 1; integers are in [-100, 100], or [-2, 2]
// for prod. With Dist::kCorr a float is g + 0.5 noise_r (g shared by all ranks, like gradients of replicas); with
// kHeavy that, times exp(N(0, 1.5^2)) shared per 4096-element block, and 0.01% of elements (shared) times 100.
void FillInput(const InputSpec& spec, int rank, void* buf, size_t count);

// Fills elements [begin, end) of buf with a value no correct all-reduce produces from FillInput's inputs (NaN for
// floats, 0xa5a5... for integers), so that an element the library forgot to write is caught.
void FillPoison(DType dtype, void* buf, size_t begin, size_t end);
// Elements of [begin, end) that no longer hold the poison.
size_t CountNotPoison(DType dtype, const void* buf, size_t begin, size_t end);

struct CheckResult {
  double sqErr = 0;    // sum over the checked elements of (out - ref)^2
  double sqRef = 0;    // sum of ref^2
  uint64_t wrong = 0;  // elements outside the tolerance
};

// Compares elements [begin, end) of an all-reduce output of nranks ranks with the fp64 reference. With `exact`, an
// element is wrong when it differs from the reference by more than the rounding the datatype allows for the op
// (integers and max/min: not at all); otherwise (lossy codecs) only non-finite elements count as wrong.
CheckResult CheckOutput(const InputSpec& spec, int nranks, const void* out, size_t begin, size_t end, bool exact);

// vNMSE from summed check results: sqErr / sqRef, or 0 when both are 0.
double Vnmse(double sqErr, double sqRef);

// A 64-bit hash of a byte range; any single changed word changes it. Used to compare outputs across ranks bitwise.
uint64_t HashBytes(const void* data, size_t bytes);

}  // namespace ccperf
