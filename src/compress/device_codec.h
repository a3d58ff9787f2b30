// Codecs that run on the GPU for a compressed all-reduce on device buffers: the working buffer (the rotated input,
// then the sum) stays in device memory and every pass over it is a kernel of compress/*.cu; only wire messages
// cross to the host, where the transports carry them. The kernels compute the CPU drivers' bytes, so a device call
// ends with the same result as the host call. Covered: cast16 (bf16 and fp16 wire) and quant in requant mode. The
// other codecs' device calls are staged through host memory (core/device_proxy.h).
//
// A device codec implements the Codec contract with device pointers for `input`, `work`, `local` and `out`, and host
// pointers for wire messages. Each Hop, ReduceFinal and DecodeGather returns when its kernels and copies are done
// (the wire message is complete, the arriving one may be reused); Prepare and Finish only queue theirs, and
// DeviceCodecState::Synchronize waits for them. A CUDA failure throws DeviceCodecError.
//
// Only built with CCOLL_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "compress/codec.h"
#include "compress/codecs.h"
#include "compress/compressor.h"

namespace ccoll {

class DeviceCodecError : public std::runtime_error {
 public:
  explicit DeviceCodecError(const std::string& what) : std::runtime_error(what) {}
};

// True when the device codec covers c's parameters (cast16 with a 16-bit wire; quant requant with rotation blocks
// of at most 16384 elements, the kernel's shared memory).
bool DeviceCodecCovers(const ccCompressor& c);

// What a compressor keeps for its device calls, on the device current when it is made: a stream, device scratch for
// one slice's messages and values, and pinned host memory for the schedule's wire slots. It grows with the slices
// and lives until the compressor is destroyed or reset.
class DeviceCodecState {
 public:
  // Makes the state on the current device; the caller (the proxy thread) has set it.
  static std::shared_ptr<DeviceCodecState> Create();
  ~DeviceCodecState();
  DeviceCodecState(const DeviceCodecState&) = delete;
  DeviceCodecState& operator=(const DeviceCodecState&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Pinned host memory of at least `bytes` (its contents are not kept when it grows).
  char* HostWire(size_t bytes);
  // Device scratch for slices of up to `elems` values and wire messages of up to `wireBytes`.
  void Reserve(size_t elems, size_t wireBytes);
  // Waits for everything queued on the stream.
  void Synchronize();

  void* in[2] = {nullptr, nullptr};  // arriving messages, copied in
  void* out = nullptr;               // the message leaving
  float* vals = nullptr;             // a slice of values being re-encoded
  uint16_t* codes = nullptr;         // a slice of codes (packing pass)

 private:
  DeviceCodecState() = default;
  cudaStream_t stream_ = nullptr;
  char* hostWire_ = nullptr;
  size_t hostWireBytes_ = 0;
  size_t elems_ = 0, wireBytes_ = 0;
};

// Throws DeviceCodecError naming `what` when e is not cudaSuccess.
void CheckCuda(cudaError_t e, const char* what);

// The device codec for one call of c (DeviceCodecCovers(c) must hold); its work goes on st's stream.
std::unique_ptr<Codec> MakeDeviceCodec(const ccCompressor& c, const CodecCall& call, DeviceCodecState* st);

}  // namespace ccoll
