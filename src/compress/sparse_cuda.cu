// CUDA kernels of the chunk sparsifiers (sparse.cc) and of the error feedback of every codec that keeps one: chunk
// norms in the CPU's order (so every rank, and the host path, picks the same chunks), the choice of chunks itself
// (CUB's radix sort, for the stream-ordered path, which cannot ask the host), gather and scatter of the chosen chunks,
// and the memory's passes (add the gradient in, keep what was not sent).
#include <cuda_runtime.h>

#include <cmath>
#include <cub/device/device_radix_sort.cuh>

#include "compress/codec_cuda.h"
#include "compress/rng.h"
#include "compress/sparse_math.h"
#include "core/cuda_result.h"

namespace ccoll {
namespace gpu {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

// Chunk norms: eight threads per chunk (a warp holds four chunks, and each of its loads reads one 32-byte sector per
// chunk). Thread j sums the squares of x[j], x[j + 8], ... (ChunkPartialSquares), and a butterfly over the eight
// lanes adds the partial sums as ChunkSquaredNorm's pairwise tree does (compress/sparse_math.h). +inf when not
// finite.

// Thread t's chunk, and its partial sum's index j.
__device__ void ChunkThread(size_t* c, unsigned* j) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  *c = t / 8;
  *j = static_cast<unsigned>(t % 8);
}

// The butterfly and the store. Every lane of the warp takes part in the shuffles (blocks are whole warps, and lanes
// past the last chunk bring zeros), so no thread may return before it.
__device__ void StoreChunkNorm(double s, size_t c, unsigned j, size_t chunks, float* norms) {
  for (int m = 1; m < 8; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (c < chunks && j == 0) norms[c] = isfinite(s) ? static_cast<float>(s) : INFINITY;
}

__global__ void ChunkNormsKernel(const float* x, size_t count, size_t chunk, size_t chunks, float* norms) {
  size_t c;
  unsigned j;
  ChunkThread(&c, &j);
  const size_t begin = c * chunk;
  const double s = c < chunks ? ChunkPartialSquares(x + begin, count - begin < chunk ? count - begin : chunk, j) : 0.0;
  StoreChunkNorm(s, c, j, chunks, norms);
}

// The same over e += g (the pre-pass of a sparsifier with error feedback: one pass instead of an add and the norms).
__global__ void AddIntoChunkNormsKernel(float* e, const float* g, size_t count, size_t chunk, size_t chunks,
                                        float* norms) {
  size_t c;
  unsigned j;
  ChunkThread(&c, &j);
  const size_t begin = c * chunk;
  const double s =
      c < chunks ? ChunkPartialSquaresAdding(e + begin, g + begin, count - begin < chunk ? count - begin : chunk, j)
                 : 0.0;
  StoreChunkNorm(s, c, j, chunks, norms);
}

// One thread per packed element. chosen is increasing, so only the last chosen chunk can be short and packed chunk
// k starts at k * chunk. Index: 32-bit when the packed positions fit (a 64-bit division costs more than the copy).
template <typename Index>
__device__ size_t ChunkPosition(const uint32_t* chosen, Index chunk, Index p) {
  return static_cast<size_t>(chosen[p / chunk]) * chunk + p % chunk;
}

template <typename Index>
__global__ void GatherChunksKernel(const float* x, size_t count, Index chunk, const uint32_t* chosen, Index packed,
                                   float* out) {
  const Index p = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packed) return;
  const size_t at = ChunkPosition(chosen, chunk, p);
  out[p] = at < count ? x[at] : 0.0f;
}

template <typename Index>
__global__ void ScatterChunksKernel(const float* in, size_t count, Index chunk, const uint32_t* chosen, Index packed,
                                    float* x) {
  const Index p = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packed) return;
  const size_t at = ChunkPosition(chosen, chunk, p);
  if (at < count) x[at] = in[p];
}

// Sort keys of the chunk choice, one thread per chunk, with the chunk indices as values: topk's summed norm (NaN as
// +inf, as TopChunks ranks it), randk's word of the shared stream.
__global__ void TopKeysKernel(const float* norms, size_t chunks, float* keys, uint32_t* index) {
  const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  keys[c] = isnan(norms[c]) ? INFINITY : norms[c];
  index[c] = static_cast<uint32_t>(c);
}

__global__ void RandomKeysKernel(size_t chunks, uint32_t key, uint32_t* keys, uint32_t* index) {
  const size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  keys[c] = RandomWord(key, static_cast<uint32_t>(c));
  index[c] = static_cast<uint32_t>(c);
}

__global__ void MarkNonFiniteKernel(const float* x, size_t count, float* mark) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(x[i])) *mark = __int_as_float(0x7fc00000);  // every writer writes the same quiet NaN
}

__global__ void PoisonIfMarkedKernel(float* x, size_t count, const float* mark) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(*mark)) x[i] = __int_as_float(0x7fc00000);
}

__global__ void FillKernel(float* x, size_t count, float value) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = value;
}

__global__ void AnyNonFiniteKernel(const float* x, size_t count, unsigned* flag) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(x[i])) atomicOr(flag, 1u);
}

__global__ void AddIntoKernel(float* acc, const float* x, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) acc[i] += x[i];
}

__global__ void KeepResidualKernel(float* e, const float* g, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float left = e[i] - g[i];
  e[i] = isfinite(left) ? left : 0.0f;
}

__global__ void DropNonFiniteKernel(float* e, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !isfinite(e[i])) e[i] = 0.0f;
}

// The chunk choice's scratch: sort keys and values in and out, then CUB's temporary storage for the sort of all chunks
// by key and of the k winners by index (the larger of the two).
struct ChoiceScratch {
  uint32_t* keysIn;
  uint32_t* keysOut;
  uint32_t* indexIn;
  uint32_t* indexOut;
  void* temp;
  size_t tempBytes;
};

size_t Align(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

size_t SortTempBytes(size_t chunks) {
  size_t pairs = 0, keys = 0, descending = 0;
  cub::DeviceRadixSort::SortPairs<uint32_t, uint32_t>(nullptr, pairs, nullptr, nullptr, nullptr, nullptr,
                                                      static_cast<int>(chunks));
  cub::DeviceRadixSort::SortPairsDescending<float, uint32_t>(nullptr, descending, nullptr, nullptr, nullptr, nullptr,
                                                             static_cast<int>(chunks));
  cub::DeviceRadixSort::SortKeys<uint32_t>(nullptr, keys, nullptr, nullptr, static_cast<int>(chunks));
  return std::max(pairs, std::max(descending, keys));
}

ChoiceScratch LayOut(void* scratch, size_t chunks) {
  char* p = static_cast<char*>(scratch);
  const size_t array = Align(chunks * sizeof(uint32_t));
  ChoiceScratch s;
  s.keysIn = reinterpret_cast<uint32_t*>(p);
  s.keysOut = reinterpret_cast<uint32_t*>(p + array);
  s.indexIn = reinterpret_cast<uint32_t*>(p + 2 * array);
  s.indexOut = reinterpret_cast<uint32_t*>(p + 3 * array);
  s.temp = p + 4 * array;
  s.tempBytes = SortTempBytes(chunks);
  return s;
}

// After the sort by key: the k winners (the first k of indexOut) in increasing order, into chosen.
ccResult_t SortWinners(const ChoiceScratch& s, size_t k, uint32_t* chosen, cudaStream_t stream) {
  size_t bytes = s.tempBytes;
  return CudaResult(cub::DeviceRadixSort::SortKeys(s.temp, bytes, s.indexOut, chosen, static_cast<int>(k), 0,
                                                   static_cast<int>(sizeof(uint32_t) * 8), stream),
                    "chunk choice: sorting the winners");
}

}  // namespace

size_t ChooseChunksScratchBytes(size_t chunks) {
  return 4 * Align(chunks * sizeof(uint32_t)) + SortTempBytes(chunks);
}

ccResult_t ChooseTopChunks(const float* norms, size_t chunks, size_t k, void* scratch, uint32_t* chosen,
                           cudaStream_t stream) {
  if (k == 0) return ccSuccess;
  ChoiceScratch s = LayOut(scratch, chunks);
  float* keysIn = reinterpret_cast<float*>(s.keysIn);
  float* keysOut = reinterpret_cast<float*>(s.keysOut);
  TopKeysKernel<<<Blocks(chunks), kThreads, 0, stream>>>(norms, chunks, keysIn, s.indexIn);
  CC_CHECK(Launched("chunk choice keys kernel launch"));
  // Largest first; the sort is stable and the indices start in order, so equal norms go to the lower index.
  size_t bytes = s.tempBytes;
  CC_CHECK(CudaResult(cub::DeviceRadixSort::SortPairsDescending(s.temp, bytes, keysIn, keysOut, s.indexIn, s.indexOut,
                                                                static_cast<int>(chunks), 0, 32, stream),
                      "chunk choice: sorting the norms"));
  return SortWinners(s, k, chosen, stream);
}

ccResult_t ChooseRandomChunks(size_t chunks, size_t k, uint32_t key, void* scratch, uint32_t* chosen,
                              cudaStream_t stream) {
  if (k == 0) return ccSuccess;
  ChoiceScratch s = LayOut(scratch, chunks);
  RandomKeysKernel<<<Blocks(chunks), kThreads, 0, stream>>>(chunks, key, s.keysIn, s.indexIn);
  CC_CHECK(Launched("chunk choice keys kernel launch"));
  // Smallest first, ties to the lower index (stable).
  size_t bytes = s.tempBytes;
  CC_CHECK(CudaResult(cub::DeviceRadixSort::SortPairs(s.temp, bytes, s.keysIn, s.keysOut, s.indexIn, s.indexOut,
                                                      static_cast<int>(chunks), 0, 32, stream),
                      "chunk choice: sorting the words"));
  return SortWinners(s, k, chosen, stream);
}

ccResult_t MarkNonFinite(const float* x, size_t count, float* mark, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  MarkNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, mark);
  return Launched("non-finite mark kernel launch");
}

ccResult_t PoisonIfMarked(float* x, size_t count, const float* mark, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  PoisonIfMarkedKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, mark);
  return Launched("poison kernel launch");
}

namespace {

// CUB's sort kernels are kernels of this file too, but templates inside CUB that no LoadKernel can name: the chunk
// choice runs here once on a small and a large input, so that every sort it launches (single-tile and multi-pass, of
// each kind) is loaded before any stream of the device waits (collectives/device_prepare.h). 2^17 chunks is well
// past CUB's single-tile sizes; the scratch is about 3 MiB, freed at once.
ccResult_t LoadChoiceKernels() {
  const size_t large = size_t{1} << 17;
  const size_t scratchBytes = ChooseChunksScratchBytes(large);
  cudaStream_t stream = nullptr;
  CC_CHECK(CudaResult(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "loading the chunk choice: stream"));
  void* mem = nullptr;
  cudaError_t e = cudaMalloc(&mem, scratchBytes + 2 * Align(large * sizeof(uint32_t)));
  ccResult_t r = CudaResult(e, "loading the chunk choice: cudaMalloc");
  if (r == ccSuccess) {
    float* norms = reinterpret_cast<float*>(static_cast<char*>(mem) + scratchBytes);
    uint32_t* chosen = reinterpret_cast<uint32_t*>(static_cast<char*>(mem) + scratchBytes + Align(large * 4));
    r = CudaResult(cudaMemsetAsync(norms, 0, large * sizeof(float), stream), "loading the chunk choice: memset");
    for (size_t chunks : {size_t{16}, large}) {
      if (r == ccSuccess) r = ChooseTopChunks(norms, chunks, chunks / 2, mem, chosen, stream);
      if (r == ccSuccess) r = ChooseRandomChunks(chunks, chunks / 2, 1u, mem, chosen, stream);
    }
    if (r == ccSuccess) r = CudaResult(cudaStreamSynchronize(stream), "loading the chunk choice: synchronize");
    IgnoreCuda(cudaFree(mem));
  }
  IgnoreCuda(cudaStreamDestroy(stream));
  return r;
}

}  // namespace

ccResult_t LoadSparseKernels() {
  CC_CHECK(LoadChoiceKernels());
  CC_CHECK(LoadKernel(ChunkNormsKernel, "loading ChunkNormsKernel"));
  CC_CHECK(LoadKernel(AddIntoChunkNormsKernel, "loading AddIntoChunkNormsKernel"));
  CC_CHECK(LoadKernel(TopKeysKernel, "loading TopKeysKernel"));
  CC_CHECK(LoadKernel(RandomKeysKernel, "loading RandomKeysKernel"));
  CC_CHECK(LoadKernel(MarkNonFiniteKernel, "loading MarkNonFiniteKernel"));
  CC_CHECK(LoadKernel(PoisonIfMarkedKernel, "loading PoisonIfMarkedKernel"));
  CC_CHECK(LoadKernel(GatherChunksKernel<uint32_t>, "loading GatherChunksKernel"));
  CC_CHECK(LoadKernel(GatherChunksKernel<size_t>, "loading GatherChunksKernel (64-bit)"));
  CC_CHECK(LoadKernel(ScatterChunksKernel<uint32_t>, "loading ScatterChunksKernel"));
  CC_CHECK(LoadKernel(ScatterChunksKernel<size_t>, "loading ScatterChunksKernel (64-bit)"));
  CC_CHECK(LoadKernel(FillKernel, "loading FillKernel"));
  CC_CHECK(LoadKernel(AnyNonFiniteKernel, "loading AnyNonFiniteKernel"));
  CC_CHECK(LoadKernel(AddIntoKernel, "loading AddIntoKernel"));
  CC_CHECK(LoadKernel(KeepResidualKernel, "loading KeepResidualKernel"));
  return LoadKernel(DropNonFiniteKernel, "loading DropNonFiniteKernel");
}

ccResult_t ChunkNorms(const float* x, size_t count, size_t chunk, float* norms, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  const size_t chunks = (count + chunk - 1) / chunk;
  ChunkNormsKernel<<<Blocks(8 * chunks), kThreads, 0, stream>>>(x, count, chunk, chunks, norms);
  return Launched("chunk norms kernel launch");
}

ccResult_t AddIntoChunkNorms(float* e, const float* g, size_t count, size_t chunk, float* norms, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  const size_t chunks = (count + chunk - 1) / chunk;
  AddIntoChunkNormsKernel<<<Blocks(8 * chunks), kThreads, 0, stream>>>(e, g, count, chunk, chunks, norms);
  return Launched("error feedback add and chunk norms kernel launch");
}

// 32-bit index math when the chunk and the packed positions fit (the last block's threads too).
bool Index32(size_t chunk, size_t packed) { return chunk <= 0xffffffffu && packed <= 0xffffffffu - kThreads; }

ccResult_t GatherChunks(const float* x, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* out,
                        cudaStream_t stream) {
  if (packed == 0) return ccSuccess;
  if (Index32(chunk, packed)) {
    GatherChunksKernel<uint32_t><<<Blocks(packed), kThreads, 0, stream>>>(
        x, count, static_cast<uint32_t>(chunk), chosen, static_cast<uint32_t>(packed), out);
  } else {
    GatherChunksKernel<size_t><<<Blocks(packed), kThreads, 0, stream>>>(x, count, chunk, chosen, packed, out);
  }
  return Launched("gather chunks kernel launch");
}

ccResult_t ScatterChunks(const float* in, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* x,
                         cudaStream_t stream) {
  if (packed == 0) return ccSuccess;
  if (Index32(chunk, packed)) {
    ScatterChunksKernel<uint32_t><<<Blocks(packed), kThreads, 0, stream>>>(
        in, count, static_cast<uint32_t>(chunk), chosen, static_cast<uint32_t>(packed), x);
  } else {
    ScatterChunksKernel<size_t><<<Blocks(packed), kThreads, 0, stream>>>(in, count, chunk, chosen, packed, x);
  }
  return Launched("scatter chunks kernel launch");
}

ccResult_t Fill(float* x, size_t count, float value, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  FillKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, value);
  return Launched("fill kernel launch");
}

ccResult_t AnyNonFinite(const float* x, size_t count, unsigned* flag, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  AnyNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, flag);
  return Launched("non-finite check kernel launch");
}

ccResult_t AddInto(float* acc, const float* x, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  AddIntoKernel<<<Blocks(count), kThreads, 0, stream>>>(acc, x, count);
  return Launched("error feedback add kernel launch");
}

ccResult_t KeepResidual(float* e, const float* g, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  KeepResidualKernel<<<Blocks(count), kThreads, 0, stream>>>(e, g, count);
  return Launched("error feedback residual kernel launch");
}

ccResult_t DropNonFinite(float* e, size_t count, cudaStream_t stream) {
  if (count == 0) return ccSuccess;
  DropNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(e, count);
  return Launched("error feedback cleanup kernel launch");
}

}  // namespace gpu
}  // namespace ccoll
