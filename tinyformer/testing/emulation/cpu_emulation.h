// CPU emulation of the CUDA features tinyformer's kernels use, so that the kernels build as
// C++ with the system compiler and run in CI, where there is no GPU. In three parts:
//   - cpu_emulation_threads.h: the thread model (a block's threads as fibers switched at
//     barriers, shuffles, warp-collective exchanges, dynamic shared memory) and the launch;
//   - cpu_emulation_half.h: __half and __nv_bfloat16 with round-to-nearest-even conversions;
//   - cpu_emulation_warp.h: mma.sync m16n8k16, ldmatrix and cp.async, warp-collective and
//     following the PTX ISA's fragment layouts.
// This header includes them and maps the CUDA keywords and built-ins (threadIdx, __syncthreads,
// the shuffles, atomicAdd, the math intrinsics) onto them; a kernel source needs only it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "cpu_emulation_half.h"
#include "cpu_emulation_threads.h"
#include "cpu_emulation_warp.h"

#define TF_CPU_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define __launch_bounds__(...)

#define threadIdx (tf_emu::current_thread->index)
#define blockIdx (tf_emu::block_index)
#define blockDim (tf_emu::block_dim)
#define gridDim (tf_emu::grid_dim)

inline void __syncthreads() { tf_emu::arrive_and_wait(tf_emu::current_block->block_barrier, tf_emu::BLOCK_BARRIER); }

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
    return tf_emu::shuffle(value, [&](unsigned lane) { return int((lane ^ lane_mask) % width + lane / width * width); });
}
template <typename T>
T __shfl_sync(unsigned, T value, int src_lane, int width = 32) {
    return tf_emu::shuffle(value, [&](unsigned lane) { return int(lane / width * width + src_lane % width); });
}
template <typename T>
T __shfl_down_sync(unsigned, T value, unsigned delta, int width = 32) {
    return tf_emu::shuffle(value, [&](unsigned lane) {
        return (lane % width) + delta < unsigned(width) ? int(lane + delta) : int(lane);
    });
}

inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}
inline int atomicAdd(int* address, int value) { return std::atomic_ref<int>(*address).fetch_add(value); }
// The blocks of a launch run one after another on one OS thread: every write is seen by every later block.
inline void __threadfence() {}

inline float __int_as_float(int x) {
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
using std::max;
using std::min;
using std::isfinite;
