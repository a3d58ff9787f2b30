// codec_bench: single-core throughput of every codec's CPU paths, in GB/s of float32 input, next to memcpy
// bandwidth measured in the same run (this machine is shared: compare the ratios, not the absolute numbers).
//
//   encode = the local pre-pass (rotation, metadata) + the first encoding of every slice  (what a rank does to
//            start sending)
//   hop    = decode an incoming message + add the local slice + re-encode             (every intermediate step)
//   decode = the all-gather decode;  finish = inverse rotation + average
//
//   codec_bench [-n elements] [-r repeats] [spec ...]
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ccoll.h"
#include "compress/codecs.h"
#include "compress/compressor.h"
#include "compress/sparse.h"

namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename Fn>
double Best(int repeats, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    double t = Seconds();
    fn();
    best = std::min(best, Seconds() - t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t count = 16u << 20;
  int repeats = 5;
  std::vector<std::string> specs;
  // A positive decimal integer no larger than `max`, or -1.
  auto positive = [](const char* text, long long max) -> long long {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    return errno == 0 && end != text && *end == '\0' && v >= 1 && v <= max ? v : -1;
  };
  for (int i = 1; i < argc; ++i) {
    if ((std::strcmp(argv[i], "-n") == 0 || std::strcmp(argv[i], "-r") == 0) && i + 1 < argc) {
      const bool n = argv[i][1] == 'n';
      const long long v = positive(argv[++i], n ? (1ll << 34) : 1000000);
      if (v < 0) {
        std::fprintf(stderr, "%s: %s takes a positive integer%s, not \"%s\"\n", argv[0], argv[i - 1],
                     n ? " (elements, at most 2^34)" : " (at most 1000000)", argv[i]);
        return 2;
      }
      if (n) {
        count = static_cast<size_t>(v);
      } else {
        repeats = static_cast<int>(v);
      }
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [-n elements] [-r repeats] [spec ...]\n", argv[0]);
      return 2;
    } else {
      specs.push_back(argv[i]);
    }
  }
  if (specs.empty()) {
    specs = {"cast16", "quant:bits=4,mode=requant,group=32", "quant:bits=8,mode=requant,group=32",
             "quant:bits=8,mode=homomorphic", "quant:bits=4,mode=homomorphic,rounding=correlated"};
  }
  const size_t slice = 65536;  // the ring's default slice (CC_SLICE_BYTES 256 KiB of float32)
  count = (count + slice - 1) / slice * slice;
  std::vector<float> x(count), other(count), work(count), out(count);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (float& v : other) v = normal(rng);
  const double gb = static_cast<double>(count) * sizeof(float) / 1e9;
  double copy = Best(repeats, [&] { std::memcpy(work.data(), x.data(), count * sizeof(float)); });
  std::printf("# codec_bench: %zu float32 (%.1f MiB), slice %zu, best of %d, one core\n", count,
              count * 4.0 / (1 << 20), slice, repeats);
  std::printf("# GB/s: float32 input bytes (4 per element) per second, memcpy's too (it also writes as many)\n");
  std::printf("# memcpy: %.2f GB/s\n", gb / copy);
  std::printf("%-54s %8s %8s %8s %8s %8s %8s\n", "# spec", "encode", "hop", "decode", "finish", "enc/cpy",
              "hop/cpy");
  for (const std::string& spec : specs) {
    ccCompressor_t c = nullptr;
    if (ccCompressorCreateFromString(&c, spec.c_str()) != ccSuccess) {
      std::fprintf(stderr, "%s: %s\n", spec.c_str(), ccGetLastError(nullptr));
      return 1;
    }
    if (c->kind != ccCompressCast16 && c->kind != ccCompressQuant) {
      std::printf("%-54s (sparsifiers move chosen chunks through cast16/f32: see cast16)\n", spec.c_str());
      ccCompressorDestroy(c);
      continue;
    }
    ccoll::CodecCall call;
    call.rank = 1;
    call.nranks = 4;
    call.seed = 7;
    auto codec = c->kind == ccCompressQuant
                     ? ccoll::MakeQuantCodec(*c, call)
                     : ccoll::MakeCast16Codec(static_cast<ccDataType_t>(c->Get(ccParamValueType)), call);
    std::vector<char> wireA(codec->MaxWireBytes(slice)), wireB(wireA.size());
    std::vector<float> meta;
    double encode = Best(repeats, [&] {
      codec->Prepare(x.data(), work.data(), count, &meta);
      codec->SetMeta(meta);
      for (size_t o = 0; o < count; o += slice) codec->Hop(nullptr, 0, work.data() + o, o, slice, wireA.data());
    });
    codec->Hop(nullptr, 0, other.data(), 0, slice, wireA.data());  // an incoming message to add to
    double hop = Best(repeats, [&] {
      const void* in = wireA.data();
      for (size_t o = 0; o < count; o += slice) codec->Hop(&in, 1, work.data() + o, o, slice, wireB.data());
    });
    double decode = Best(repeats, [&] {
      for (size_t o = 0; o < count; o += slice) codec->DecodeGather(wireA.data(), o, slice, out.data() + o);
    });
    double finish = Best(repeats, [&] { codec->Finish(out.data(), count, true); });
    std::printf("%-54s %8.2f %8.2f %8.2f %8.2f %7.0f%% %7.0f%%\n", spec.c_str(), gb / encode, gb / hop, gb / decode,
                gb / finish, 100.0 * copy / encode, 100.0 * copy / hop);
    ccCompressorDestroy(c);
  }
  // The sparsifiers' chunk choice on the host (sparse.h): chunks of 1024 of the buffer, 10% kept.
  const size_t chunks = ccoll::ChunkCount(count, 1024), keep = ccoll::KeptChunks(chunks, 100000);
  std::vector<float> norms;
  ccoll::ChunkNorms(x.data(), count, 1024, &norms);
  std::vector<uint32_t> chosen;
  uint32_t key = 0;
  const double top = Best(repeats, [&] { ccoll::TopChunks(norms, keep, &chosen); });
  const double random = Best(repeats, [&] { ccoll::RandomChunks(chunks, keep, ++key, &chosen); });
  std::printf("# chunk choice, %zu chunks of 1024, %zu kept: topk %.3f ms, randk %.3f ms\n", chunks, keep,
              top * 1e3, random * 1e3);
  return 0;
}
