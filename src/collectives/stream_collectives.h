// Collectives on device buffers when the communicator has a stream-ordered transport (transport nccl): queued on
// the caller's stream by the calling thread, with no proxy thread and no host wait, so they can be captured into a
// CUDA graph. The exact collectives are the transport's own (NCCL's ncclAllReduce, ...; results identical on every
// rank); compressed all-reduces run the stream-ordered codec ring (stream_compressed.h). A failure found on the device
// later (a dead peer, a collective past CC_TIMEOUT_MS) becomes the communicator's asynchronous error.
//
// Only built with CCOLL_HAVE_NCCL.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

enum class StreamKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce };

// Queues one validated call on `stream` (compressor: all-reduce only, or NULL), and tells the transport that a
// collective's work is queued (StreamTransport::Queued).
ccResult_t StreamCollective(ccComm* comm, StreamKind kind, const CollArgs& args, ccCompressor* compressor,
                            ccStream_t stream);

// The transport's exact collective, counted in the communicator's traffic as the ring would move it (the transport's
// own algorithm is its business): 2(n-1)/n of the buffer for an all-reduce, (n-1)/n for the others. count: as the C
// API takes it (per rank for reduce-scatter and all-gather).
ccResult_t StreamExactCall(ccComm* comm, StreamKind kind, const void* send, void* recv, size_t count,
                           ccDataType_t dtype, ccRedOp_t op, int root, ccStream_t stream);

}  // namespace ccoll
