// Compressed all-reduce on device buffers (args.onDevice, on the communicator's proxy thread), for the compressors
// compress/device_codec.h covers: the same schedules and the same host-side decisions (chunk choice, Gram-Schmidt,
// the sums of PowerSGD's factors) as the host drivers, with every pass over the buffer a kernel on the compressor's
// stream. Only compressed messages, metadata and the sparsifiers' or PowerSGD's small reduced buffers cross to pinned
// host memory; with thread ranks (collectives/device_buffers.h) the cast16 and quant messages stay in device memory.
// cast16, quant, topk and randk end with the host call's bytes; PowerSGD's products run on cuBLAS, so its bytes are
// the same on every rank of one GPU model but not the CPU BLAS's.
//
// Only built with CCOLL_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "collectives/coll_args.h"
#include "compress/codecs.h"

struct ccComm;
struct ccCompressor;

namespace ccoll {

class DeviceCodecState;

// Returns when the result is in args.recv (the compressor's stream is synchronized). A CUDA failure is
// ccUnhandledCudaError with the failing call named.
ccResult_t DeviceCompressedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c, const CodecCall& call);

// Before the first device call of a PowerSGD compressor, on the caller's thread and before the call's stream waits
// for the proxy (core/device_proxy.h): makes the cuBLAS handles the proxy will borrow (ReserveBlasForCalls), the
// compressor's device state, its cuBLAS workspace and the call's scratch, and runs each of the call's products once on
// zeros, so that cuBLAS has made its allocations and loaded its kernels (which CUDA loads lazily, and a load may
// synchronize the context) before a stream waits for a proxy that runs them.
// Runs again for a call whose buffers lie at other 256-byte offsets than any primed call's (cuBLAS may choose kernels
// by alignment); while a call of the compressor is queued, that first waits on the host until the call has run (at
// most CC_TIMEOUT_MS, then it warns and does nothing; nothing either where the communicator has failed meanwhile). So
// such a call returns only once the call before has run, even with memory pools: its thread must not be the one that
// makes a call the call before waits for (one thread driving several ranks outside a group, say). Does nothing for
// other compressors, once the compressor is primed for the call's offsets, and for calls that run no product (one
// rank, no data). Best effort: a CUDA failure is logged, and the call goes ahead (and fails on the proxy thread, where
// a failure aborts the communicator and releases every waiting stream).
void PrimeDeviceCodec(ccComm* comm, const CollArgs& args, ccCompressor* c);
// How many of PrimeDeviceCodec's calls found the compressor's call before still queued and waited (for tests).
uint64_t PrimingWaits();

// bfloat16 and float16 data on device buffers: CompressedAllReduce of a float32 copy widened on the device, narrowed
// into args.recv (compress/widen.h), on the compressor's stream.
ccResult_t DeviceWidenedAllReduce(ccComm* comm, const CollArgs& args, ccCompressor* c);

// The end of a call on 16-bit data (both device drivers: this file's staged one, and the stream-ordered one of
// collectives/stream_compressed.h): narrows the float32 result w (args.count elements) into args.recv to nearest-even,
// queued on s. For call number `call` of a PowerSGD compressor that keeps the rounding (collectives/lowrank.h), st's
// error-feedback memory also gets this rank's share of what the narrowing rounds away; the sparsifiers' drivers keep
// it themselves. Without cuBLAS no PowerSGD call reaches the device drivers, and this only narrows.
void NarrowCallResult(const ccComm* comm, const CollArgs& args, const ccCompressor& c, uint64_t call,
                      DeviceCodecState* st, float* w, cudaStream_t s);

}  // namespace ccoll
