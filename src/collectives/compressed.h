// Compressed all-reduce: the ring schedule with a codec between transport steps (see compress/codec.h), and the
// sparsifiers' select -> all-reduce the chosen chunks -> scatter driver. Float32 data, sum or avg. PowerSGD's
// driver is collectives/lowrank.cc.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

class Codec;

ccResult_t CompressedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* compressor);

// Runs `codec` over `work` (count floats, in place) with the communicator's all-reduce schedule (ring or tree),
// using the compressor's wire scratch. Every rank ends with the same bytes.
ccResult_t RunCodec(ccComm* comm, ccCompressor* c, Codec& codec, float* work, size_t count);

}  // namespace ccoll
