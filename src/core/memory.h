// Where a user buffer lives. Host buffers go through the CPU backend; device buffers through the CUDA backend.
#pragma once

namespace ccoll {

// The CUDA device that holds ptr (device or managed memory), or -1 for host memory. Always -1 in a build without
// CUDA, when no CUDA device is present, and for NULL.
int PointerDevice(const void* ptr);

}  // namespace ccoll
