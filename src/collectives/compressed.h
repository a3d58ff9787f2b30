// Compressed all-reduce: the ring schedule with a codec between transport steps (see compress/codec.h), and the
// dispatch to the sparsifiers' driver (collectives/sparse.h). Float32 data, sum or avg. PowerSGD's
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

// All-reduces a codec's metadata (group maxima, chunk norms) exactly with `op`: every rank ends with the same values.
ccResult_t AgreeMeta(ccComm* comm, std::vector<float>* meta, ccRedOp_t op);

// For tests: every host call whose codec's pre-pass splits (Codec::SegmentAlign) runs in `segments` segments, on any
// transport; 0 (the default) runs them so over a network only: one per 8 Mi elements, 2 to 8, from 1 Mi elements.
void SetCodecSegmentsForTesting(int segments);

// For tests: the host calls run in more than one segment since the process started, over all communicators.
uint64_t SegmentedCallsForTesting();

}  // namespace ccoll
