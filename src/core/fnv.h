// FNV-1a, 64 bits: a fingerprint of short records (a compressor's spec in the call check, a UCX worker address in the
// bootstrap) that catches mismatches and corruption. Not a defence against forgery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ccoll {

inline uint64_t Fnv1a(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

inline uint64_t Fnv1a(const std::string& s) { return Fnv1a(s.data(), s.size()); }

}  // namespace ccoll
