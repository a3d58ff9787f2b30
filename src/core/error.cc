#include "core/error.h"

#include <cstdarg>
#include <cstdio>

#include "core/log.h"

namespace ccoll {
namespace {
thread_local std::string tLastError;
}  // namespace

ccResult_t Fail(ccResult_t result, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  tLastError = buf;
  CC_WARN("%s", buf);
  return result;
}

const std::string& LastError() { return tLastError; }

void SetLastError(const std::string& sentence) { tLastError = sentence; }

const char* ResultName(ccResult_t result) {
  switch (result) {
    case ccSuccess: return "ccSuccess";
    case ccUnhandledCudaError: return "ccUnhandledCudaError";
    case ccSystemError: return "ccSystemError";
    case ccInternalError: return "ccInternalError";
    case ccInvalidArgument: return "ccInvalidArgument";
    case ccInvalidUsage: return "ccInvalidUsage";
    case ccRemoteError: return "ccRemoteError";
    case ccInProgress: return "ccInProgress";
    case ccTimeout: return "ccTimeout";
    case ccNumResults: break;
  }
  return "an unknown ccResult_t";
}

}  // namespace ccoll
