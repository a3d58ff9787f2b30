// PowerSGD's all-reduce: rank-r power iteration whose two thin matrices, P and Q, are all-reduced (through the
// exact float32 schedule, or with a bfloat16 wire) instead of the gradient.
#pragma once

#include "collectives/coll_args.h"
#include "compress/codecs.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

// Checked by the entry point before anything is sent: false, with the reason, when the compressor's shapes do not
// describe a bucket of `count` elements.
bool LowRankShapesFit(const ccCompressor& c, size_t count, std::string* why);

ccResult_t LowRankAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c, const CodecCall& call);

}  // namespace ccoll
