// libFuzzer target: a codec's wire decoders on arbitrary bytes of the expected length. The bytes stand for what a
// peer sent (a reduce-scatter message into Hop / ReduceFinal, an all-gather payload into DecodeGather); the codec
// must stay inside its buffers (every buffer below is a heap block of exactly the size the contract names, so ASan
// sees one byte too far) and must not hit undefined behaviour (UBSan, float-to-int conversions included).
// Properties checked besides: message sizes are the ones the codec announced, and two ranks decode the same
// payload to the same bytes.
//
// Built three times (CCOLL_FUZZ_CODEC): 0 cast16 (bf16, fp16, f32 wire), 1 quant requant, 2 quant homomorphic.
// Input: a few config bytes (see Config), up to 64 input floats, homomorphic scales, then the wire bytes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ccoll.h"
#include "compress/codecs.h"
#include "compress/compressor.h"
#include "fuzz_input.h"

#ifndef CCOLL_FUZZ_CODEC
#define CCOLL_FUZZ_CODEC 1
#endif

namespace {

using ccoll_fuzz::Input;

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_codec: property violated: %s\n", what);
    std::abort();
  }
}

// A heap block of exactly n bytes (at least 1, so that a zero-length message still has an address).
struct Block {
  explicit Block(size_t n) : bytes(n), p(new uint8_t[n ? n : 1]) {}
  size_t bytes;
  std::unique_ptr<uint8_t[]> p;
};

struct Compressor {
  ccCompressor_t c = nullptr;
  ~Compressor() {
    if (c) ccCompressorDestroy(c);
  }
  void Set(ccCompressorParam_t p, int64_t v) {
    if (ccCompressorSetParam(c, p, v) != ccSuccess) {
      std::fprintf(stderr, "fuzz_codec: parameter %d = %lld refused\n", static_cast<int>(p), static_cast<long long>(v));
      std::abort();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CC_DEBUG", "NONE", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Compressor comp;
  ccoll::CodecCall call;
  std::unique_ptr<ccoll::Codec> codec, peer;  // peer: the same codec on another rank
#if CCOLL_FUZZ_CODEC == 0
  static const ccDataType_t kWire[] = {ccBfloat16, ccFloat16, ccFloat32};
  ccDataType_t wire = kWire[in.U8() % 3];
  call.nranks = 2 + in.U8() % 15;
  call.rank = in.U8() % call.nranks;
  codec = ccoll::MakeCast16Codec(wire, call);
  ccoll::CodecCall other = call;
  other.rank = (call.rank + 1) % call.nranks;
  peer = ccoll::MakeCast16Codec(wire, other);
  const bool homomorphic = false;
#else
  const bool homomorphic = CCOLL_FUZZ_CODEC == 2;
  if (ccCompressorCreate(&comp.c, ccCompressQuant) != ccSuccess) std::abort();
  comp.Set(ccParamMode, homomorphic ? ccQuantHomomorphic : ccQuantRequant);
  comp.Set(ccParamBits, 1 + in.U8() % 8);
  const uint8_t flags = in.U8();
  comp.Set(ccParamRotation, flags & 1);
  comp.Set(ccParamRotationBlock, int64_t{64} << ((flags >> 1) % 5));  // 64..1024
  comp.Set(ccParamGatherPayload, (flags >> 4) & 1);
  comp.Set(ccParamClipPpm, (flags >> 5) & 1 ? 10000 : 0);
  comp.Set(ccParamScaleFormat, (flags >> 6) % 3);
  static const int64_t kGroups[] = {0, 1, 3, 7, 32, 64, 100, 1024};
  comp.Set(ccParamGroupSize, kGroups[in.U8() % 8]);
  comp.Set(ccParamRounding, in.U8() % 3);
  comp.Set(ccParamSeed, in.U8());
  // Homomorphic lanes grow with log2(nranks): go up to 1024 ranks.
  call.nranks = 2 + in.U16() % (homomorphic ? 1023 : 63);
  call.rank = in.U16() % call.nranks;
  call.seed = 0x5eed;
  call.call = in.U8();
  std::string why;
  if (!ccoll::QuantFitsRanks(*comp.c, call.nranks, &why)) return 0;  // ccAllReduce refuses these (ccInvalidUsage)
  codec = ccoll::MakeQuantCodec(*comp.c, call);
  ccoll::CodecCall other = call;
  other.rank = (call.rank + 1) % call.nranks;
  peer = ccoll::MakeQuantCodec(*comp.c, other);
#endif
  const int nin = in.U8() % 3;
  const size_t len = 1 + in.U16() % 4096;
  const size_t off = in.U16() % 4096;
  const bool average = in.U8() & 1;
  const size_t count = off + len;

  // This rank's input: up to 64 floats from the fuzzer (NaN, inf, denormals, huge), the rest a smooth pattern.
  std::vector<float> input(count), work(count);
  const size_t nfloat = in.U8() % 65;
  for (size_t i = 0; i < count; ++i) {
    input[i] = i < nfloat ? in.F32() : static_cast<float>(static_cast<int>(i % 61) - 30) * 0.03125f;
  }
  std::vector<float> meta;
  codec->Prepare(input.data(), work.data(), count, &meta);
  {
    std::vector<float> peerWork(count), peerMeta;
    peer->Prepare(input.data(), peerWork.data(), count, &peerMeta);
    Require(peerMeta.size() == meta.size(), "metadata has the same size on every rank");
  }
  if (homomorphic) {
    // The agreed scales come from the exact metadata all-reduce (max over ranks of non-negative values or +inf); the
    // fuzzer may replace some with any float.
    const size_t nscale = in.U8() % 9;
    for (size_t k = 0; k < nscale && !meta.empty(); ++k) {
      size_t at = in.U16() % meta.size();
      meta[at] = in.F32();
    }
  }
  codec->SetMeta(meta);
  peer->SetMeta(meta);

  const size_t hop = codec->HopBytes(off, len), gather = codec->GatherBytes(off, len);
  Require(hop <= codec->MaxWireBytes(len) && gather <= codec->MaxWireBytes(len), "messages fit MaxWireBytes");
  Block msg0(hop), msg1(hop), payload(gather), hopOut(hop), finalOut(gather);
  in.Bytes(msg0.p.get(), hop);
  in.Bytes(msg1.p.get(), hop);
  in.Bytes(payload.p.get(), gather);
  const void* wires[2] = {msg0.p.get(), msg1.p.get()};
  std::vector<float> local(work.begin() + static_cast<long>(off), work.end());  // exactly len floats

  Require(codec->Hop(wires, nin, local.data(), off, len, hopOut.p.get()) == hop, "Hop returns HopBytes");
  Require(codec->ReduceFinal(wires, nin, local.data(), off, len, finalOut.p.get()) == gather,
          "ReduceFinal returns GatherBytes");

  // Every rank decodes the all-gather payload, its producer included: the same bytes on every rank.
  std::vector<float> mine(len), theirs(len);
  codec->DecodeGather(payload.p.get(), off, len, mine.data());
  peer->DecodeGather(payload.p.get(), off, len, theirs.data());
  Require(std::memcmp(mine.data(), theirs.data(), len * sizeof(float)) == 0, "ranks decode a payload alike");
  codec->DecodeGather(finalOut.p.get(), off, len, theirs.data());

  std::memcpy(work.data() + off, mine.data(), len * sizeof(float));
  codec->Finish(work.data(), count, average);
  return 0;
}
