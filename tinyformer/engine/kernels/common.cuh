// Shared helpers of tinyformer's CUDA kernels: element types, warp and block reductions.
//
// Every kernel reads its inputs as T (float, __half or __nv_bfloat16), computes in float
// and writes T. The same source also builds as plain C++ against the CPU emulation's header (where
// TF_CPU_EMULATION is defined and __half/__nv_bfloat16 are its host structs), so nothing here
// may rely on a GPU-only feature outside the #ifndef below.
//
// Block sizes are not defined here or in any kernel source: kernels/registry.py passes them
// at compile time (-DTF_WARP_SIZE=... etc., registry.compile_options()).
#pragma once

#if !defined(TF_WARP_SIZE) || !defined(TF_ROW_BLOCK) || !defined(TF_ATTENTION_WARPS) || !defined(TF_ATTENTION_KEY_TILE)
#error "compile the kernels with the launch geometry of kernels/registry.py: registry.compile_options()"
#endif

#ifndef TF_CPU_EMULATION
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define TF_INFINITY __int_as_float(0x7f800000)
#else
#define TF_INFINITY INFINITY
#endif

// The block's dynamic shared memory (the launch's shared_mem bytes) as `unsigned char* name`.
#ifdef TF_CPU_EMULATION
#define TF_DYNAMIC_SHARED(name) unsigned char* name = tf_emu::dynamic_shared()
#else
#define TF_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace tf {

constexpr int kWarp = TF_WARP_SIZE;
constexpr unsigned kFullMask = 0xffffffffu;
static_assert(kWarp == 32, "the shuffles' full masks and the emulation's warps have 32 lanes");
constexpr int kRowBlockWarps = TF_ROW_BLOCK / kWarp;  // warps of the largest row-kernel block
static_assert(kRowBlockWarps * kWarp == TF_ROW_BLOCK, "the row block must be whole warps");

__device__ __forceinline__ float to_float(float x) { return x; }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

__device__ __forceinline__ double warp_sum_double(double v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// Online softmax statistics: the running maximum m and the sum s of exp(x - m).
struct MaxSum {
    float max;
    float sum;
};

__device__ __forceinline__ MaxSum max_sum_add(MaxSum a, float x) {
    if (x == -TF_INFINITY) return a;
    if (x > a.max) return {x, a.sum * expf(a.max - x) + 1.0f};
    return {a.max, a.sum + expf(x - a.max)};
}

__device__ __forceinline__ MaxSum max_sum_merge(MaxSum a, MaxSum b) {
    if (b.max == -TF_INFINITY) return a;
    if (a.max == -TF_INFINITY) return b;
    float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ MaxSum warp_max_sum(MaxSum v) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        MaxSum other = {__shfl_xor_sync(kFullMask, v.max, offset), __shfl_xor_sync(kFullMask, v.sum, offset)};
        v = max_sum_merge(v, other);
    }
    return v;
}

// Block-wide reductions. `scratch` is __shared__ storage of one entry per warp of the block
// (kRowBlockWarps for the row kernels' blocks of up to TF_ROW_BLOCK threads); every thread of the
// block must call these (they contain __syncthreads). `identity` is what a missing warp contributes.
template <typename V, typename WarpReduce>
__device__ __forceinline__ V block_reduce(V v, V* scratch, V identity, WarpReduce warp_reduce) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int warps = (blockDim.x + kWarp - 1) / kWarp;
    v = warp_reduce(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : identity;
    return warp_reduce(v);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, 0.0f, warp_sum); }

// A sum in double (Adam's gradient norm).
__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
    return block_reduce(v, scratch, 0.0, warp_sum_double);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce(v, scratch, -TF_INFINITY, warp_max);
}

__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, MaxSum* scratch) {
    return block_reduce(v, scratch, MaxSum{-TF_INFINITY, 0.0f}, warp_max_sum);
}

}  // namespace tf
