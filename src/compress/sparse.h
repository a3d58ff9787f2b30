// Chunk selection of the all-reduce-compatible sparsifiers: every rank picks the same chunks, so only those travel
// (dense inside) through an ordinary all-reduce. topk ranks chunks by their squared norms summed over ranks (the
// metadata all-reduce); randk draws them from the shared seed of the call, with no metadata round.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ccoll.h"

namespace ccoll {

// Number of chunks of `chunk` elements covering count (the last may be short) and how many are kept at density
// `densityPpm` (at least one).
size_t ChunkCount(size_t count, size_t chunk);
size_t KeptChunks(size_t chunks, int64_t densityPpm);
// Chunks are numbered in 32 bits (the chosen indices, randk's (word, index) sort keys), and the device's chunk choice
// sorts them with CUB, which counts items in an int: false, saying why, for a bucket of more than 2^31 - 1 chunks, on
// every path alike.
bool ChunksFit(size_t count, size_t chunk, std::string* why);

// Squared L2 norm of every chunk of x (compress/sparse_math.h's order), rounded to float. A chunk holding a non-finite
// value reports +inf, so it is always sent and every rank sees the non-finite result.
void ChunkNorms(const float* x, size_t count, size_t chunk, std::vector<float>* norms);
// The same for chunks [first, last) only: norms[c] for each (norms holds every chunk's slot).
void ChunkNormsOf(const float* x, size_t count, size_t chunk, size_t first, size_t last, float* norms);

// The k chunks of largest summed norm, ties to the lower index, returned in increasing index order.
void TopChunks(const std::vector<float>& norms, size_t k, std::vector<uint32_t>* chosen);

// k distinct chunks of `chunks` drawn from the stream `key` (the same on every rank), increasing index order: the k
// chunks whose words RandomWord(key, index) are smallest, ties to the lower index.
void RandomChunks(size_t chunks, size_t k, uint32_t key, std::vector<uint32_t>* chosen);

// Calls f(begin, n, packedOffset) for each chosen chunk, in order: its first element, its length (the last chunk may
// be short) and where it starts in the packed values.
template <typename F>
void ForEachChosen(size_t count, size_t chunk, const std::vector<uint32_t>& chosen, F&& f) {
  size_t packed = 0;
  for (uint32_t c : chosen) {
    const size_t begin = c * chunk, n = std::min(count, begin + chunk) - begin;
    f(begin, n, packed);
    packed += n;
  }
}

// Copies the chosen chunks of x into packed (contiguous, in order) and back.
void GatherChunks(const float* x, size_t count, size_t chunk, const std::vector<uint32_t>& chosen, float* packed);
void ScatterChunks(const float* packed, size_t count, size_t chunk, const std::vector<uint32_t>& chosen, float* x);
// The same into 16-bit data (`dtype` ccBfloat16 or ccFloat16), each value rounded as compress/widen.h's Narrow does.
void ScatterChunksNarrowed(ccDataType_t dtype, const float* packed, size_t count, size_t chunk,
                           const std::vector<uint32_t>& chosen, void* x);
// Elements the chosen chunks hold (the last chunk may be short).
size_t PackedCount(size_t count, size_t chunk, const std::vector<uint32_t>& chosen);

}  // namespace ccoll
