// The codec contract: what happens to the data of a compressed all-reduce between transport steps. A schedule
// drives it; a codec never sees a transport or a schedule.
//
// Per call: Prepare (local pre-pass: error feedback, rotation, small metadata) -> the schedule all-reduces the
// metadata exactly (MetaOp) -> SetMeta -> per slice: EncodeFirst at a chunk's first ring step, Hop at every
// intermediate step (decode + reduce + re-encode, or the packed integer add of homomorphic codes), ReduceFinal at
// the owner (the last reduction; it produces the all-gather payload), DecodeGather on every rank, owner included,
// so that all ranks decode the same bytes -> Finish (inverse rotation, avg, error-feedback update).
//
// Slices are named by their global element offset and length: codecs index their randomness and scale groups
// globally, so results do not depend on how the schedule cuts the buffer. All lengths of wire messages are
// functions of (offset, length) alone, so a receiver always knows how many bytes to expect.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ccoll.h"

namespace ccoll {

class Codec {
 public:
  virtual ~Codec() = default;

  // Upper bound of any wire message for `len` elements.
  virtual size_t MaxWireBytes(size_t len) const = 0;
  // Bytes of the reduce-scatter messages and of the all-gather payload for a slice.
  virtual size_t HopBytes(size_t off, size_t len) const = 0;
  virtual size_t GatherBytes(size_t off, size_t len) const = 0;

  // Local pre-pass over the whole buffer: `work` (count floats) receives what the ring reduces (the rotated input
  // plus error feedback). Fills `meta` with the values all ranks must agree on, reduced with MetaOp.
  virtual void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) = 0;
  virtual ccRedOp_t MetaOp() const { return ccMax; }
  virtual void SetMeta(const std::vector<float>& agreed) {}

  // The slice [off, off+len) of this rank's `work` starts a chunk's reduction.
  virtual size_t EncodeFirst(const float* local, size_t off, size_t len, void* wireOut) = 0;
  // Adds this rank's slice to a partial result in flight.
  virtual size_t Hop(const void* wireIn, const float* local, size_t off, size_t len, void* wireOut) = 0;
  // The last addition, at the chunk's owner: returns the all-gather payload.
  virtual size_t ReduceFinal(const void* wireIn, const float* local, size_t off, size_t len, void* wireOut) = 0;
  // Every rank turns the all-gather payload into the result slice.
  virtual void DecodeGather(const void* wire, size_t off, size_t len, float* out) = 0;

  // After the schedule: `work` holds the (rotated) sum; turn it into the result in place.
  virtual void Finish(float* work, size_t count, bool average) = 0;
};

}  // namespace ccoll
