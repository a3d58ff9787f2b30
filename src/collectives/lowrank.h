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

// 16-bit data: the float32 result v is narrowed to 16 bits, and error feedback keeps what that rounds away, as it
// keeps what the low rank misses: each rank adds its share of v - round16(v) to its memory, all of it for an average
// (the memories' mean then holds it), 1 / nranks of it for a sum (whose result is n times the mean). So error
// feedback's identity holds for the 16-bit results too: what their running sum lacks of the running sum of true
// averages is the mean memory, which later calls send as far as the low rank carries it.
// LowRankKeepsRounding: whether call number `call` of c does (PowerSGD with ef=1, compressing: from the start
// iteration on, with something to send). LowRankRoundingShare: the share. The host driver narrows with
// compress/widen.h's NarrowKeeping, the device drivers with the cast codec's kernels (compress/device_codec.h:
// NarrowResult), the same bytes.
bool LowRankKeepsRounding(const ccCompressor& c, uint64_t call, int nranks, size_t count);
float LowRankRoundingShare(bool average, int nranks);

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
