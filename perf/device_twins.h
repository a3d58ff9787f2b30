// Device twins of the benchmark's host buffers (allreduce_perf -G 1): one cudaMalloc per host buffer, copied in
// after the loop writes the host buffer and out before it reads it, and the rank's own non-blocking stream. Only
// built with CUDA.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ccperf {

class DeviceTwins {
 public:
  DeviceTwins() = default;
  ~DeviceTwins();
  DeviceTwins(const DeviceTwins&) = delete;
  DeviceTwins& operator=(const DeviceTwins&) = delete;

  // Device 0 current for this thread, and a stream for this rank.
  bool Init(std::string* error);
  void* stream() const { return stream_; }

  // The device address of host address `host`, inside a buffer uploaded before; nullptr when none holds it.
  void* Twin(const void* host) const;
  // Copies [host, host + bytes) to its twin; the first upload of a buffer allocates the twin (bytes: its size).
  bool Upload(const void* host, size_t bytes, std::string* error);
  bool Download(void* host, size_t bytes, std::string* error);
  // Waits for everything queued on the stream.
  bool Sync(std::string* error);

 private:
  struct Pair {
    const char* host;
    char* device;
    size_t bytes;
  };
  const Pair* Find(const void* host, size_t bytes) const;

  std::vector<Pair> pairs_;
  void* stream_ = nullptr;
};

}  // namespace ccperf
