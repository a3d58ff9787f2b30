// The compressed all-reduce on device buffers over a stream-ordered transport (transport nccl): the codec ring with
// every step queued on the caller's stream (a group of one send and one receive, then the codec's kernels on what
// arrived), so the call returns once it is queued, later work on the stream sees the result, and the whole call can
// be captured into a CUDA graph. Nothing waits on the host and nothing crosses to host memory.
//
// The codec ring is the host codec ring's (collectives/compressed.cc): chunk c is reduced from rank c round to rank c - 1,
// which decodes its payload and sends it on unchanged, and every rank decodes the same bytes. Each step carries a
// whole chunk (NCCL pipelines a transfer itself). The device codecs compute the CPU drivers' bytes and index their
// randomness and scale groups globally, so the result is the host ring's byte for byte whenever the host ring's
// slices cut no scale group (chunks and CC_SLICE_BYTES multiples of the group).
//
// Covered: cast16 (16-bit wire) and quant in both modes (homomorphic scales agreed with the transport's max
// all-reduce, on the device); topk and randk with every step on the device, their chunk choice included (SparseCall);
// powersgd on cuBLAS with Gram-Schmidt and Q's start in kernels (LowRankCall; builds with cuBLAS); on float32,
// bfloat16 and float16 data. A captured call replays the randomness of the call it captured (the compressor's call
// counter is read when the call is queued).
//
// Only built with CCOLL_HAVE_NCCL.
#pragma once

#include "collectives/coll_args.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

// True when StreamCompressedAllReduce covers c's kind and parameters.
bool StreamCodecCovers(const ccCompressor& c);

// Makes the compressor's device state and grows every scratch buffer the call needs, queuing nothing. Growing is not
// allowed while `stream` is captured into a CUDA graph (ccInvalidUsage: capture a call that ran once before, with the
// same compressor, count and datatype); a refused call leaves the communicator usable.
ccResult_t StreamCompressedReserve(ccComm* comm, const CollArgs& args, ccCompressor* c, ccStream_t stream);

// Queues the call on `stream`, after StreamCompressedReserve succeeded for it.
ccResult_t StreamCompressedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c, ccStream_t stream);

}  // namespace ccoll
