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

}  // namespace ccoll
