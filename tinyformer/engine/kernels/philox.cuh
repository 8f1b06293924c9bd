// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
// a counter-based generator, so a kernel can regenerate any element's random number from
// (seed, counter) alone. kernels/philox.py is the same function in NumPy.
#pragma once
#include "common.cuh"

namespace tf {

struct Philox4 {
    unsigned x, y, z, w;
};

__device__ __forceinline__ void mul_hi_lo(unsigned a, unsigned b, unsigned* hi, unsigned* lo) {
    unsigned long long product = (unsigned long long)a * b;
    *hi = (unsigned)(product >> 32);
    *lo = (unsigned)product;
}

__device__ __forceinline__ Philox4 philox4x32_10(Philox4 counter, unsigned key0, unsigned key1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            key0 += 0x9E3779B9u;
            key1 += 0xBB67AE85u;
        }
        unsigned hi0, lo0, hi1, lo1;
        mul_hi_lo(0xD2511F53u, counter.x, &hi0, &lo0);
        mul_hi_lo(0xCD9E8D57u, counter.z, &hi1, &lo1);
        counter = {hi1 ^ counter.y ^ key0, lo1, hi0 ^ counter.w ^ key1, lo0};
    }
    return counter;
}

// The 4 words of Philox block `block` of the stream (seed, offset): counter (block, offset), key seed.
__device__ __forceinline__ Philox4 philox_block(unsigned long long seed, unsigned long long offset,
                                                unsigned long long block) {
    return philox4x32_10({(unsigned)block, (unsigned)(block >> 32), (unsigned)offset, (unsigned)(offset >> 32)},
                         (unsigned)seed, (unsigned)(seed >> 32));
}

// The seed of a launch: *seed_ptr where given (one entry of a device table that a captured CUDA
// graph's owner refills before each replay, so that a replay draws new masks), else `seed`.
__device__ __forceinline__ unsigned long long resolve_seed(unsigned long long seed,
                                                           const unsigned long long* seed_ptr) {
    return seed_ptr != nullptr ? *seed_ptr : seed;
}

// A word's top 24 bits as a float in [0, 1): (word >> 8) / 2^24.
__device__ __forceinline__ float uniform_from_word(unsigned word) { return (word >> 8) * (1.0f / 16777216.0f); }

// A uniform float in [0, 1) for element `index` of the stream (seed, offset): word index % 4
// of the Philox block index / 4.
__device__ __forceinline__ float philox_uniform(unsigned long long seed, unsigned long long offset,
                                                unsigned long long index) {
    const Philox4 r = philox_block(seed, offset, index >> 2);
    const unsigned word = (index & 3) == 0 ? r.x : (index & 3) == 1 ? r.y : (index & 3) == 2 ? r.z : r.w;
    return uniform_from_word(word);
}

}  // namespace tf
