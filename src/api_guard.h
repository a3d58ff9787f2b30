// Every extern "C" body runs inside Guarded: an exception escaping it becomes a result code with a sentence, so no
// exception ever crosses the C boundary.
#pragma once

#include <exception>
#include <new>

#include "ccoll.h"
#include "core/error.h"

namespace ccoll {

template <typename Body>
ccResult_t Guarded(const char* fn, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Fail(ccSystemError, "%s: out of memory", fn);
  } catch (const std::exception& e) {
    return Fail(ccInternalError, "%s: unexpected exception: %s", fn, e.what());
  } catch (...) {
    return Fail(ccInternalError, "%s: unexpected exception", fn);
  }
}

}  // namespace ccoll
