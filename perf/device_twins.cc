#include "device_twins.h"

#include <cuda_runtime_api.h>

namespace ccperf {
namespace {

bool Ok(cudaError_t e, const char* what, std::string* error) {
  if (e == cudaSuccess) return true;
  *error = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

}  // namespace

DeviceTwins::~DeviceTwins() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (const Pair& p : pairs_) cudaFree(p.device);
}

bool DeviceTwins::Init(std::string* error) {
  cudaStream_t s = nullptr;
  if (!Ok(cudaSetDevice(0), "cudaSetDevice(0)", error)) return false;
  if (!Ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", error)) return false;
  stream_ = s;
  return true;
}

const DeviceTwins::Pair* DeviceTwins::Find(const void* host, size_t bytes) const {
  const char* h = static_cast<const char*>(host);
  for (const Pair& p : pairs_) {
    if (h >= p.host && h + bytes <= p.host + p.bytes) return &p;
  }
  return nullptr;
}

void* DeviceTwins::Twin(const void* host) const {
  const Pair* p = Find(host, 0);
  return p ? p->device + (static_cast<const char*>(host) - p->host) : nullptr;
}

bool DeviceTwins::Upload(const void* host, size_t bytes, std::string* error) {
  const Pair* p = Find(host, bytes);
  if (p == nullptr) {
    void* d = nullptr;
    if (!Ok(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc", error)) return false;
    pairs_.push_back(Pair{static_cast<const char*>(host), static_cast<char*>(d), bytes});
    p = &pairs_.back();
  }
  char* dst = p->device + (static_cast<const char*>(host) - p->host);
  return Ok(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)),
            "cudaMemcpyAsync (to the device)", error) &&
         Sync(error);
}

bool DeviceTwins::Download(void* host, size_t bytes, std::string* error) {
  const Pair* p = Find(host, bytes);
  if (p == nullptr) {
    *error = "no device twin holds the host range";
    return false;
  }
  const char* src = p->device + (static_cast<const char*>(host) - p->host);
  return Ok(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)),
            "cudaMemcpyAsync (from the device)", error) &&
         Sync(error);
}

bool DeviceTwins::Sync(std::string* error) {
  return Ok(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize", error);
}

}  // namespace ccperf
