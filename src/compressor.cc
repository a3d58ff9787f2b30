// C API entry points of compressors. The codec layer is not built yet: every call that would create or use a
// compressor says so, and the ones that free or take NULL behave as documented.
#include "ccoll.h"
#include "core/error.h"

using ccoll::Fail;

extern "C" {

CC_API ccResult_t ccCompressorCreate(ccCompressor_t* comp, ccCompressorKind_t kind) {
  if (comp != nullptr) *comp = nullptr;
  return Fail(ccInvalidUsage, "ccCompressorCreate: compressor kind %d: compression is not built yet in ccoll %s",
              static_cast<int>(kind), CCOLL_VERSION_STRING);
}

CC_API ccResult_t ccCompressorCreateFromString(ccCompressor_t* comp, const char* spec) {
  if (comp != nullptr) *comp = nullptr;
  return Fail(ccInvalidUsage, "ccCompressorCreateFromString: \"%s\": compression is not built yet in ccoll %s",
              spec ? spec : "(null)", CCOLL_VERSION_STRING);
}

CC_API ccResult_t ccCompressorSetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t value) {
  return Fail(ccInvalidUsage, "ccCompressorSetParam: compression is not built yet");
}

CC_API ccResult_t ccCompressorGetParam(ccCompressor_t comp, ccCompressorParam_t param, int64_t* value) {
  return Fail(ccInvalidUsage, "ccCompressorGetParam: compression is not built yet");
}

CC_API ccResult_t ccCompressorGetParamBounds(ccCompressorParam_t param, int64_t* lo, int64_t* hi) {
  return Fail(ccInvalidUsage, "ccCompressorGetParamBounds: compression is not built yet");
}

CC_API ccResult_t ccCompressorDestroy(ccCompressor_t comp) {
  if (comp == nullptr) return ccSuccess;
  return Fail(ccInvalidArgument, "ccCompressorDestroy: %p is not a compressor (none can exist yet)",
              static_cast<void*>(comp));
}

}  // extern "C"
