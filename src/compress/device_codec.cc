#include "compress/device_codec.h"

#include <cuda_runtime_api.h>

#include "compress/codec_cuda.h"
#include "compress/quant.h"
#include "core/error.h"

namespace ccoll {
namespace {

constexpr size_t kMaxRotationBlock = 16384;  // gpu::RotateForward keeps a block in shared memory

void CheckLaunch(ccResult_t r) {
  if (r != ccSuccess) throw DeviceCodecError(LastError());
}

// What both device codecs share: the wire copies around the hop and decode kernels. Subclasses say how many bytes a
// message has and which kernels turn messages and values into one another.
class DeviceCodec : public Codec {
 public:
  explicit DeviceCodec(DeviceCodecState* st) : st_(st) {}

  size_t Hop(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
             void* wireOut) override {
    const size_t inBytes = HopBytes(off, len), outBytes = HopBytes(off, len);
    st_->Reserve(len, MaxWireBytes(len));
    const void* devIn[2] = {st_->in[0], st_->in[1]};
    for (int k = 0; k < nin; ++k) {
      CheckCuda(cudaMemcpyAsync(st_->in[k], wiresIn[k], inBytes, cudaMemcpyHostToDevice, st_->stream()),
                "cudaMemcpyAsync (message in)");
    }
    HopKernels(devIn, nin, local, off, len);
    CheckCuda(cudaMemcpyAsync(wireOut, st_->out, outBytes, cudaMemcpyDeviceToHost, st_->stream()),
              "cudaMemcpyAsync (message out)");
    st_->Synchronize();
    return outBytes;
  }

  size_t ReduceFinal(const void* const* wiresIn, int nin, const float* local, size_t off, size_t len,
                     void* wireOut) override {
    return Hop(wiresIn, nin, local, off, len, wireOut);  // both covered codecs gather what a hop sends
  }

  void DecodeGather(const void* wire, size_t off, size_t len, float* out) override {
    st_->Reserve(len, MaxWireBytes(len));
    CheckCuda(cudaMemcpyAsync(st_->in[0], wire, GatherBytes(off, len), cudaMemcpyHostToDevice, st_->stream()),
              "cudaMemcpyAsync (payload in)");
    DecodeKernel(st_->in[0], off, len, out);
    st_->Synchronize();  // the schedule reuses the host slot
  }

 protected:
  // Queue the kernels that write st_->out from the devIn messages and `local`.
  virtual void HopKernels(const void* const* devIn, int nin, const float* local, size_t off, size_t len) = 0;
  virtual void DecodeKernel(const void* devWire, size_t off, size_t len, float* out) = 0;

  void CopyInput(const float* input, float* work, size_t count) {
    if (work == input || count == 0) return;
    CheckCuda(cudaMemcpyAsync(work, input, count * sizeof(float), cudaMemcpyDeviceToDevice, st_->stream()),
              "cudaMemcpyAsync (input to work)");
  }

  DeviceCodecState* st_;
};

class DeviceCastCodec : public DeviceCodec {
 public:
  DeviceCastCodec(ccDataType_t wire, int nranks, DeviceCodecState* st) : DeviceCodec(st), wire_(wire), nranks_(nranks) {}

  size_t MaxWireBytes(size_t len) const override { return 2 * len; }
  size_t HopBytes(size_t, size_t len) const override { return 2 * len; }
  size_t GatherBytes(size_t, size_t len) const override { return 2 * len; }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    meta->clear();
    CopyInput(input, work, count);
  }

  void Finish(float* work, size_t count, bool average) override {
    if (average) CheckLaunch(gpu::Scale(work, count, static_cast<float>(nranks_), true, st_->stream()));
  }

 protected:
  void HopKernels(const void* const* devIn, int nin, const float* local, size_t, size_t len) override {
    CheckLaunch(gpu::CastHop(wire_, devIn, nin, local, len, st_->out, st_->stream()));
  }
  void DecodeKernel(const void* devWire, size_t, size_t len, float* out) override {
    CheckLaunch(gpu::CastDecode(wire_, devWire, len, out, st_->stream()));
  }

 private:
  const ccDataType_t wire_;
  const int nranks_;
};

// Requant only: each message carries its own scales, so there is no metadata to agree on.
class DeviceQuantCodec : public DeviceCodec {
 public:
  DeviceQuantCodec(const QuantPlan& plan, DeviceCodecState* st) : DeviceCodec(st), plan_(plan) {}

  size_t MaxWireBytes(size_t len) const override { return plan_.RequantBytes(len); }
  size_t HopBytes(size_t, size_t len) const override { return plan_.RequantBytes(len); }
  size_t GatherBytes(size_t, size_t len) const override { return plan_.RequantBytes(len); }

  void Prepare(const float* input, float* work, size_t count, std::vector<float>* meta) override {
    meta->clear();
    if (plan_.rotate) {
      CheckLaunch(gpu::RotateForward(input, work, count, plan_.block, plan_.signKey, st_->stream()));
    } else {
      CopyInput(input, work, count);
    }
  }

  void Finish(float* work, size_t count, bool average) override {
    const float scale = average ? 1.0f / static_cast<float>(plan_.nranks) : 1.0f;
    if (plan_.rotate) {
      CheckLaunch(gpu::RotateInverse(work, count, plan_.block, plan_.signKey, scale, st_->stream()));
    } else if (average) {
      CheckLaunch(gpu::Scale(work, count, scale, false, st_->stream()));
    }
  }

 protected:
  void HopKernels(const void* const* devIn, int nin, const float* local, size_t off, size_t len) override {
    CheckLaunch(gpu::HopRequant(devIn, nin, local, len, off, plan_.group, plan_.bits, plan_.format, plan_.clipK,
                                plan_.rule, st_->vals, st_->codes, st_->out, st_->stream()));
  }
  void DecodeKernel(const void* devWire, size_t, size_t len, float* out) override {
    CheckLaunch(gpu::DecodeRequant(devWire, len, plan_.group, plan_.bits, plan_.format, out, st_->stream()));
  }

 private:
  const QuantPlan plan_;
};

}  // namespace

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw DeviceCodecError(std::string(what) + " failed: " + cudaGetErrorString(e));
}

bool DeviceCodecCovers(const ccCompressor& c) {
  if (c.kind == ccCompressCast16) {
    const int64_t wire = c.Get(ccParamValueType);
    return wire == ccBfloat16 || wire == ccFloat16;
  }
  if (c.kind == ccCompressQuant) {
    return c.Get(ccParamMode) == ccQuantRequant &&
           (c.Get(ccParamRotation) == 0 || static_cast<size_t>(c.Get(ccParamRotationBlock)) <= kMaxRotationBlock);
  }
  return false;
}

std::shared_ptr<DeviceCodecState> DeviceCodecState::Create() {
  std::shared_ptr<DeviceCodecState> st(new DeviceCodecState());
  CheckCuda(cudaStreamCreateWithFlags(&st->stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return st;
}

DeviceCodecState::~DeviceCodecState() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (void* p : {in[0], in[1], out, static_cast<void*>(vals), static_cast<void*>(codes)}) cudaFree(p);
  cudaFreeHost(hostWire_);
  cudaGetLastError();
}

char* DeviceCodecState::HostWire(size_t bytes) {
  if (bytes > hostWireBytes_) {
    Synchronize();
    cudaFreeHost(hostWire_);
    hostWire_ = nullptr;
    hostWireBytes_ = 0;
    CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&hostWire_), bytes, cudaHostAllocPortable),
              "cudaHostAlloc (wire slots)");
    hostWireBytes_ = bytes;
  }
  return hostWire_;
}

void DeviceCodecState::Reserve(size_t elems, size_t wireBytes) {
  if (elems <= elems_ && wireBytes <= wireBytes_) return;
  Synchronize();  // nothing queued may still use the old buffers
  if (elems > elems_) {
    cudaFree(vals);
    cudaFree(codes);
    vals = nullptr;
    codes = nullptr;
    elems_ = 0;
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&vals), elems * sizeof(float)), "cudaMalloc (values)");
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&codes), elems * sizeof(uint16_t)), "cudaMalloc (codes)");
    elems_ = elems;
  }
  if (wireBytes > wireBytes_) {
    for (void** p : {&in[0], &in[1], &out}) {
      cudaFree(*p);
      *p = nullptr;
    }
    wireBytes_ = 0;
    for (void** p : {&in[0], &in[1], &out}) CheckCuda(cudaMalloc(p, wireBytes), "cudaMalloc (messages)");
    wireBytes_ = wireBytes;
  }
}

void DeviceCodecState::Synchronize() { CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

std::unique_ptr<Codec> MakeDeviceCodec(const ccCompressor& c, const CodecCall& call, DeviceCodecState* st) {
  if (c.kind == ccCompressQuant) return std::make_unique<DeviceQuantCodec>(MakeQuantPlan(c, call), st);
  return std::make_unique<DeviceCastCodec>(static_cast<ccDataType_t>(c.Get(ccParamValueType)), call.nranks, st);
}

}  // namespace ccoll
