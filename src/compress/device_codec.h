// Codecs that run on the GPU for a compressed all-reduce on device buffers: the working buffer (the rotated input,
// then the sum) stays in device memory and every pass over it is a kernel of compress/*.cu; only wire messages
// cross to the host, where the transports carry them. The kernels compute the CPU drivers' bytes, so a device call
// ends with the same result as the host call. Covered here: cast16 (bf16 and fp16 wire) and quant in both modes;
// collectives/device_compressed.cc also runs the sparsifiers and PowerSGD on the device with this state.
//
// A device codec implements the Codec contract with device pointers for `input`, `work`, `local` and `out`, and host
// pointers for wire messages. Each Hop, ReduceFinal and DecodeGather returns when its kernels and copies are done
// (the wire message is complete, the arriving one may be reused); Prepare returns with the metadata on the host;
// Finish only queues its kernels, and DeviceCodecState::Synchronize waits for them. A CUDA failure throws
// DeviceCodecError. In a stream-ordered call (DeviceCodecState::BeginCallOnStream; transport nccl) nothing waits:
// wire slots are device memory, every step only queues its kernels on the caller's stream, and the metadata stays
// on the device (DeviceCodec::DeviceMeta).
//
// Memory: buffers only grow, and a grown buffer's old block is kept until the state is destroyed. The proxy thread
// reserves them while the caller's stream waits for it (core/device_proxy.h), and with thread ranks sharing a GPU the
// other ranks' streams wait for collectives that need this rank: so no call here may wait for the whole device.
// cudaFree and cudaFreeHost do, and the CUDA guide counts device and pinned host allocations among the implicit
// synchronizations; so both come from ccoll's stream-ordered pools (core/device_memory.h: cudaMallocFromPoolAsync and
// cudaFreeAsync on the state's stream, which synchronize nothing; cudaMalloc and cudaHostAlloc where the device has
// no pool of the kind), and are freed only with the state.
//
// Only built with CCOLL_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "compress/codec.h"
#include "compress/codecs.h"
#include "compress/compressor.h"

namespace ccoll {

namespace gpu {
class LowRankBlas;  // compress/lowrank_cuda.h
}

class DeviceCodecError : public std::runtime_error {
 public:
  explicit DeviceCodecError(const std::string& what) : std::runtime_error(what) {}
};

// The state's own stream did not finish within ScratchStream::timeoutMs (core/stream_sync.h): ccTimeout.
class DeviceTimeoutError : public DeviceCodecError {
 public:
  using DeviceCodecError::DeviceCodecError;
};

// Scratch would have to grow while the stream is captured into a CUDA graph (ScratchStream::frozen): a usage error.
class ScratchFrozenError : public DeviceCodecError {
 public:
  using DeviceCodecError::DeviceCodecError;
};

// Throws DeviceCodecError naming `what` when e is not cudaSuccess.
void CheckCuda(cudaError_t e, const char* what);
// Throws DeviceCodecError with the last-error sentence when r is not ccSuccess (a kernel launch failed).
void CheckLaunch(ccResult_t r);

// The end of a float32 call on 16-bit data: w[0..count) narrowed into out (`dtype`, nearest-even: compress/widen.h's
// Narrow) with the cast codec's hop. Where e (a memory of count floats) is not null, error feedback also keeps this
// rank's share of what the narrowing rounds away (compress/widen.h: NarrowKeeping): w then holds that share (0 where
// it is not finite: a result that overflows 16 bits), and e += it, non-finite memory dropped.
void NarrowResult(ccDataType_t dtype, float* w, size_t count, void* out, float* e, float share, cudaStream_t s);

// True when a device codec or driver covers c's parameters: cast16 with a 16-bit wire; quant with rotation blocks of
// at most 16384 elements (the rotation kernel's shared memory); topk and randk; powersgd in a build with cuBLAS.
bool DeviceCodecCovers(const ccCompressor& c);

// The stream that a device codec state's memory is allocated and freed on (its own), and whether that memory may
// grow now: not while the caller's stream is being captured into a CUDA graph, where the allocation and the wait
// after it (GrowOnlyBuffer::Reserve) are not allowed.
struct ScratchStream {
  cudaStream_t s = nullptr;
  bool frozen = false;
  int timeoutMs = 0;  // how long a wait for s may take (the communicator's CC_TIMEOUT_MS; 0: no limit)
  ~ScratchStream();  // waits for the stream, then destroys it
};

// Device memory (or pinned host memory) that only grows; see "Memory" above. Contents are not kept when it grows.
// Its blocks are allocated and freed in the order of stream->s (core/device_memory.h: AllocateScratch), which must be
// valid from the first Reserve until the buffer is destroyed. A Reserve that would grow it while stream->frozen
// throws DeviceCodecError.
class GrowOnlyBuffer {
 public:
  enum Kind { kDevice, kPinnedHost };
  GrowOnlyBuffer(Kind kind, const ScratchStream* stream) : kind_(kind), stream_(stream) {}
  ~GrowOnlyBuffer();
  GrowOnlyBuffer(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer& operator=(const GrowOnlyBuffer&) = delete;

  // At least `bytes` bytes (at least 1).
  void* Reserve(size_t bytes);
  template <typename T>
  T* Reserve(size_t n) {
    return static_cast<T*>(Reserve(n * sizeof(T)));
  }
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  const Kind kind_;
  const ScratchStream* const stream_;
  int device_ = -1;  // the device current at the first Reserve
  void* p_ = nullptr;
  size_t bytes_ = 0;
  std::vector<void*> retired_;
};

// What a compressor keeps for its device calls, on the device current when it is made: a stream, device scratch,
// pinned host memory for the schedule's wire slots and for what the host reduces (metadata, PowerSGD's factors), the
// error-feedback memory in device memory, and PowerSGD's cuBLAS workspace. It lives until the compressor is
// destroyed or reset.
class DeviceCodecState {
  // First, so that it is destroyed last: the buffers below free their device memory onto it.
  ScratchStream stream_;

 public:
  // Makes the state on the current device; the caller (the proxy thread) has set it.
  static std::shared_ptr<DeviceCodecState> Create();
  ~DeviceCodecState();
  DeviceCodecState(const DeviceCodecState&) = delete;
  DeviceCodecState& operator=(const DeviceCodecState&) = delete;

  // The stream the codecs queue their work on: the caller's during a stream-ordered call, else the state's own.
  cudaStream_t stream() const { return inCall_ ? callStream_ : stream_.s; }
  // Waits for everything queued on the state's own stream (not in a stream-ordered call), at most the time set by
  // SetTimeout: DeviceTimeoutError after that.
  void Synchronize();
  // The communicator's timeout (CC_TIMEOUT_MS), for the waits of the calls that follow.
  void SetTimeout(int timeoutMs) { stream_.timeoutMs = timeoutMs; }
  // The same without throwing, for exits after an error (the call reports the first error, not this one).
  void SynchronizeQuietly() noexcept;

  // A stream-ordered call (transport nccl, collectives/stream_compressed.h) from now until EndCallOnStream: the codecs
  // queue their kernels on `stream` and never wait for them, their wire slots are device memory (wireOnDevice), and
  // when the stream is capturing into a CUDA graph the scratch must not grow (it throws instead). Unless capturing,
  // `stream` first waits for the end of the last stream-ordered call on this state, whatever its stream.
  void BeginCallOnStream(cudaStream_t stream, bool capturing);
  // Ends it: the state's own stream, where its memory is freed, waits for the call's work (unless it was captured:
  // a graph that holds it must go, or its launches end, before the compressor is destroyed).
  void EndCallOnStream();
  bool streamOrdered() const { return inCall_; }
  bool capturing() const { return callCaptured_; }
  // The error-feedback memory of `count` floats, zero when first made (the bucket's count never changes).
  float* ErrorFeedback(size_t count);
  // A cuBLAS handle lent for one call's products on `s`, with blasWorkspace as its workspace (CCOLL_HAVE_CUBLAS
  // builds; compress/lowrank_cuda.h). Destroy it once they are queued.
  std::unique_ptr<gpu::LowRankBlas> LendBlas(cudaStream_t s);

  // Scratch, reserved by each user for what it needs (contents are per call):
  static constexpr GrowOnlyBuffer::Kind kDev = GrowOnlyBuffer::kDevice, kPinned = GrowOnlyBuffer::kPinnedHost;
  GrowOnlyBuffer hostWire{kPinned, &stream_};  // the schedule's wire slots
  // The wire slots in device memory, for a communicator whose transports carry it (thread ranks): the kernels then
  // read arriving messages and write leaving ones in place, with no copy to or from the host.
  GrowOnlyBuffer deviceWire{kDev, &stream_};
  bool wireOnDevice = false;  // this call's wire slots are deviceWire (set by the driver before the schedule)
  GrowOnlyBuffer in0{kDev, &stream_}, in1{kDev, &stream_};  // arriving messages, copied in
  GrowOnlyBuffer out{kDev, &stream_};    // the message leaving
  GrowOnlyBuffer vals{kDev, &stream_};   // a slice of values being re-encoded
  GrowOnlyBuffer codes{kDev, &stream_};  // a slice of codes (packing pass)
  GrowOnlyBuffer sums{kDev, &stream_};   // homomorphic: a slice's lane sums before the requant gather
  GrowOnlyBuffer scales{kDev, &stream_};   // homomorphic: every group's agreed scale
  GrowOnlyBuffer packed{kDev, &stream_};   // sparsifiers: the chosen chunks; powersgd: P and exact parts
  GrowOnlyBuffer factors{kDev, &stream_};  // powersgd: Q, then Q's sum
  GrowOnlyBuffer index{kDev, &stream_};    // sparsifiers: the chosen chunks' indices; a flag
  GrowOnlyBuffer choice{kDev, &stream_};   // sparsifiers, stream-ordered: the chunk choice's sort scratch
  GrowOnlyBuffer ortho{kDev, &stream_};    // powersgd, stream-ordered: Gram-Schmidt's doubles
  GrowOnlyBuffer done{kDev, &stream_};     // quant, rotation fused into the decodes: a flag per rotation block
  GrowOnlyBuffer blasWorkspace{kDev, &stream_};  // powersgd: cuBLAS's workspace
  size_t deviceQElems = 0;  // powersgd, stream-ordered: factors holds the last call's Q, of this many elements
  GrowOnlyBuffer widened{kDev, &stream_};  // 16-bit data: the float32 working copy (compress/widen.h)
  GrowOnlyBuffer hostMeta{kPinned, &stream_};  // metadata and small host copies
  GrowOnlyBuffer hostPacked{kPinned, &stream_};  // what the host schedule reduces

 private:
  DeviceCodecState() = default;
  GrowOnlyBuffer errorFeedback_{kDev, &stream_};
  size_t errorFeedbackCount_ = 0;
  bool inCall_ = false;               // between BeginCallOnStream and EndCallOnStream
  cudaStream_t callStream_ = nullptr;  // the call's stream: NULL is the legacy default stream, as for the caller
  bool callCaptured_ = false;
  cudaEvent_t callDone_ = nullptr;  // the end of the last stream-ordered call: stream_ and the next call wait for it
};

// A device codec: the Codec contract on device pointers (see the top of this file).
class DeviceCodec : public Codec {
 public:
  // In a stream-ordered call, after Prepare: the metadata all ranks must agree on (reduced with MetaOp), left in
  // device memory, where the codec reads it once the schedule has reduced it in place; nullptr when there is none.
  // (Outside such calls Prepare returns the metadata on the host, and SetMeta takes it back.)
  virtual float* DeviceMeta(size_t* count) {
    *count = 0;
    return nullptr;
  }
  // Grows now the scratch that Prepare over `count` values and the steps over slices of at most maxLen values use
  // when the wire slots are device memory, so that a stream-ordered call can fail for want of scratch (ScratchFrozen-
  // Error) before it queues anything.
  virtual void ReserveScratch(size_t count, size_t maxLen) {}
};

// The device codec for one call of c (kind cast16 or quant, DeviceCodecCovers(c)); its work goes on st's stream.
// The cast codec (cast16, or the value type of the sparsifiers and PowerSGD) with `rounding` (device memory, as many
// floats as the call's elements) writes what this rank's encodes round away there, as MakeCast16Codec does.
std::unique_ptr<DeviceCodec> MakeDeviceCodec(const ccCompressor& c, const CodecCall& call, DeviceCodecState* st,
                                             float* rounding = nullptr);

}  // namespace ccoll
