// CC_HD marks element math shared by the CPU drivers and the CUDA kernels: the CPU path is the reference the GPU
// path must match byte for byte, so both compile the same inline functions.
#pragma once

#if defined(__CUDACC__)
#define CC_HD __host__ __device__ __forceinline__
#else
#define CC_HD inline
#endif
