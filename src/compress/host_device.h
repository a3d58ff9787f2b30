// CC_HD marks element math shared by the CPU drivers and the CUDA kernels: the CPU path is the reference the GPU
// path must match byte for byte, so both compile the same inline functions.
#pragma once

#if defined(__CUDACC__)
#define CC_HD __host__ __device__ __forceinline__
#define CC_UNROLL _Pragma("unroll")  // a loop of constant trip count, so that its arrays stay in registers
#else
#define CC_HD inline
#define CC_UNROLL
#endif
