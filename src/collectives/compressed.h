// Compressed all-reduce: the ring schedule with a codec between transport steps (see compress/codec.h), and the
// sparsifiers' select -> all-reduce the chosen chunks -> scatter driver. Float32 data, sum or avg. PowerSGD's
// driver is collectives/lowrank.cc. On device buffers (args.onDevice, on the proxy thread) the same ring and tree
// run a device codec (compress/device_codec.h).
#pragma once

#include <functional>

#include "collectives/coll_args.h"

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

}  // namespace ccoll
