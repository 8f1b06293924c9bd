// CPU emulation of the CUDA features tinyformer's kernels use, so that the fp32 kernels
// build as C++ with the system compiler and run in CI, where there is no GPU.
//
// The model: one launch runs its blocks one after another; each block runs its threads as
// real std::threads. Hence
//   - threadIdx is per thread; blockIdx, blockDim and gridDim are per launch/block;
//   - __shared__ is `static`: one copy, used by the one block that runs at a time;
//   - __syncthreads() is a std::barrier over the block's threads, a warp shuffle a
//     std::barrier over the warp's threads around a slot exchange;
//   - a thread that returns drops out of both barriers, as an exited CUDA thread does.
// A kernel that calls __syncthreads() or a shuffle divergently deadlocks here, and reads
// of memory it does not own show up under AddressSanitizer: both are bugs on a GPU too.
// Tensor-core instructions (wmma/mma) are not emulated.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define TF_CPU_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};

namespace tf_emu {

using Barrier = std::barrier<>;

struct Block {
    unsigned threads = 0;
    std::unique_ptr<Barrier> block_barrier;
    std::vector<std::unique_ptr<Barrier>> warp_barriers;
    std::vector<uint64_t> slots;  // one per thread, for shuffles
};

inline thread_local uint3 thread_index;
inline thread_local unsigned linear_thread;
inline uint3 block_index;
inline dim3 block_dim, grid_dim;
inline Block* current_block = nullptr;

template <typename T, typename SourceLane>
T shuffle(T value, SourceLane source_lane) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a type wider than 8 bytes");
    Block& b = *current_block;
    const unsigned me = linear_thread, base = me & ~31u, lane = me & 31u;
    Barrier& warp = *b.warp_barriers[me >> 5];
    std::memcpy(&b.slots[me], &value, sizeof(T));
    warp.arrive_and_wait();
    T result = value;
    const int src = source_lane(lane);
    if (src >= 0 && base + src < b.threads) std::memcpy(&result, &b.slots[base + src], sizeof(T));
    warp.arrive_and_wait();
    return result;
}

template <typename... Args, std::size_t... I>
void invoke(void (*kernel)(Args...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<Args>*>(args[I])...);
}

// Runs kernel<<<grid, block>>>(args...) with args given as cuLaunchKernel takes them:
// args[i] points at the value of the i-th parameter.
template <typename... Args>
void launch(void (*kernel)(Args...), dim3 grid, dim3 block, void** args) {
    const unsigned n = block.x * block.y * block.z;
    grid_dim = grid;
    block_dim = block;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                Block b;
                b.threads = n;
                b.block_barrier = std::make_unique<Barrier>(n);
                for (unsigned w = 0; w < (n + 31) / 32; ++w)
                    b.warp_barriers.push_back(std::make_unique<Barrier>(std::min(32u, n - 32 * w)));
                b.slots.assign(n, 0);
                block_index = {x, y, z};
                current_block = &b;
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned t = 0; t < n; ++t)
                    threads.emplace_back([&, t] {
                        linear_thread = t;
                        thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        invoke(kernel, args, std::index_sequence_for<Args...>{});
                        b.block_barrier->arrive_and_drop();
                        b.warp_barriers[t >> 5]->arrive_and_drop();
                    });
                for (auto& th : threads) th.join();
                current_block = nullptr;
            }
}

}  // namespace tf_emu

#define threadIdx (tf_emu::thread_index)
#define blockIdx (tf_emu::block_index)
#define blockDim (tf_emu::block_dim)
#define gridDim (tf_emu::grid_dim)

inline void __syncthreads() { tf_emu::current_block->block_barrier->arrive_and_wait(); }

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
