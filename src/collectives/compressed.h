// Compressed all-reduce: the ring schedule with a codec between transport steps (see compress/codec.h), and the
// sparsifiers' select -> all-reduce the chosen chunks -> scatter driver. Float32 data, sum or avg. PowerSGD's
// driver is collectives/lowrank.cc. On device buffers (args.onDevice, on the proxy thread) the same ring and tree
// run a device codec (collectives/device_compressed.h).
#pragma once

#include <functional>
#include <vector>

#include "collectives/coll_args.h"
#include "compress/codecs.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

class Codec;

ccResult_t CompressedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* compressor);

// Runs `codec` over `work` (count floats, in place) with the communicator's all-reduce schedule (ring or tree),
// using the compressor's wire scratch (hostWire, when given: a function returning at least that many bytes of host
// memory). Every rank ends with the same bytes.
ccResult_t RunCodec(ccComm* comm, ccCompressor* c, Codec& codec, float* work, size_t count,
                    const std::function<char*(size_t bytes)>& hostWire = nullptr);

// The sparsifiers' middle step (host and device drivers alike), on host memory: sums the `packed` chosen values
// (followed by randk's non-finite flag when `flag`) over the ranks with the compressor's value type, then scales them
// to the result (randk unbiased: chunks / keep; avg: / nranks). *poisoned: some rank saw a non-finite value (randk).
ccResult_t SumChosenChunks(ccComm* comm, ccCompressor* c, const CodecCall& call, float* values, size_t packed,
                           bool flag, size_t chunks, size_t keep, ccRedOp_t op, bool* poisoned);

// All-reduces a codec's metadata (group maxima, chunk norms) exactly with `op`: every rank ends with the same values.
ccResult_t AgreeMeta(ccComm* comm, std::vector<float>* meta, ccRedOp_t op);

}  // namespace ccoll
