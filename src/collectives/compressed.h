// Compressed all-reduce: the ring schedule with a codec between transport steps (see compress/codec.h), and the
// sparsifiers' select -> all-reduce the chosen chunks -> scatter driver. Float32 data, sum or avg.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

ccResult_t CompressedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* compressor);

}  // namespace ccoll
