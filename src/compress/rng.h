// The counter-based random generator of every codec. Its definition is part of the wire contract: the CPU drivers
// and the CUDA kernels must produce the same bits for the same (key, counter), so it is plain 32-bit integer math.
// One call yields 32 random bits: 32 rotation signs, or two 16-bit dithers.
#pragma once

#include <cstdint>

#include "compress/host_device.h"

namespace ccoll {

// A 32-bit finalizer with good avalanche (the "lowbias32" constants).
CC_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// A stream key from the things randomness must depend on: the compressor's seed, its call counter, the rank (or
// ~0u when all ranks must draw the same bits) and a purpose tag that separates independent uses.
CC_HD uint32_t StreamKey(uint64_t seed, uint64_t call, uint32_t rank, uint32_t purpose) {
  uint32_t k = Mix32(static_cast<uint32_t>(seed) ^ 0x9e3779b9u);
  k = Mix32(k ^ static_cast<uint32_t>(seed >> 32));
  k = Mix32(k ^ static_cast<uint32_t>(call));
  k = Mix32(k ^ static_cast<uint32_t>(call >> 32) ^ 0x85ebca6bu);
  k = Mix32(k ^ rank);
  return Mix32(k ^ purpose);
}

// 32 random bits number `counter` of the stream `key`.
CC_HD uint32_t RandomWord(uint32_t key, uint32_t counter) { return Mix32(key ^ Mix32(counter + 0x632be5abu)); }

// RandomWord over a 64-bit counter: RandomWord's words below 2^32, and for each further 2^32 counters a stream of
// another key (for streams that can outgrow 32-bit counters: PowerSGD's random start of a very wide Q).
CC_HD uint32_t RandomWord64(uint32_t key, uint64_t counter) {
  const uint32_t high = static_cast<uint32_t>(counter >> 32);
  return RandomWord(high == 0 ? key : Mix32(key ^ high ^ 0x27d4eb2fu), static_cast<uint32_t>(counter));
}

// The random sign of element i (+1 or -1 as 0 or 1 bit).
CC_HD uint32_t SignBit(uint32_t key, uint64_t i) {
  return (RandomWord(key, static_cast<uint32_t>(i >> 5)) >> (i & 31)) & 1u;
}

// A dither in (0, 1) from 16 random bits, centred in its bin.
CC_HD float DitherFromBits(uint32_t bits16) { return (static_cast<float>(bits16) + 0.5f) * (1.0f / 65536.0f); }

// The dither of element i (its index taken modulo 2^32): the low half of word i/2 for even i, the high half for
// odd i, so one hash serves two elements.
CC_HD float Dither(uint32_t key, uint32_t i) {
  uint32_t w = RandomWord(key, i >> 1);
  return DitherFromBits((i & 1) ? (w >> 16) : (w & 0xffffu));
}

// Purpose tags.
enum : uint32_t {
  kPurposeRotation = 1,
  kPurposeDither = 2,
  kPurposeShared = 3,
  kPurposeChunks = 4,
  kPurposeLowRank = 5,
};

}  // namespace ccoll
