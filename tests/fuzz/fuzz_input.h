// A reader of fuzz inputs from the front: fixed-size fields first (so the corpus seeds are easy to write by hand,
// see make_corpus.py), the rest as raw bytes. Reading past the end gives zeros.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ccoll_fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), left_(size) {}

  uint8_t U8() { return left_ ? (--left_, *p_++) : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | (static_cast<uint32_t>(U16()) << 16); }
  float F32() {
    uint32_t u = U32();
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // Copies up to n bytes; the rest of dst is zero-filled. Returns the bytes taken from the input.
  size_t Bytes(void* dst, size_t n) {
    size_t k = n < left_ ? n : left_;
    if (k) std::memcpy(dst, p_, k);
    if (n > k) std::memset(static_cast<uint8_t*>(dst) + k, 0, n - k);
    p_ += k;
    left_ -= k;
    return k;
  }
  size_t left() const { return left_; }

 private:
  const uint8_t* p_;
  size_t left_;
};

}  // namespace ccoll_fuzz
