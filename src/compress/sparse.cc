#include "compress/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "compress/cpu_clones.h"  // the norms vectorize: exact squares, sums in a fixed order
#include "compress/rng.h"
#include "compress/sparse_math.h"
#include "compress/widen.h"

namespace ccoll {

size_t ChunkCount(size_t count, size_t chunk) { return (count + chunk - 1) / chunk; }

bool ChunksFit(size_t count, size_t chunk, std::string* why) {
  const size_t most = static_cast<size_t>(std::numeric_limits<int>::max());
  const size_t chunks = ChunkCount(count, chunk);
  if (chunks <= most) return true;
  *why = std::to_string(count) + " elements make " + std::to_string(chunks) + " chunks of " + std::to_string(chunk) +
         ", more than the 2^31 - 1 a sparsifier numbers: use a chunk of at least " +
         std::to_string(ChunkCount(count, most)) + " (chunk=)";
  return false;
}

size_t KeptChunks(size_t chunks, int64_t densityPpm) {
  if (chunks == 0) return 0;
  size_t k = static_cast<size_t>(std::llround(static_cast<double>(chunks) * static_cast<double>(densityPpm) / 1e6));
  return std::min(chunks, std::max<size_t>(1, k));
}

CC_HOT void ChunkNormsOf(const float* x, size_t count, size_t chunk, size_t first, size_t last, float* norms) {
  for (size_t c = first; c < last; ++c) {
    size_t begin = c * chunk, end = std::min(count, begin + chunk);
    const double sq = ChunkSquaredNorm(x + begin, end - begin);
    norms[c] = std::isfinite(sq) ? static_cast<float>(sq) : std::numeric_limits<float>::infinity();
  }
}

void ChunkNorms(const float* x, size_t count, size_t chunk, std::vector<float>* norms) {
  const size_t chunks = ChunkCount(count, chunk);
  norms->assign(chunks, 0.0f);
  ChunkNormsOf(x, count, chunk, 0, chunks, norms->data());
}

void TopChunks(const std::vector<float>& norms, size_t k, std::vector<uint32_t>* chosen) {
  std::vector<uint32_t> order(norms.size());
  std::iota(order.begin(), order.end(), 0u);
  auto key = [&](uint32_t i) { return std::isnan(norms[i]) ? std::numeric_limits<float>::infinity() : norms[i]; };
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(k), order.end(), [&](uint32_t a, uint32_t b) {
    float ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  });
  chosen->assign(order.begin(), order.begin() + static_cast<long>(k));
  std::sort(chosen->begin(), chosen->end());
}

void RandomChunks(size_t chunks, size_t k, uint32_t key, std::vector<uint32_t>* chosen) {
  // Each chunk draws a word from the shared counter-based stream; the k smallest (ties to the lower index) win: a
  // uniform k-subset, and a selection a GPU makes with one radix sort (sparse_cuda.cu: ChooseRandomChunks). Word and
  // index packed in one integer order as (word, index) does.
  std::vector<uint64_t> keyed(chunks);
  for (size_t i = 0; i < chunks; ++i) keyed[i] = (uint64_t{RandomWord(key, static_cast<uint32_t>(i))} << 32) | i;
  if (k < chunks) std::nth_element(keyed.begin(), keyed.begin() + static_cast<long>(k), keyed.end());
  chosen->resize(k);
  for (size_t i = 0; i < k; ++i) (*chosen)[i] = static_cast<uint32_t>(keyed[i]);
  std::sort(chosen->begin(), chosen->end());
}

size_t PackedCount(size_t count, size_t chunk, const std::vector<uint32_t>& chosen) {
  size_t total = 0;
  ForEachChosen(count, chunk, chosen, [&](size_t, size_t n, size_t) { total += n; });
  return total;
}

void GatherChunks(const float* x, size_t count, size_t chunk, const std::vector<uint32_t>& chosen, float* packed) {
  ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t n, size_t at) {
    std::memcpy(packed + at, x + begin, n * sizeof(float));
  });
}

void ScatterChunks(const float* packed, size_t count, size_t chunk, const std::vector<uint32_t>& chosen, float* x) {
  ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t n, size_t at) {
    std::memcpy(x + begin, packed + at, n * sizeof(float));
  });
}

void ScatterChunksNarrowed(ccDataType_t dtype, const float* packed, size_t count, size_t chunk,
                           const std::vector<uint32_t>& chosen, void* x) {
  uint16_t* h = static_cast<uint16_t*>(x);
  ForEachChosen(count, chunk, chosen, [&](size_t begin, size_t n, size_t at) {
    Narrow(dtype, packed + at, n, h + begin);
  });
}

}  // namespace ccoll
