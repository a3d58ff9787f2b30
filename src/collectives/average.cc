#include "collectives/average.h"

#include "collectives/reduce.h"
#include "core/buffer_ops.h"
#include "core/error.h"

namespace ccoll {

bool PremultipliesAverage(ccRedOp_t op, ccDataType_t dtype) { return op == ccAvg && dtype == ccFloat16; }

AverageInput::~AverageInput() {
  if (temp_ != nullptr) mem_->ReleaseTemporary(temp_);
}

ccResult_t AverageInput::Prepare(CollArgs* a, size_t inputCount, bool recvHoldsInput, int nranks) {
  if (!PremultipliesAverage(a->op, a->dtype) || nranks <= 1) return ccSuccess;
  a->op = ccSum;
  if (inputCount == 0) return ccSuccess;
  void* scaled = a->recv;
  if (!recvHoldsInput) {
    CC_CHECK(mem_->Temporary(inputCount * a->eltSize, &temp_));
    scaled = temp_;
  }
  CC_CHECK(mem_->Premultiply(scaled, a->send, inputCount, a->dtype, nranks));
  a->send = scaled;
  return ccSuccess;
}

}  // namespace ccoll
