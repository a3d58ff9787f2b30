// What every schedule receives: the arguments of one collective call, already validated by the entry point.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccoll.h"

namespace ccoll {

struct CollArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements: all-reduce and broadcast total; reduce-scatter per rank out; all-gather per rank in
  ccDataType_t dtype = ccFloat32;
  ccRedOp_t op = ccSum;
  int root = 0;
  size_t eltSize = 4;
  // send and recv are memory of the communicator's CUDA device, and the call runs on its proxy thread on them: with
  // device codecs (compressed all-reduces with a codec that DeviceCodecCovers), or with the device BufferOps (exact
  // calls, when every transport carries device memory). Every other device call is staged through host memory.
  bool onDevice = false;
  // The call check agreed that no rank runs this call in a device codec (each runs the host schedule, on its buffers
  // or on staging), so the host schedule's segments are the same on every rank. False where the check did not run.
  bool everyRankOnHost = false;
  // The type the float32 result is narrowed to after the call (a device codec's 16-bit data, worked on in a widened
  // copy), for error feedback that keeps that rounding (collectives/sparse.h); ccFloat32 when it is not narrowed.
  ccDataType_t narrowedTo = ccFloat32;
};

// Byte pointer arithmetic in elements.
inline const char* At(const void* base, size_t elems, size_t eltSize) {
  return static_cast<const char*>(base) + elems * eltSize;
}
inline char* At(void* base, size_t elems, size_t eltSize) { return static_cast<char*>(base) + elems * eltSize; }

// Tag of message `index` of collective `seq`: both ends compute it from the schedule alone.
inline uint64_t Tag(uint64_t seq, uint64_t index) { return (seq << 32) | (index & 0xffffffffu); }

// Splits n items into `parts` nearly equal contiguous parts; the first n % parts get one more.
inline size_t PartOffset(size_t n, int parts, int i) {
  size_t base = n / parts, rem = n % parts;
  return base * i + (static_cast<size_t>(i) < rem ? i : rem);
}
inline size_t PartSize(size_t n, int parts, int i) { return n / parts + (static_cast<size_t>(i) < n % parts ? 1 : 0); }

inline int Mod(int a, int n) { return ((a % n) + n) % n; }

// Round `round` of chunk `chunk` (of `nchunks` near-equal chunks of `total` elements), in slices of sliceElems:
// the elements it covers, clipped to the chunk (count 0 when the chunk is shorter).
struct Slice {
  size_t offset;  // element offset in the buffer
  size_t count;
};

inline Slice ChunkSlice(size_t total, int nchunks, int chunk, size_t round, size_t sliceElems) {
  size_t off = PartOffset(total, nchunks, chunk);
  size_t size = PartSize(total, nchunks, chunk);
  size_t begin = round * sliceElems < size ? round * sliceElems : size;
  size_t end = begin + sliceElems < size ? begin + sliceElems : size;
  return Slice{off + begin, end - begin};
}

}  // namespace ccoll
