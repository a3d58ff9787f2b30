// The sparsifiers' all-reduce (topk, randk): every rank picks the same chunks (compress/sparse.h), only those travel,
// dense, through the compressor's cast ring, and the rest of the result is zero; error feedback keeps what was not
// sent. The host driver is here; the device driver (collectives/device_compressed.cc) shares the middle steps.
#pragma once

#include "collectives/coll_args.h"
#include "compress/codecs.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

// On host buffers, float32 or 16-bit data (the bytes of the float32 call on the widened values, narrowed, but for
// what the error feedback keeps of that narrowing: SumChosenChunks).
ccResult_t SparseAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c, const CodecCall& call);

// The middle steps, host and device drivers alike, on host memory, in this order on every rank:
//   SumChosenChunks: sums the `packed` chosen values over the ranks with the compressor's value type, then scales them
//   to the result (randk unbiased: chunks / keep; avg: / nranks). Every rank ends with the same bytes. `rounding`
//   (packed floats, where SparseKeepsRounding, else null) gets this rank's share of what the 16-bit sums rounded
//   away (MakeCast16Codec's rounding), and, where the result is narrowed to 16 bits (resultType, ccFloat32 when it is
//   not), each rank's equal share of what that rounds away (OutputRoundingShare): error feedback keeps it for the
//   next call.
//   AgreeNonFinite (randk only): whether any rank saw a non-finite value in its input. randk may not pick the chunk
//   that holds it, so every rank learns it this way and poisons its whole result alike. (topk needs nothing: a
//   non-finite chunk has an infinite norm and is always picked.) One float, all-reduced after the values, so that a
//   rank can finish looking at its input while the values travel.
ccResult_t SumChosenChunks(ccComm* comm, ccCompressor* c, const CodecCall& call, float* values, size_t packed,
                           size_t chunks, size_t keep, ccRedOp_t op, ccDataType_t resultType, float* rounding);
ccResult_t AgreeNonFinite(ccComm* comm, bool sawNonFinite, bool* anyRank);

// Whether c's error feedback keeps what 16-bit roundings take from its sent values: ef=1 with 16-bit values (their
// sums round) or a result narrowed to 16 bits (resultType: 16-bit data). Every driver then writes it into the memory
// over the sent chunks instead of zeros.
bool SparseKeepsRounding(const ccCompressor& c, ccDataType_t resultType);
// The factor that makes what the result's narrowing rounds away (result units) one rank's share of it in the units
// of the sent values: 1 / (scale * nranks), the result being scale times the sum: 1 for an average, 1 / nranks for
// a sum (unbiased randk, whose scale differs, has no error feedback: refused at creation).
float OutputRoundingShare(const ccCompressor& c, size_t chunks, size_t keep, bool average, int nranks);

}  // namespace ccoll
