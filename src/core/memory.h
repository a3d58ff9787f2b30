// Where a user buffer lives. Host buffers go through the CPU backend; device buffers need the CUDA backend.
#pragma once

namespace ccoll {

// True when ptr is CUDA device (or managed) memory. Always false in a build without CUDA, and when no CUDA device
// is present.
bool IsDevicePointer(const void* ptr);

}  // namespace ccoll
