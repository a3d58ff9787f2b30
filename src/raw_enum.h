// The integer behind an enum argument of the C API, read without loading it as the enum type: a C caller may pass
// any int (a typo, or a value from a newer header), and in C++ loading an out-of-range enum value is undefined.
// Entry points validate the integer before anything treats it as the enum.
#pragma once

#include <cstring>

namespace ccoll {

template <typename E>
int RawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

}  // namespace ccoll
