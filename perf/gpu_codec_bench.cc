// GPU codec kernels' throughput next to a device-to-device copy measured in the same run: each kernel's bytes read
// plus written over its time (CUDA events, median of -r runs after a warm-up), and that as a share of the copy's.
//
//   gpu_codec_bench [-n ELEMENTS] [-r REPEATS]      default 64M float32 elements (256 MiB), 20 repeats
//
// Kernels: rotation forward (signs + Walsh-Hadamard, block 1024), requant encode (4 bits, group 32, bf16 scales,
// stochastic), the fused requant hop (decode + add + encode), requant decode, the encode, hop and decode with the
// rotation fused and the finish pass after them, the bf16 cast hop and decode, the homomorphic lanes (group scales,
// 4-bit codes in 6-bit lanes: encode, packed add, decode; and the scales, hop, requantizing hop and decode with the
// rotation fused), the narrowing of a bfloat16 call's result, the sparsifiers' chunk
// norms, gather and scatter (10% of the chunks) and error-feedback passes, the exact schedules' float32 and bfloat16
// sums, and PowerSGD's three cuBLAS products (a square-ish matrix of the same elements, rank 4). Codec inputs are
// float32: bfloat16 gradients are widened to float32 before the codec (the bf16 cast decode row) and narrowed after
// it (the narrow row), and the codec kernels in between are the float32 rows.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce_cuda.h"
#include "compress/bitpack.h"
#include "compress/codec_cuda.h"
#include "compress/float16.h"
#include "compress/lanes_tile.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank_cuda.h"
#endif

namespace {

#define CUDA_OK(call)                                                                             \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// A row's call must succeed: a call refused before it launched anything would time as infinitely fast.
void Ok(ccResult_t r, const std::string& name) {
  if (r == ccSuccess) return;
  std::fprintf(stderr, "%s: %s (%s)\n", name.c_str(), ccGetErrorString(r), ccGetLastError(nullptr));
  std::exit(1);
}

double MedianMs(int repeats, const std::string& name, const std::function<ccResult_t()>& run) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  Ok(run(), name);  // warm-up
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    CUDA_OK(cudaEventRecord(a));
    Ok(run(), name);
    CUDA_OK(cudaEventRecord(b));
    CUDA_OK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t{64} << 20;
  int repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "-n") == 0) n = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "-r") == 0) repeats = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_codec_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  const size_t group = 32;
  const int bits = 4;
  const auto format = ccoll::ScaleFormat::kBf16;
  const size_t msgBytes = ccoll::gpu::RequantBytes(n, group, bits, format);
  float *x, *y, *vals;
  uint16_t *codes, *half;
  void *msg, *msg2;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&x), n * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&y), n * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&vals), n * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&codes), n * 2));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&half), n * 2));
  CUDA_OK(cudaMalloc(&msg, msgBytes));
  CUDA_OK(cudaMalloc(&msg2, msgBytes));
  uint8_t* done;  // the fused decode's flags, one per rotation block of 1024
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&done), n / 1024 + 1));
  CUDA_OK(cudaMemset(done, 0, n / 1024 + 1));
  {
    std::vector<float> h(n);
    std::mt19937 gen(1);
    std::normal_distribution<float> normal;
    for (auto& v : h) v = normal(gen);
    CUDA_OK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint16_t>(ccoll::FloatBits(h[i]) >> 16);  // bf16 of x
    CUDA_OK(cudaMemcpy(half, b.data(), n * 2, cudaMemcpyHostToDevice));
  }
  ccoll::DitherRule rule;
  rule.key = 7;
  struct Row {
    std::string name;
    double bytes;  // read + written
    std::function<ccResult_t()> run;
  };
  const void* in1[1] = {msg};
  const void* in1h[1] = {half};
  std::vector<Row> rows = {
      {"copy (cudaMemcpy D2D)", 2.0 * n * 4,
       [&] {
         const cudaError_t e = cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice);
         return e == cudaSuccess ? ccSuccess : ccUnhandledCudaError;
       }},
      {"rotate forward (block 1024)", 2.0 * n * 4,
       [&] { return ccoll::gpu::RotateForward(x, y, n, 1024, 3, nullptr); }},
      {"requant encode (4b, group 32)", n * 4.0 + msgBytes,
       [&] { return ccoll::gpu::EncodeRequant(x, n, 0, group, bits, format, 0.0f, rule, codes, msg, nullptr); }},
      {"requant hop (decode+add+encode)", n * 4.0 + 2.0 * msgBytes,
       [&] {
         return ccoll::gpu::HopRequant(in1, 1, x, n, 0, group, bits, format, 0.0f, rule, vals, codes, msg2, nullptr);
       }},
      {"requant decode", msgBytes + n * 4.0,
       [&] { return ccoll::gpu::DecodeRequant(msg, n, group, bits, format, y, nullptr); }},
      // The same with the rotation fused (the device codec's path for requant with rotation): the hop reads the
      // unrotated values and rotates them in its tiles; the decode rotates back the blocks it holds whole and marks
      // them, and the finish pass then skips every block.
      {"requant encode, rotation fused", n * 4.0 + msgBytes,
       [&] {
         return ccoll::gpu::HopRequantRotated(nullptr, 0, x, n, 1024, 3, false, 0, n, group, bits, format, 0.0f, rule,
                                              msg2, nullptr);
       }},
      {"requant hop, rotation fused", n * 4.0 + 2.0 * msgBytes,
       [&] {
         return ccoll::gpu::HopRequantRotated(in1, 1, x, n, 1024, 3, false, 0, n, group, bits, format, 0.0f, rule, msg2,
                                              nullptr);
       }},
      {"requant decode, inverse rotation fused", msgBytes + n * 4.0 + n / 1024.0,
       [&] {
         return ccoll::gpu::DecodeRequantRotated(msg, 0, n, group, bits, format, n, 1024, 3, 0.25f, done, y, nullptr);
       }},
      {"finish: rotate back unmarked blocks (none left)", n / 1024.0,
       [&] { return ccoll::gpu::RotateInverse(y, n, 1024, 3, 0.25f, done, nullptr); }},
      {"bf16 cast hop", n * 4.0 + n * 2.0 + n * 2.0,
       [&] { return ccoll::gpu::CastHop(ccBfloat16, in1h, 1, x, n, codes, nullptr, nullptr); }},
      {"bf16 cast hop, its rounding kept (topk/randk ef)", n * 4.0 + n * 2.0 + n * 2.0 + n * 4.0,
       [&] { return ccoll::gpu::CastHop(ccBfloat16, in1h, 1, x, n, codes, y, nullptr); }},
      {"bf16 cast decode", n * 2.0 + n * 4.0, [&] { return ccoll::gpu::CastDecode(ccBfloat16, half, n, y, nullptr); }},
      // bfloat16 gradients: every codec runs on a float32 copy, widened before the call and narrowed after it
      // (collectives/device_compressed.cc: DeviceWidenedAllReduce); the widening is the cast decode above.
      {"bf16 data: narrow the result", n * 4.0 + n * 2.0,
       [&] { return ccoll::gpu::CastHop(ccBfloat16, nullptr, 0, x, n, codes, nullptr, nullptr); }},
  };
  // Homomorphic lanes: 4-bit codes, 6-bit lanes (room for 4 ranks), one agreed scale per 1024 values.
  const size_t hgroup = 1024, groups = (n + hgroup - 1) / hgroup;
  const int laneBits = 6;
  const size_t laneBytes = ccoll::PackedBytes(n, laneBits);
  float* scales;
  void *lanes, *lanes2;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&scales), groups * 4));
  CUDA_OK(cudaMalloc(&lanes, laneBytes));
  CUDA_OK(cudaMalloc(&lanes2, laneBytes));
  // Sparsifiers: chunks of 1024, every tenth one chosen.
  const size_t chunk = 1024, chunks = (n + chunk - 1) / chunk;
  std::vector<uint32_t> chosen;
  for (size_t c = 0; c + 1 < chunks; c += 10) chosen.push_back(static_cast<uint32_t>(c));
  const size_t packed = chosen.size() * chunk;
  uint32_t* dChosen;
  float* norms;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&dChosen), chosen.size() * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&norms), chunks * 4));
  CUDA_OK(cudaMemcpy(dChosen, chosen.data(), chosen.size() * 4, cudaMemcpyHostToDevice));
  rows.push_back({"lanes: group scales (group 1024)", n * 4.0 + groups * 4.0,
                  [&] { return ccoll::gpu::GroupScales(x, n, hgroup, 0.0f, scales, nullptr); }});
  rows.push_back({"lanes: encode (4b in 6-bit lanes)", n * 4.0 + groups * 4.0 + laneBytes, [&] {
                    return ccoll::gpu::EncodeLanes(x, n, 0, hgroup, scales, bits, laneBits, rule, lanes, nullptr);
                  }});
  rows.push_back({"lanes: packed add (groups over 1024)", 3.0 * laneBytes,
                  [&] { return ccoll::gpu::AddLanes(lanes2, lanes, lanes, n, laneBits, nullptr); }});
  rows.push_back({"lanes: decode", laneBytes + groups * 4.0 + n * 4.0,
                  [&] { return ccoll::gpu::DecodeLanes(lanes, n, 0, hgroup, scales, bits, laneBits, 4, y, nullptr); }});
  // The device codec's homomorphic path with the rotation fused (compress/lanes_tile.h): the scales and every hop
  // rotate the unrotated values in their tiles, a hop adds the arriving lanes in the same kernel, and the decode
  // rotates back the blocks it holds whole.
  const size_t hmsgBytes = ccoll::gpu::RequantBytes(n, hgroup, bits, format);
  ccoll::tile::LanesArgs fusedScales = ccoll::tile::ScalesArgsOf(nullptr, n, hgroup, 0.0f, scales);
  fusedScales.hop = ccoll::tile::RotatedFrom(fusedScales.hop, x, n, 1024, 3, false);
  const void* inLanes[1] = {lanes};
  const ccoll::tile::HopArgs lanesHop = ccoll::tile::RotatedFrom(
      ccoll::tile::HopArgsOf(nullptr, inLanes, 1, 0, n, hgroup, bits, format, 0.0f, rule, lanes2), x, n, 1024, 3,
      false);
  rows.push_back({"lanes: group scales, rotation fused", n * 4.0 + groups * 4.0,
                  [&] { return ccoll::gpu::LanesTiles(fusedScales, nullptr); }});
  const ccoll::tile::LanesArgs lanesHopArgs = ccoll::tile::LanesArgsOf(lanesHop, scales, laneBits, 4, false);
  const ccoll::tile::LanesArgs lanesLastArgs = ccoll::tile::LanesArgsOf(lanesHop, scales, laneBits, 4, true);
  rows.push_back({"lanes: hop (encode + add), rotation fused", n * 4.0 + groups * 4.0 + 2.0 * laneBytes,
                  [&] { return ccoll::gpu::LanesTiles(lanesHopArgs, nullptr); }});
  rows.push_back({"lanes: last hop requantized, rotation fused", n * 4.0 + groups * 4.0 + laneBytes + hmsgBytes,
                  [&] { return ccoll::gpu::LanesTiles(lanesLastArgs, nullptr); }});
  rows.push_back({"lanes: decode, inverse rotation fused", laneBytes + groups * 4.0 + n * 4.0 + n / 1024.0, [&] {
                    const ccoll::tile::DecodeArgs d = ccoll::tile::RotatedBack(
                        ccoll::tile::DecodeArgsOf(lanes, 0, n, hgroup, bits, format, y), n, 1024, 3, 0.25f, done);
                    return ccoll::gpu::DecodeTiles(ccoll::tile::LanesFrom(d, scales, laneBits, 4), nullptr);
                  }});
  rows.push_back({"sparse: chunk norms (chunk 1024)", n * 4.0 + chunks * 4.0,
                  [&] { return ccoll::gpu::ChunkNorms(x, n, chunk, norms, nullptr); }});
  rows.push_back({"sparse: error feedback add + chunk norms (one pass)", 3.0 * n * 4 + chunks * 4.0,
                  [&] { return ccoll::gpu::AddIntoChunkNorms(y, x, n, chunk, norms, nullptr); }});
  rows.push_back({"sparse: gather 10% of chunks", 2.0 * packed * 4,
                  [&] { return ccoll::gpu::GatherChunks(x, n, chunk, dChosen, packed, vals, nullptr); }});
  rows.push_back({"sparse: scatter 10% of chunks", 2.0 * packed * 4,
                  [&] { return ccoll::gpu::ScatterChunks(vals, n, chunk, dChosen, packed, y, nullptr); }});
  // The stream-ordered path's chunk choice: a radix sort of (norm, index) pairs, then of the winners; bytes: the pairs
  // read and written once (the sort makes several passes, so this undercounts its traffic).
  void* choice;
  CUDA_OK(cudaMalloc(&choice, ccoll::gpu::ChooseChunksScratchBytes(chunks)));
  rows.push_back({"sparse: top-10% chunk choice (CUB radix sort)", chunks * 16.0,
                  [&] { return ccoll::gpu::ChooseTopChunks(norms, chunks, chosen.size(), choice, dChosen, nullptr); }});
  rows.push_back({"error feedback: add gradient", 3.0 * n * 4, [&] { return ccoll::gpu::AddInto(y, x, n, nullptr); }});
  rows.push_back(
      {"error feedback: keep residual", 3.0 * n * 4, [&] { return ccoll::gpu::KeepResidual(y, x, n, nullptr); }});
  // The exact schedules' reduction on device buffers (collectives/device_buffers.h): float32 and bfloat16 sums.
  rows.push_back({"exact: float32 sum (y = x + y)", 3.0 * n * 4,
                  [&] { return ccoll::gpu::Reduce(y, x, y, n, ccFloat32, ccSum, nullptr); }});
  rows.push_back({"exact: bfloat16 sum", 3.0 * n * 2,
                  [&] { return ccoll::gpu::Reduce(codes, half, codes, n, ccBfloat16, ccSum, nullptr); }});
#ifdef CCOLL_HAVE_CUBLAS
  // PowerSGD on the most square matrix of n elements, rank 4: each product reads M (or writes it, for P Q^T).
  const int64_t prow = static_cast<int64_t>(std::sqrt(static_cast<double>(n))), pcol = static_cast<int64_t>(n) / prow;
  const int rank = 4;
  std::unique_ptr<ccoll::gpu::LowRankBlas> blas;
  if (ccoll::gpu::LowRankBlas::Create(nullptr, nullptr, 0, false, &blas) != ccSuccess) {
    std::fprintf(stderr, "cuBLAS handle: failed\n");
    return 1;
  }
  float *pm, *qm;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&pm), prow * rank * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&qm), pcol * rank * 4));
  CUDA_OK(cudaMemset(pm, 0, prow * rank * 4));
  CUDA_OK(cudaMemset(qm, 0, pcol * rank * 4));
  const double mBytes = static_cast<double>(prow) * pcol * 4;
  const std::string shape = std::to_string(prow) + "x" + std::to_string(pcol) + ", r 4";
  rows.push_back(
      {"powersgd: P = M Q (" + shape + ")", mBytes, [&] { return blas->ProductMQ(x, prow, pcol, qm, rank, pm); }});
  rows.push_back({"powersgd: Q = M^T P", mBytes, [&] { return blas->ProductMtP(x, prow, pcol, pm, rank, qm); }});
  rows.push_back({"powersgd: G = P Q^T", mBytes, [&] { return blas->ProductPQt(pm, qm, prow, pcol, rank, y); }});
#endif
  // The requant hop and decode need a valid message first; the lanes' add and decode a valid lane stream.
  Ok(ccoll::gpu::EncodeRequant(x, n, 0, group, bits, format, 0.0f, rule, codes, msg, nullptr), "setup: message");
  Ok(ccoll::gpu::GroupScales(x, n, hgroup, 0.0f, scales, nullptr), "setup: scales");
  Ok(ccoll::gpu::EncodeLanes(x, n, 0, hgroup, scales, bits, laneBits, rule, lanes, nullptr), "setup: lanes");
  CUDA_OK(cudaDeviceSynchronize());
  std::printf("# %s, %zu float32 elements (%.0f MiB), median of %d\n", prop.name, n, n * 4.0 / (1 << 20), repeats);
  std::printf("| kernel | time (ms) | GB/s (read+written) | vs copy |\n|---|---:|---:|---:|\n");
  double copy = 0;
  std::vector<double> times;
  for (const Row& r : rows) {
    const double ms = MedianMs(repeats, r.name, r.run);
    CUDA_OK(cudaGetLastError());
    times.push_back(ms);
    const double gbs = r.bytes / (ms * 1e-3) / 1e9;
    if (copy == 0) copy = gbs;
    std::printf("| %s | %.3f | %.1f | %.0f%% |\n", r.name.c_str(), ms, gbs, 100.0 * gbs / copy);
  }
  // A 4-bit requant ring all-reduce of these n elements on 4 ranks, per rank: encode a quarter, hop a quarter three
  // times (two hops and the owner's final one), decode all; with the rotation fused (the device codec's path for
  // rotation blocks up to 1024), and with passes of their own (larger blocks: rotate all, ..., rotate back, timed as
  // forward).
  auto ms = [&](const char* name) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].name == name) return times[i];
    }
    std::fprintf(stderr, "no row %s\n", name);
    std::exit(1);
  };
  const double fusedMs = ms("requant encode, rotation fused") / 4 + 3 * ms("requant hop, rotation fused") / 4 +
                         ms("requant decode, inverse rotation fused") +
                         ms("finish: rotate back unmarked blocks (none left)");
  const double passesMs = 2 * ms("rotate forward (block 1024)") + ms("requant encode (4b, group 32)") / 4 +
                          3 * ms("requant hop (decode+add+encode)") / 4 + ms("requant decode");
  const double wireMs = 2.0 * 3 / 4 * n * 2 / 50e9 * 1e3;
  std::printf(
      "\n4-bit all-reduce codec time per rank (4 ranks), against the bf16 wire time it replaces at "
      "50 GB/s per link (%.3f ms; target: codec / wire <= 10%%):\n",
      wireMs);
  std::printf("  requant, rotation fused:     %.3f ms, codec / wire = %.1f%%\n", fusedMs, 100.0 * fusedMs / wireMs);
  std::printf("  requant, rotation passes:    %.3f ms, codec / wire = %.1f%%\n", passesMs, 100.0 * passesMs / wireMs);
  // bfloat16 gradients: the same, plus the widening before it and the narrowing after it.
  const double bf16DataMs = fusedMs + ms("bf16 cast decode") + ms("bf16 data: narrow the result");
  std::printf("  requant, bf16 data:          %.3f ms, codec / wire = %.1f%%\n", bf16DataMs,
              100.0 * bf16DataMs / wireMs);
  // The homomorphic ring, per rank: the scales of all, this rank's codes of a quarter and three hops of a quarter
  // (timed as hops), the decode of all and the finish; its wire is wider (6-bit lanes), but the bf16 wire it
  // replaces is the same.
  const double lanesMs = ms("lanes: group scales, rotation fused") + ms("lanes: hop (encode + add), rotation fused") +
                         ms("lanes: decode, inverse rotation fused") +
                         ms("finish: rotate back unmarked blocks (none left)");
  std::printf("  homomorphic, rotation fused: %.3f ms, codec / wire = %.1f%%\n", lanesMs, 100.0 * lanesMs / wireMs);
  return 0;
}
