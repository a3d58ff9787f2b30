// ccAvg of float16 as NCCL's ncclAvg computes it: each rank's input is multiplied by 1 / nranks (the factor rounded
// to float16) before the sum, so that partial sums stay within the inputs' range. A sum divided at the end overflowed
// where the average does not: two ranks' 40000 summed to infinity (float16's largest value is 65504). Where the
// product is sent as it is, it is rounded to float16; where it is added to a partial sum, product and sum are one
// step in float, rounded once (the ring all-reduce: ReducePremultiplied). bfloat16, float32 and float64 keep the sum divided once at the end (FinishAvg), as integers do (rounded toward
// zero there): their range is float32's or more, so a sum of gradients does not overflow, and the division at the end
// rounds once less and has no bias from a rounded factor (bfloat16's 1/3 is 0.2% high; NCCL premultiplies these too).
// On the CPU a premultiplied bfloat16 all-reduce also took a third longer (4 thread ranks, 64 MiB). The exact
// schedules (ring.cc, tree.cc) apply it, so every caller gets the same rule.
#pragma once

#include <cstddef>

#include "ccoll.h"
#include "collectives/coll_args.h"

namespace ccoll {

class BufferOps;

// Whether op on dtype premultiplies: ccAvg of float16.
bool PremultipliesAverage(ccRedOp_t op, ccDataType_t dtype);

// The premultiplied input of one exact schedule call; it must outlive the schedule's use of the arguments.
class AverageInput {
 public:
  explicit AverageInput(BufferOps* mem) : mem_(mem) {}
  ~AverageInput();
  AverageInput(const AverageInput&) = delete;
  AverageInput& operator=(const AverageInput&) = delete;

  // For a call whose input is inputCount elements at a->send: where it premultiplies (and nranks > 1), writes the
  // scaled input to a->recv when recvHoldsInput (recv has room for the whole input, as an all-reduce's and the
  // root's of a reduce), else to temporary memory of the call's kind, and makes *a a sum over it. Else nothing.
  ccResult_t Prepare(CollArgs* a, size_t inputCount, bool recvHoldsInput, int nranks);

 private:
  BufferOps* mem_;
  void* temp_ = nullptr;
};

}  // namespace ccoll
