// Error propagation. The first place that detects an error calls Fail(): it records a specific sentence as the
// calling thread's last error (ccGetLastError) and logs it at WARN. Callers propagate with CC_CHECK and add context
// only where they know more.
#pragma once

#include <string>

#include "ccoll.h"

namespace ccoll {

ccResult_t Fail(ccResult_t result, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// The calling thread's last error sentence ("" when none).
const std::string& LastError();
// Replaces the calling thread's last error without logging (used to restore a sentence on another thread).
void SetLastError(const std::string& sentence);
// The result code's name ("ccInvalidUsage"), for sentences that report another rank's or an earlier call's result
// (ccGetErrorString's text carries its own advice in parentheses).
const char* ResultName(ccResult_t result);

}  // namespace ccoll

#define CC_CHECK(call)                     \
  do {                                     \
    ccResult_t cc_check_result_ = (call);  \
    if (cc_check_result_ != ccSuccess) {   \
      return cc_check_result_;             \
    }                                      \
  } while (0)
