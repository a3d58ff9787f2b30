#include "compress/device_codec.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <unordered_set>

#include "compress/codec_cuda.h"
#ifdef CCOLL_HAVE_CUBLAS
#include "compress/lowrank_cuda.h"
#endif
#include "compress/bitpack.h"
#include "compress/lanes_tile.h"
#include "compress/quant.h"
#include "compress/requant_tile.h"
#include "core/cuda_result.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/stream_sync.h"

namespace ccoll {
namespace {

constexpr size_t kMaxRotationBlock = 16384;  // gpu::RotateForward keeps a block in shared memory

// What the device codecs share: the wire copies around the hop and decode kernels (none when the wire slots are
// device memory: st->wireOnDevice), and the waits after them (none in a stream-ordered call). Subclasses say how many
// bytes a message has and which kernels turn messages and values into one another.
class KernelCodec : public DeviceCodec {
 public:
  explicit KernelCodec(DeviceCodecState* st) : st_(st) {}

  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
             void* wireOut) override {
    const size_t bytes = HopBytes(off, len);
    const void* devIn[2];
    CopyIn(wiresIn, nin, bytes, devIn);
    void* devOut = OutSlot(len, wireOut);
    HopKernels(devIn, nin, local, off, len, devOut);
    return CopyOut(devOut, bytes, wireOut);
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    return Hop(wiresIn, nin, local, off, len, wireOut);  // the gather payload is what a hop sends
  }

  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    const void* devIn[1];
    CopyIn(&wire, 1, GatherBytes(off, len), devIn);
    DecodeKernel(devIn[0], off, len, out);
    if (!st_->streamOrdered()) st_->Synchronize();  // the schedule reuses the slot
  }

 protected:
  // Queue the kernels that write the message devOut from the devIn messages and `local`.
  virtual void HopKernels(const void* const* devIn, int nin, const float* local, size_t off, size_t len,
                          void* devOut) = 0;
  virtual void DecodeKernel(const void* devWire, size_t off, size_t len, float* out) = 0;

  // Queues the copies of nin (0..2) host messages of `bytes` bytes into device scratch (with device wire slots, the
  // kernels read the messages where they arrived).
  void CopyIn(const void* const* wiresIn, int nin, size_t bytes, const void** devIn) {
    GrowOnlyBuffer* slots[2] = {&st_->in0, &st_->in1};
    for (int k = 0; k < nin; ++k) {
      if (st_->wireOnDevice) {
        devIn[k] = wiresIn[k];
        continue;
      }
      void* d = slots[k]->Reserve(bytes);
      CheckCuda(cudaMemcpyAsync(d, wiresIn[k], bytes, cudaMemcpyHostToDevice, st_->stream()),
                "cudaMemcpyAsync (message in)");
      devIn[k] = d;
    }
  }
  // Where the kernels write a leaving message of len values: the wire slot itself when it is device memory, else
  // device scratch that CopyOut copies to the host slot.
  void* OutSlot(size_t len, void* wireOut) {
    return st_->wireOnDevice ? wireOut : st_->out.Reserve(MaxWireBytes(len));
  }
  // Copies a device message to the host (unless it was written in place) and waits for it (and everything before it
  // on the stream): the schedule sends it next. A stream-ordered call's transport sends it in stream order instead.
  size_t CopyOut(const void* devOut, size_t bytes, void* wireOut) {
    if (devOut != wireOut) {
      CheckCuda(cudaMemcpyAsync(wireOut, devOut, bytes, cudaMemcpyDeviceToHost, st_->stream()),
                "cudaMemcpyAsync (message out)");
    }
    if (!st_->streamOrdered()) st_->Synchronize();
    return bytes;
  }

  void CopyInput(const float* input, float* work, size_t count) {
    if (work == input || count == 0) return;
    CheckCuda(cudaMemcpyAsync(work, input, count * sizeof(float), cudaMemcpyDeviceToDevice, st_->stream()),
              "cudaMemcpyAsync (input to work)");
  }

  DeviceCodecState* st_;
};

class DeviceCastCodec : public KernelCodec {
 public:
  DeviceCastCodec(ccDataType_t wire, int nranks, float* lost, DeviceCodecState* st)
      : KernelCodec(st), wire_(wire), nranks_(nranks), lost_(lost) {}

  size_t MaxWireBytes(size_t len) const override { return 2 * len; }
  size_t HopBytes(size_t, size_t len) const override { return 2 * len; }
  size_t GatherBytes(size_t, size_t len) const override { return 2 * len; }

  // An fp16 average divides each rank's input by nranks first, as the host codec (compress/cast16.cc) does.
  void PipelinePrepareAndFinish(bool average) override { divideFirst_ = average && wire_ == ccFloat16; }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    meta->clear();
    CopyInput(input, work, count);
    if (divideFirst_ && count > 0) {
      CheckLaunch(gpu::Scale(work, count, static_cast<float>(nranks_), true, st_->stream()));
    }
  }

  void Finish(float* work, size_t count, bool average) override {
    if (!average || divideFirst_) return;
    CheckLaunch(gpu::Scale(work, count, static_cast<float>(nranks_), true, st_->stream()));
  }

 protected:
  void HopKernels(const void* const* devIn, int nin, const float* local, size_t off, size_t len,
                  void* devOut) override {
    CheckLaunch(gpu::CastHop(wire_, devIn, nin, local, len, devOut, lost_ != nullptr ? lost_ + off : nullptr,
                             st_->stream()));
  }
  void DecodeKernel(const void* devWire, size_t, size_t len, float* out) override {
    CheckLaunch(gpu::CastDecode(wire_, devWire, len, out, st_->stream()));
  }

 private:
  const ccDataType_t wire_;
  const int nranks_;
  bool divideFirst_ = false;
  float* const lost_;  // null, or device memory: what each encode rounds away, at the element's offset
};

// Both modes. Requant messages carry their own scales (no metadata); homomorphic lanes are coded on scales agreed
// by max over the ranks (the metadata round), summed as integers at every hop, and decoded once.
class DeviceQuantCodec : public KernelCodec {
 public:
  DeviceQuantCodec(const QuantPlan& plan, DeviceCodecState* st) : KernelCodec(st), plan_(plan) {}

  size_t MaxWireBytes(size_t len) const override { return plan_.MaxWireBytes(len); }
  size_t HopBytes(size_t, size_t len) const override { return plan_.HopBytes(len); }
  size_t GatherBytes(size_t, size_t len) const override { return plan_.GatherBytes(len); }

  // With rotation, under the schedule's pointer rules: the rotation moves into the hop and decode kernels
  // (gpu::HopRequantRotated, gpu::DecodeRequantRotated; the lane tiles of gpu::LanesTiles and gpu::DecodeTiles, whose
  // group scales are found from the input too), which saves the two passes over the buffer. The hops read the
  // unrotated input. In an in-place call the decodes overwrite it as they go, while a hop still needs the whole
  // rotation blocks around its slice's ends; so a block that reaches past a slice is rotated in place by the first
  // hop that meets it, and later hops read it rotated (RotateEdgesInPlace).
  void PipelinePrepareAndFinish(bool average) override {
    fused_ = Fusable();
    finishScale_ = average ? 1.0f / static_cast<float>(plan_.nranks) : 1.0f;
  }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    meta->clear();
    count_ = count;
    if (fused_) {
      const size_t blocks = count / plan_.block;
      done_ = st_->done.Reserve<uint8_t>(blocks);
      if (blocks > 0) CheckCuda(cudaMemsetAsync(done_, 0, blocks, st_->stream()), "cudaMemsetAsync (rotation flags)");
      input_ = input;
      inPlace_ = input == work;
    } else if (plan_.rotate) {
      CheckLaunch(gpu::RotateForward(input, work, count, plan_.block, plan_.signKey, st_->stream()));
    } else {
      CopyInput(input, work, count);
    }
    if (!plan_.homomorphic || count == 0) return;
    const size_t groups = (count + plan_.group - 1) / plan_.group;
    float* dev = st_->scales.Reserve<float>(groups);
    if (fused_) {  // the scales of the rotated values, rotated from the input in the tiles
      tile::LanesArgs a = tile::ScalesArgsOf(nullptr, count, plan_.group, plan_.clipK, dev);
      a.hop = tile::RotatedFrom(a.hop, input, count, plan_.block, plan_.signKey, false);
      CheckLaunch(gpu::LanesTiles(a, st_->stream()));
    } else {
      CheckLaunch(gpu::GroupScales(work, count, plan_.group, plan_.clipK, dev, st_->stream()));
    }
    if (st_->streamOrdered()) {
      metaCount_ = groups;  // agreed in place by the schedule (DeviceMeta)
      return;
    }
    float* host = st_->hostMeta.Reserve<float>(groups);
    CheckCuda(cudaMemcpyAsync(host, dev, groups * sizeof(float), cudaMemcpyDeviceToHost, st_->stream()),
              "cudaMemcpyAsync (group scales out)");
    st_->Synchronize();
    meta->assign(host, host + groups);
  }

  float* DeviceMeta(size_t* count) override {
    *count = metaCount_;
    return metaCount_ > 0 ? static_cast<float*>(st_->scales.data()) : nullptr;
  }

  void ReserveScratch(size_t count, size_t maxLen) override {
    if (Fusable()) st_->done.Reserve<uint8_t>(count / plan_.block);
    if (plan_.homomorphic) {
      st_->scales.Reserve<float>((count + plan_.group - 1) / plan_.group);
      st_->sums.Reserve(PackedBytes(maxLen, plan_.laneBits));
    }
    st_->vals.Reserve<float>(maxLen);
    st_->codes.Reserve<uint16_t>(maxLen);
  }

  void SetMeta(const std::vector<float>& agreed) override {
    if (agreed.empty()) return;
    float* host = st_->hostMeta.Reserve<float>(agreed.size());
    std::copy(agreed.begin(), agreed.end(), host);
    CheckCuda(cudaMemcpyAsync(st_->scales.Reserve<float>(agreed.size()), host, agreed.size() * sizeof(float),
                              cudaMemcpyHostToDevice, st_->stream()),
              "cudaMemcpyAsync (agreed scales in)");
    st_->Synchronize();  // the pinned copy is rewritten by the next call's Prepare
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    if (!plan_.homomorphic || plan_.gatherExact) return Hop(wiresIn, nin, local, off, len, wireOut);
    // The integer sums, decoded, are requantized to b bits with fresh scales for the all-gather.
    const void* devIn[2];
    CopyIn(wiresIn, nin, plan_.HopBytes(len), devIn);
    void* devOut = OutSlot(len, wireOut);
    LanesHop(devIn, nin, local, off, len, devOut, true);
    return CopyOut(devOut, plan_.RequantBytes(len), wireOut);
  }

  void Finish(float* work, size_t count, bool average) override {
    const float scale = average ? 1.0f / static_cast<float>(plan_.nranks) : 1.0f;
    if (plan_.rotate) {
      // After fused decodes: only the blocks no decode held whole (marked in done_) are left.
      CheckLaunch(gpu::RotateInverse(work, count, plan_.block, plan_.signKey, scale, fused_ ? done_ : nullptr,
                                     st_->stream()));
    } else if (average) {
      CheckLaunch(gpu::Scale(work, count, scale, false, st_->stream()));
    }
  }

 protected:
  void HopKernels(const void* const* devIn, int nin, const float* local, size_t off, size_t len,
                  void* devOut) override {
    if (plan_.homomorphic) {
      LanesHop(devIn, nin, local, off, len, devOut, false);
      return;
    }
    if (fused_) {
      if (inPlace_) RotateEdgesInPlace(off, len);
      CheckLaunch(gpu::HopRequantRotated(devIn, nin, input_, count_, plan_.block, plan_.signKey, inPlace_, off, len,
                                         plan_.group, plan_.bits, plan_.format, plan_.clipK, plan_.rule, devOut,
                                         st_->stream()));
      return;
    }
    CheckLaunch(gpu::HopRequant(devIn, nin, local, len, off, plan_.group, plan_.bits, plan_.format, plan_.clipK,
                                plan_.rule, st_->vals.Reserve<float>(len), st_->codes.Reserve<uint16_t>(len), devOut,
                                st_->stream()));
  }
  void DecodeKernel(const void* devWire, size_t off, size_t len, float* out) override {
    if (fused_ && plan_.homomorphic && plan_.gatherExact) {
      const tile::DecodeArgs a = tile::RotatedBack(
          tile::DecodeArgsOf(devWire, off, len, plan_.group, plan_.bits, plan_.format, out), count_, plan_.block,
          plan_.signKey, finishScale_, done_);
      CheckLaunch(gpu::DecodeTiles(tile::LanesFrom(a, Scales(), plan_.laneBits, plan_.nranks), st_->stream()));
      return;
    }
    if (fused_) {
      CheckLaunch(gpu::DecodeRequantRotated(devWire, off, len, plan_.group, plan_.bits, plan_.format, count_,
                                            plan_.block, plan_.signKey, finishScale_, done_, out, st_->stream()));
      return;
    }
    if (plan_.homomorphic && plan_.gatherExact) {
      CheckLaunch(gpu::DecodeLanes(devWire, len, off, plan_.group, Scales(), plan_.bits, plan_.laneBits,
                                   plan_.nranks, out, st_->stream()));
    } else {
      CheckLaunch(gpu::DecodeRequant(devWire, len, plan_.group, plan_.bits, plan_.format, out, st_->stream()));
    }
  }

 private:
  const float* Scales() const { return static_cast<const float*>(st_->scales.data()); }

  // A rotation the tile kernels can fuse (under the schedule's pointer rules).
  bool Fusable() const {
    return plan_.rotate && tile::Covers(plan_.group) && tile::CoversRotation(plan_.block);
  }

  // The homomorphic hop: this rank's codes on the agreed scales plus the arriving lane streams; with `requant` (the
  // last reduce hop of a requantized all-gather) the sums decoded and encoded as a requant message with fresh
  // scales. One tile kernel (rotating from the input when fused), or for groups the tiles do not cover a kernel per
  // step.
  void LanesHop(const void* const* devIn, int nin, const float* local, size_t off, size_t len, void* devOut,
                bool requant) {
    if (tile::Covers(plan_.group)) {
      tile::HopArgs hop = tile::HopArgsOf(local, devIn, nin, off, len, plan_.group, plan_.bits, plan_.format,
                                          plan_.clipK, plan_.rule, devOut);
      if (fused_) {
        if (inPlace_) RotateEdgesInPlace(off, len);
        hop = tile::RotatedFrom(hop, input_, count_, plan_.block, plan_.signKey, inPlace_);
      }
      CheckLaunch(gpu::LanesTiles(tile::LanesArgsOf(hop, Scales(), plan_.laneBits, plan_.nranks, requant),
                                  st_->stream()));
      return;
    }
    void* sums = requant ? st_->sums.Reserve(PackedBytes(len, plan_.laneBits)) : devOut;
    CheckLaunch(gpu::EncodeLanes(local, len, off, plan_.group, Scales(), plan_.bits, plan_.laneBits, plan_.rule, sums,
                                 st_->stream()));
    for (int k = 0; k < nin; ++k) {
      CheckLaunch(gpu::AddLanes(sums, sums, devIn[k], len, plan_.laneBits, st_->stream()));
    }
    if (!requant) return;
    float* vals = st_->vals.Reserve<float>(len);
    CheckLaunch(gpu::DecodeLanes(sums, len, off, plan_.group, Scales(), plan_.bits, plan_.laneBits, plan_.nranks,
                                 vals, st_->stream()));
    CheckLaunch(gpu::EncodeRequant(vals, len, off, plan_.group, plan_.bits, plan_.format, plan_.clipK, plan_.rule,
                                   st_->codes.Reserve<uint16_t>(len), devOut, st_->stream()));
  }

  // In place, before a hop: queues the forward rotation of the blocks at the ends of [off, off + len) that reach
  // past it and that no earlier hop rotated. Their values in other slices are still the input: a slice is decoded
  // only after this rank's hop on it, which would have rotated the block.
  void RotateEdgesInPlace(size_t off, size_t len) {
    if (len == 0) return;
    for (size_t i : {off, off + len - 1}) {
      size_t s, l;
      tile::RotationBlockOf(count_, plan_.block, i, &s, &l);
      if ((s >= off && s + l <= off + len) || !rotatedEdges_.insert(s).second) continue;
      CheckLaunch(gpu::RotateBlockForward(const_cast<float*>(input_), s, l, plan_.signKey, st_->stream()));
    }
  }

  const QuantPlan plan_;
  size_t metaCount_ = 0;  // scales left on the device by a stream-ordered Prepare
  // The fused rotation (PipelinePrepareAndFinish): hops rotate their values from input_; decodes rotate back the
  // blocks they hold whole, marking them in done_ (one flag per full block) for Finish.
  bool fused_ = false;
  float finishScale_ = 1.0f;
  size_t count_ = 0;
  uint8_t* done_ = nullptr;
  const float* input_ = nullptr;
  bool inPlace_ = false;
  std::unordered_set<size_t> rotatedEdges_;  // in place: starts of the edge blocks rotated so far
};

}  // namespace

void CheckCuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // taken off the thread's error state (core/cuda_result.h, Launched)
  throw DeviceCodecError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

void CheckLaunch(ccResult_t r) {
  if (r != ccSuccess) throw DeviceCodecError(LastError());
}

void NarrowResult(ccDataType_t dtype, float* w, size_t count, void* out, float* e, float share, cudaStream_t s) {
  CheckLaunch(gpu::CastHop(dtype, nullptr, 0, w, count, out, e != nullptr ? w : nullptr, s));  // w: what it rounds off
  if (e == nullptr) return;
  if (share != 1.0f) CheckLaunch(gpu::Scale(w, count, share, false, s));
  CheckLaunch(gpu::DropNonFinite(w, count, s));  // a result that overflows 16 bits (or is not finite): nothing kept
  CheckLaunch(gpu::AddInto(e, w, count, s));
  CheckLaunch(gpu::DropNonFinite(e, count, s));
}

namespace {

// Waits for what is queued on s.s within s.timeoutMs: DeviceTimeoutError after that, DeviceCodecError on CUDA's error.
void WaitFor(const ScratchStream& s, const char* what) {
  const cudaError_t e = SynchronizeWithin(s.s, s.timeoutMs);
  if (e == cudaErrorTimeout) {
    throw DeviceTimeoutError(std::string(what) + " did not finish within " + std::to_string(s.timeoutMs) +
                             " ms (CC_TIMEOUT_MS); if the GPU is not busy with other work, ccoll's streams may share "
                             "a hardware queue with a stream that waits for them (see CUDA_DEVICE_MAX_CONNECTIONS in "
                             "the README)");
  }
  CheckCuda(e, what);
}

}  // namespace

bool DeviceCodecCovers(const ccCompressor& c) {
  switch (c.kind) {
    case ccCompressCast16: {
      const int64_t wire = c.Get(ccParamValueType);
      return wire == ccBfloat16 || wire == ccFloat16;
    }
    case ccCompressQuant:
      return c.Get(ccParamRotation) == 0 || static_cast<size_t>(c.Get(ccParamRotationBlock)) <= kMaxRotationBlock;
    case ccCompressTopkChunk:
    case ccCompressRandk:
      return true;
    case ccCompressPowerSGD:
#ifdef CCOLL_HAVE_CUBLAS
      return true;
#else
      return false;
#endif
  }
  return false;
}

GrowOnlyBuffer::~GrowOnlyBuffer() {
  retired_.push_back(p_);
  // After the work queued on the stream; the other streams are done with them.
  for (void* p : retired_) FreeScratch(device_, kind_ == kPinnedHost, p, stream_->s);
}

void* GrowOnlyBuffer::Reserve(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (p_ != nullptr && bytes <= bytes_) return p_;
  if (stream_->frozen) {
    throw ScratchFrozenError("the call needs " + std::to_string(bytes) + " bytes of ccoll's device scratch while its "
                           "stream is being captured into a CUDA graph, where ccoll does not allocate: run the same "
                           "call (compressor, count and datatype) once before capturing it");
  }
  size_t grown = bytes_ > 0 ? bytes_ : 256;
  while (grown < bytes) grown *= 2;
  void* fresh = nullptr;
  if (device_ < 0) CheckCuda(cudaGetDevice(&device_), "cudaGetDevice");
  CheckLaunch(AllocateScratch(device_, kind_ == kPinnedHost, grown, stream_->s, &fresh));
  // Other streams (the transport's copies) and the host may use it next: the allocation must have happened (growth is
  // rare). It is queued after the compressor's earlier calls, stream-ordered ones included (EndCallOnStream).
  try {
    WaitFor(*stream_, "the device codec's scratch allocation (queued after the compressor's earlier calls)");
  } catch (...) {
    retired_.push_back(fresh);  // freed with the object
    throw;
  }
  if (p_ != nullptr) retired_.push_back(p_);  // queued work may still use it; freed with the object
  p_ = fresh;
  bytes_ = grown;
  return p_;
}

std::shared_ptr<DeviceCodecState> DeviceCodecState::Create() {
  std::shared_ptr<DeviceCodecState> st(new DeviceCodecState());
  CheckCuda(cudaStreamCreateWithFlags(&st->stream_.s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return st;
}

DeviceCodecState::~DeviceCodecState() {
  if (callDone_ != nullptr) gpu::IgnoreCuda(cudaEventDestroy(callDone_));
}

void DeviceCodecState::BeginCallOnStream(cudaStream_t stream, bool capturing) {
  // The state (scratch, error feedback, Q) serves one call at a time, and the caller gives the compressor back once its
  // call is queued: so a call on another stream (another communicator of this rank, or the same one on another
  // stream) starts after the last call queued here has ended, as it would on one stream. A capture cannot wait for
  // work outside it (cudaErrorStreamCaptureIsolation): when its graph runs is the caller's to order, as with NCCL.
  if (!capturing && callDone_ != nullptr) {
    CheckCuda(cudaStreamWaitEvent(stream, callDone_, 0), "cudaStreamWaitEvent (the compressor's last call)");
  }
  inCall_ = true;
  callStream_ = stream;
  callCaptured_ = capturing;
  stream_.frozen = capturing;
  wireOnDevice = true;  // a stream-ordered call's wire slots are device memory (deviceWire)
}

void DeviceCodecState::EndCallOnStream() {
  if (!inCall_) return;
  cudaStream_t call = callStream_;
  const bool captured = callCaptured_;
  inCall_ = false;
  callStream_ = nullptr;
  callCaptured_ = false;
  stream_.frozen = false;
  if (captured) return;
  if (callDone_ == nullptr) {
    CheckCuda(cudaEventCreateWithFlags(&callDone_, cudaEventDisableTiming), "cudaEventCreateWithFlags (call done)");
  }
  CheckCuda(cudaEventRecord(callDone_, call), "cudaEventRecord (call done)");
  CheckCuda(cudaStreamWaitEvent(stream_.s, callDone_, 0), "cudaStreamWaitEvent (call done)");
}

ScratchStream::~ScratchStream() {
  if (s != nullptr) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaGetLastError();
}

void DeviceCodecState::Synchronize() { WaitFor(stream_, "the device codec's kernels"); }

void DeviceCodecState::SynchronizeQuietly() noexcept {
  if (SynchronizeWithin(stream_.s, stream_.timeoutMs) != cudaSuccess) cudaGetLastError();
}

float* DeviceCodecState::ErrorFeedback(size_t count) {
  if (errorFeedbackCount_ != count || errorFeedback_.data() == nullptr) {
    float* e = errorFeedback_.Reserve<float>(count);
    CheckCuda(cudaMemsetAsync(e, 0, count * sizeof(float), stream()), "cudaMemsetAsync (error feedback)");
    errorFeedbackCount_ = count;
  }
  return static_cast<float*>(errorFeedback_.data());
}

std::unique_ptr<gpu::LowRankBlas> DeviceCodecState::LendBlas(cudaStream_t s) {
#ifdef CCOLL_HAVE_CUBLAS
  void* workspace = blasWorkspace.Reserve(gpu::LowRankBlas::kWorkspaceBytes);
  std::unique_ptr<gpu::LowRankBlas> lent;
  const ccResult_t r = gpu::LowRankBlas::Create(s, workspace, gpu::LowRankBlas::kWorkspaceBytes, stream_.frozen, &lent);
  if (r == ccInvalidUsage) throw ScratchFrozenError(LastError());  // no handle to lend during a capture: a usage error
  CheckLaunch(r);
  return lent;
#else
  (void)s;
  throw DeviceCodecError("this build of ccoll has no cuBLAS");
#endif
}

std::unique_ptr<DeviceCodec> MakeDeviceCodec(const ccCompressor& c, const CodecCall& call, DeviceCodecState* st,
                                             float* rounding) {
  if (c.kind == ccCompressQuant) return std::make_unique<DeviceQuantCodec>(MakeQuantPlan(c, call), st);
  return std::make_unique<DeviceCastCodec>(static_cast<ccDataType_t>(c.Get(ccParamValueType)), call.nranks, rounding,
                                           st);
}

}  // namespace ccoll
