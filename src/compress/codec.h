// The codec contract: what happens to the data of a compressed all-reduce between transport steps. A schedule
// drives it; a codec never sees a transport or a schedule.
//
// Per call: Prepare (local pre-pass: error feedback, rotation, small metadata) -> the schedule all-reduces the
// metadata exactly (MetaOp) -> SetMeta -> per slice: Hop wherever partial results meet this rank's data (a ring
// step takes one incoming message, a tree node one per child, a chunk's first step or a leaf none): decode + reduce
// + re-encode, or the packed integer add of homomorphic codes; ReduceFinal where the last contribution is added
// (the ring's chunk owner, the tree's root): it produces the all-gather / broadcast payload; DecodeGather on every
// rank, the producer included, so that all ranks decode the same bytes -> Finish (inverse rotation, avg).
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
  virtual void SetMeta(const std::vector<float>& /*agreed*/) {}

  // Adds this rank's slice [off, off+len) of `work` to the nin (0..2) partial results in flight; returns the
  // bytes of the message to pass on (HopBytes).
  virtual size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) = 0;
  // The last addition: returns the all-gather payload (GatherBytes).
  virtual size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                             void* wireOut) = 0;
  // Every rank turns the all-gather payload into the result slice.
  virtual void DecodeGather(const void* wire, size_t off, size_t len, float* out) = 0;

  // After the schedule: `work` holds the (rotated) sum; turn it into the result in place.
  virtual void Finish(float* work, size_t count, bool average) = 0;

  // Optional, called before Prepare by a schedule that passes Hop and ReduceFinal local == work + off and
  // DecodeGather out == work + off (work as given to Prepare): a codec whose pre-pass and Finish go block by block
  // may then do them inside the ring (Prepare records the buffers, a hop prepares the blocks it touches, the
  // all-gather decode finishes the blocks it completes, Finish has nothing left), so they overlap the transfers.
  // `average` is the op the caller will pass to Finish.
  virtual void PipelinePrepareAndFinish(bool /*average*/) {}

  // Optional, after PipelinePrepareAndFinish, for 16-bit data (compress/widen.h): true when the codec widens the
  // 16-bit `input` (count values of `dtype`) into work block by block as its pipelined pre-pass reads it, and narrows
  // every finished block into `output` (which may be `input`: a block is read before it is written). Prepare's input
  // is then not read, and after Finish `output` holds the result. False: the caller widens and narrows in passes.
  virtual bool PipelineHalfData(ccDataType_t /*dtype*/, const void* /*input*/, void* /*output*/) { return false; }

  // Optional, after PipelinePrepareAndFinish, for a caller that runs the call in segments (collectives/compressed.cc):
  // the alignment of segment boundaries when the pre-pass can be split so, 0 when it cannot. Then, instead of
  // Prepare: BeginSegments once, and for each segment [begin, end) in order (begin and end multiples of the
  // alignment, or end == count) PrepareRange over consecutive parts of it, each writing MetaCount(part) values of
  // meta (the part's share of what Prepare would have written), then SetMetaRange with the segment's agreed meta
  // before the schedule runs over it. The result is Prepare's, byte for byte.
  virtual size_t SegmentAlign() const { return 0; }
  virtual void BeginSegments(const float* /*input*/, float* /*work*/, size_t /*count*/) {}
  virtual size_t MetaCount(size_t /*begin*/, size_t /*end*/) const { return 0; }
  virtual void PrepareRange(size_t /*begin*/, size_t /*end*/, float* /*meta*/) {}
  virtual void SetMetaRange(size_t /*begin*/, size_t /*end*/, const float* /*agreed*/) {}
};

}  // namespace ccoll
