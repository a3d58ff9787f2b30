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

// On host buffers; needs a CPU BLAS (ccInvalidUsage in a build without one).
ccResult_t LowRankAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c, const CodecCall& call);

// Pieces the device driver (device_compressed.cc) shares, so both paths agree on everything but the products.
// LowRankSum: count floats summed over the ranks in place with wire type `wire` (ccFloat32: exact; ccBfloat16:
// bfloat16 on the wire, float32 accumulation); every rank ends with the same bytes. LowRankStartQ: every matrix's Q
// in c->lowRankQ: the previous call's (warm start), orthonormalized again, when it is usable; else a fresh random
// one. The same on every rank.
struct LowRankPlan;
ccResult_t LowRankSum(ccComm* comm, ccCompressor* c, const CodecCall& call, float* data, size_t count,
                      ccDataType_t wire);
void LowRankStartQ(ccCompressor* c, const LowRankPlan& plan, const CodecCall& call);

}  // namespace ccoll
