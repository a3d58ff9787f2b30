// Little-endian bit streams of fixed-width values (1..16 bits), and lane-wise addition of two such streams.
// Host/device element math: the wire format is the same on CPU and GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compress/host_device.h"

namespace ccoll {

CC_HD size_t PackedBytes(size_t values, int bits) { return (values * static_cast<size_t>(bits) + 7) / 8; }

// Byte b of the little-endian stream of n codes of `bits` bits (BitWriter's bytes), code e being code(e): for
// kernels that write each byte of the stream from its own thread.
template <typename Code>
CC_HD uint8_t PackedByteAt(Code code, size_t n, int bits, size_t b) {
  const size_t bit0 = 8 * b, bb = static_cast<size_t>(bits);
  uint32_t acc = 0;
  for (size_t e = bit0 / bb; e < n && e * bb < bit0 + 8; ++e) {
    const uint32_t c = code(e);
    acc |= e * bb >= bit0 ? c << (e * bb - bit0) : c >> (bit0 - e * bb);
  }
  return static_cast<uint8_t>(acc);
}

// Bits [bit, bit + bits) of a little-endian bit stream of `bytes` bytes (bits <= 16): one code, read where it lies.
// Without branches (the three bytes that can hold it, those inside the stream), so that a GPU thread can issue the
// loads of several codes before it uses any.
CC_HD uint32_t ReadBits(const uint8_t* p, size_t bytes, size_t bit, int bits) {
  const size_t first = bit / 8;
  const int shift = static_cast<int>(bit % 8);
  uint32_t acc = p[first];
  acc |= (first + 1 < bytes ? static_cast<uint32_t>(p[first + 1]) : 0u) << 8;
  acc |= (first + 2 < bytes ? static_cast<uint32_t>(p[first + 2]) : 0u) << 16;
  return (acc >> shift) & ((1u << bits) - 1u);
}

struct BitWriter {
  uint8_t* out;
  uint64_t acc = 0;
  int fill = 0;
  CC_HD explicit BitWriter(void* dst) : out(static_cast<uint8_t*>(dst)) {}
  CC_HD void Put(uint32_t v, int bits) {
    acc |= static_cast<uint64_t>(v) << fill;
    fill += bits;
    while (fill >= 8) {
      *out++ = static_cast<uint8_t>(acc);
      acc >>= 8;
      fill -= 8;
    }
  }
  CC_HD void Flush() {
    if (fill > 0) *out++ = static_cast<uint8_t>(acc);
    acc = 0;
    fill = 0;
  }
};

struct BitReader {
  const uint8_t* in;
  uint64_t acc = 0;
  int fill = 0;
  CC_HD explicit BitReader(const void* src) : in(static_cast<const uint8_t*>(src)) {}
  CC_HD uint32_t Get(int bits) {
    while (fill < bits) {
      acc |= static_cast<uint64_t>(*in++) << fill;
      fill += 8;
    }
    uint32_t v = static_cast<uint32_t>(acc & ((1ull << bits) - 1));
    acc >>= bits;
    fill -= bits;
    return v;
  }
};

// Up to 128 bits of a little-endian stream in two words: eight lanes of up to 16 bits, which fill exactly laneBits
// bytes. Lanes are put and got at bit offsets; two such words are added as 128-bit integers.
struct Bits128 {
  uint64_t lo = 0, hi = 0;
};

CC_HD void PutBits(Bits128* w, uint32_t v, int bit) {
  if (bit >= 64) {
    w->hi |= static_cast<uint64_t>(v) << (bit - 64);
    return;
  }
  w->lo |= static_cast<uint64_t>(v) << bit;
  if (bit > 32) w->hi |= static_cast<uint64_t>(v) >> (64 - bit);  // v has at most 32 bits
}

CC_HD uint32_t GetBits(const Bits128& w, int bit, int bits) {
  uint64_t v = bit >= 64 ? w.hi >> (bit - 64) : w.lo >> bit;
  if (bit > 0 && bit < 64) v |= w.hi << (64 - bit);
  return static_cast<uint32_t>(v & ((uint64_t{1} << bits) - 1));
}

// All its loads are issued before any is used (a GPU thread then waits for memory once, not once per byte).
CC_HD Bits128 LoadBits(const uint8_t* p, size_t bytes) {
  uint8_t b[16];
CC_UNROLL
  for (size_t i = 0; i < 16; ++i) b[i] = i < bytes ? p[i] : 0;
  Bits128 w;
CC_UNROLL
  for (size_t i = 0; i < 8; ++i) {
    w.lo |= static_cast<uint64_t>(b[i]) << (8 * i);
    w.hi |= static_cast<uint64_t>(b[i + 8]) << (8 * i);
  }
  return w;
}

CC_HD void StoreBits(const Bits128& w, uint8_t* p, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(i < 8 ? w.lo >> (8 * i) : w.hi >> (8 * (i - 8)));
}

CC_HD Bits128 AddBits(const Bits128& a, const Bits128& b) {
  Bits128 s;
  s.lo = a.lo + b.lo;
  s.hi = a.hi + b.hi + (s.lo < a.lo ? 1u : 0u);
  return s;
}

// dst = a + b as little-endian integers of `bytes` bytes. When every lane of the two streams sums without
// overflowing its width, this adds all lanes at once: carries stay inside lanes, even across word boundaries.
// dst may alias a or b.
CC_HD void AddPackedStreams(void* dst, const void* a, const void* b, size_t bytes) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  uint64_t carry = 0;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t u, v;
    __builtin_memcpy(&u, x + i, 8);
    __builtin_memcpy(&v, y + i, 8);
    uint64_t s = u + v;
    uint64_t c1 = s < u;
    uint64_t t = s + carry;
    carry = c1 | (t < s);
    __builtin_memcpy(d + i, &t, 8);
  }
  for (; i < bytes; ++i) {
    uint32_t s = static_cast<uint32_t>(x[i]) + y[i] + static_cast<uint32_t>(carry);
    d[i] = static_cast<uint8_t>(s);
    carry = s >> 8;
  }
}

}  // namespace ccoll
