// CUDA drivers of the codecs' element math (the same __host__ __device__ functions as the CPU drivers in
// quant_cpu.h and cast16.cc, built without FMA contraction), so that a GPU encode writes the same bytes as the CPU
// encode of the same input. Every pointer is device memory; work is queued on `stream` and nothing waits for it.
// Only built with CCOLL_ENABLE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ccoll.h"
#include "compress/lanes_tile.h"
#include "compress/quant_cpu.h"
#include "compress/quant_math.h"
#include "compress/requant_tile.h"

namespace ccoll {
namespace gpu {

// The rotation of quant_cpu.h's RotateForward / RotateInverse (one thread block per rotation block, the block held
// in shared memory; block <= 16384).
ccResult_t RotateForward(const float* in, float* out, size_t count, size_t block, uint32_t signKey,
                         cudaStream_t stream);
// done (may be null): one flag per full block; the blocks marked there are left as they are (DecodeRequantRotated
// rotated them back already).
ccResult_t RotateInverse(float* x, size_t count, size_t block, uint32_t signKey, float scale, const uint8_t* done,
                         cudaStream_t stream);

// Bytes of a requant message of len values.
size_t RequantBytes(size_t len, size_t group, int bits, ScaleFormat format);

// EncodeRequantSlice: per group a scale, then the packed codes. Groups of up to tile::kMaxGroup values
// (compress/requant_tile.h) are encoded by tiles: values staged in shared memory, one thread per group, codes packed
// coalesced. Larger groups take one thread per group reading device memory; when a group's codes end on a byte
// boundary (group * bits % 8 == 0) it packs them itself, otherwise `codes` (len values of scratch) holds them for a
// packing pass. The message has RequantBytes(len, group, bits, format) bytes.
ccResult_t EncodeRequant(const float* v, size_t len, uint64_t index0, size_t group, int bits, ScaleFormat format,
                         float clipK, const DitherRule& rule, uint16_t* codes, void* wireOut, cudaStream_t stream);
ccResult_t DecodeRequant(const void* wire, size_t len, size_t group, int bits, ScaleFormat format, float* out,
                         cudaStream_t stream);
// The requant hop, fused: decode the nin (0..2) arriving messages, add them to `local` (local first, then the
// messages in order, in fp32), and encode the sum with fresh scales. vals: len floats of scratch.
ccResult_t HopRequant(const void* const* wiresIn, int nin, const float* local, size_t len, uint64_t index0,
                      size_t group, int bits, ScaleFormat format, float clipK, const DitherRule& rule, float* vals,
                      uint16_t* codes, void* wireOut, cudaStream_t stream);

// The same with the rotation fused (requant_tile.h; group <= tile::kMaxGroup, block a power of two <=
// tile::kMaxFusedBlock): the slice [off, off + len) of the values is rotated in the tiles from `input`, the whole
// unrotated buffer of `count` values, which is only read. edgesRotated (in-place calls): the rotation blocks that
// hold the slice's first and last value and reach past the slice hold rotated values already (RotateBlockForward).
// DecodeRequantRotated decodes a requant message of that slice into out (element off at out[0]); the full rotation
// blocks inside the slice are rotated back there too (as RotateInverse with `scale`) and marked in done[block
// index]; the rest is left for RotateInverse(..., done) once every slice is decoded. Both equal the passes they
// replace byte for byte.
ccResult_t HopRequantRotated(const void* const* wiresIn, int nin, const float* input, size_t count, size_t block,
                             uint32_t signKey, bool edgesRotated, size_t off, size_t len, size_t group, int bits,
                             ScaleFormat format, float clipK, const DitherRule& rule, void* wireOut,
                             cudaStream_t stream);
// One rotation block of x, [base, base + len) (len a power of two), rotated forward in place.
ccResult_t RotateBlockForward(float* x, size_t base, size_t len, uint32_t signKey, cudaStream_t stream);
ccResult_t DecodeRequantRotated(const void* wire, size_t off, size_t len, size_t group, int bits, ScaleFormat format,
                                size_t count, size_t block, uint32_t signKey, float scale, uint8_t* done, float* out,
                                cudaStream_t stream);

// The homomorphic lanes by tiles (compress/lanes_tile.h; group <= tile::kMaxGroup, with a fused rotation's block <=
// tile::kMaxFusedBlock, else ccInternalError): the group scales, the hop (codes plus the arriving lane streams, one
// kernel) or the requantizing last hop, as the arguments' mode says; and the decode tile of requant_tile.h, of a
// requant message or (args built with LanesFrom) of lane sums, with the inverse rotation fused when the arguments
// say so. The arguments come from the builders of those headers; their bytes are the CPU codec's.
ccResult_t LanesTiles(const tile::LanesArgs& a, cudaStream_t stream);
ccResult_t DecodeTiles(const tile::DecodeArgs& a, cudaStream_t stream);

// Homomorphic lanes (quant_cpu.h's EncodeLanesSlice / DecodeLanesSlice and bitpack.h's AddPackedStreams); by the
// tiles above for groups up to tile::kMaxGroup:
// GroupScales writes GroupScaleOf of every group of `group` values of v[0..count) (one per group; the metadata the
// ranks agree on by max); EncodeLanes codes v[0..len) (global index index0) on the agreed scales of the global groups
// (`scales`, indexed by global group) into laneBits-bit lanes; AddLanes adds two such streams of len lanes lane by
// lane (dst may be a or b); DecodeLanes turns lane sums of nranks ranks back into values.
ccResult_t GroupScales(const float* v, size_t count, size_t group, float clipK, float* scales, cudaStream_t stream);
ccResult_t EncodeLanes(const float* v, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, const DitherRule& rule, void* wireOut, cudaStream_t stream);
ccResult_t AddLanes(void* dst, const void* a, const void* b, size_t len, int laneBits, cudaStream_t stream);
ccResult_t DecodeLanes(const void* wire, size_t len, uint64_t index0, size_t group, const float* scales, int bits,
                       int laneBits, int nranks, float* out, cudaStream_t stream);

// The 16-bit cast codec (wire ccBfloat16 or ccFloat16): out = round(local + in[0] + in[1]) (nin 0..2), and, when
// `lost` is not null, lost[i] = that fp32 sum - out[i] (cast16.cc's rounding; lost may be local: each element is read
// before it is written); and decode. With nin 0 and the decode, they are also compress/widen.h's Narrow and Widen of
// 16-bit data.
ccResult_t CastHop(ccDataType_t wire, const void* const* wiresIn, int nin, const float* local, size_t len,
                   void* wireOut, float* lost, cudaStream_t stream);
ccResult_t CastDecode(ccDataType_t wire, const void* in, size_t len, float* out, cudaStream_t stream);

// The chunk sparsifiers (sparse.h; sparse_cuda.cu). ChunkNorms: one squared norm per chunk of `chunk` values, the
// bytes of the CPU's ChunkNorms. GatherChunks / ScatterChunks: the `packed` values of the chosen chunks (`chosen`:
// device memory, increasing chunk indices; chosen chunk k at packed offset k * chunk) from x[0..count) into a dense
// buffer, and back into x; positions past count (a short last chunk, or packed rounded up to whole chunks) gather as
// 0 and scatter nowhere. Fill: x[0..count) = value. AnyNonFinite: *flag |= 1 when some x[i] is NaN or infinite
// (flag: device memory, set to 0 by the caller).
ccResult_t ChunkNorms(const float* x, size_t count, size_t chunk, float* norms, cudaStream_t stream);
// The pre-pass of a sparsifier with error feedback in one pass: e += g (as AddInto), then ChunkNorms of e.
ccResult_t AddIntoChunkNorms(float* e, const float* g, size_t count, size_t chunk, float* norms, cudaStream_t stream);
ccResult_t GatherChunks(const float* x, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* out,
                        cudaStream_t stream);
ccResult_t ScatterChunks(const float* in, size_t count, size_t chunk, const uint32_t* chosen, size_t packed, float* x,
                         cudaStream_t stream);
ccResult_t Fill(float* x, size_t count, float value, cudaStream_t stream);
ccResult_t AnyNonFinite(const float* x, size_t count, unsigned* flag, cudaStream_t stream);

// The chunk choice on the device, with CUB's radix sort: chosen[0..k) (device memory, increasing) gets the bytes of
// TopChunks(norms, k) (norms: the summed norms, device memory) or of RandomChunks(chunks, k, key). scratch:
// ChooseChunksScratchBytes(chunks) bytes of device memory (a size the host computes without the device).
size_t ChooseChunksScratchBytes(size_t chunks);
ccResult_t ChooseTopChunks(const float* norms, size_t chunks, size_t k, void* scratch, uint32_t* chosen,
                           cudaStream_t stream);
ccResult_t ChooseRandomChunks(size_t chunks, size_t k, uint32_t key, void* scratch, uint32_t* chosen,
                              cudaStream_t stream);
// randk's "this rank saw a non-finite value" mark, kept on the device: *mark = NaN when some x[i] is not finite (the
// caller zeroes it first); after the sum, PoisonIfMarked sets x[0..count) to NaN when *mark is not finite.
ccResult_t MarkNonFinite(const float* x, size_t count, float* mark, cudaStream_t stream);
ccResult_t PoisonIfMarked(float* x, size_t count, const float* mark, cudaStream_t stream);

// Error feedback (sparse_cuda.cu): acc += x; e = e - g, or 0 where that is not finite (the residual PowerSGD keeps);
// e = 0 where e is not finite (what a sparsifier keeps of a bad gradient).
ccResult_t AddInto(float* acc, const float* x, size_t count, cudaStream_t stream);
ccResult_t KeepResidual(float* e, const float* g, size_t count, cudaStream_t stream);
ccResult_t DropNonFinite(float* e, size_t count, cudaStream_t stream);

// x[i] = x[i] / factor (divide) or x[i] * factor: the average of the codecs without rotation, as their CPU Finish
// computes it.
ccResult_t Scale(float* x, size_t count, float factor, bool divide, cudaStream_t stream);

// Each loads every kernel of its file (quant_cuda.cu, cast16_cuda.cu, sparse_cuda.cu) into the current device's
// context (core/cuda_result.h: LoadKernel).
ccResult_t LoadQuantKernels();
ccResult_t LoadCastKernels();
ccResult_t LoadSparseKernels();

}  // namespace gpu
}  // namespace ccoll
