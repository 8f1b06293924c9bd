// Inverted dropout with its mask drawn on the device from Philox. Reference: functional.Dropout.
#include "philox.cuh"

// For the n elements of contiguous x, with u_i = philox_uniform(seed, offset, i), seed = *seed_ptr
// where seed_ptr is not null (tf::resolve_seed):
//   keep_i = u_i >= p;  y_i = x_i · (keep_i ? scale : 0)
// (so a dropped NaN or infinity gives NaN, as x ∘ keep · scale does in the reference).
// A thread takes a group of 4 consecutive elements 4g..4g+3, the 4 words of Philox block g,
// so one philox4x32_10 call serves 4 elements; a full group stores its 4 keep bytes as one
// little-endian word (byte j is keep[4g + j]).
// Grid-stride over the groups, 64-bit indices.
template <typename T>
__global__ void dropout_forward(const T* __restrict__ x, T* __restrict__ y, bool* __restrict__ keep, long long n,
                                float p, float scale, unsigned long long seed,
                                const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    seed = tf::resolve_seed(seed, seed_ptr);
    const long long groups = (n + 3) / 4;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        const tf::Philox4 r = tf::philox_block(seed, offset, g);
        const unsigned words[4] = {r.x, r.y, r.z, r.w};
        const long long first = 4 * g;
        const int count = n - first < 4 ? (int)(n - first) : 4;
        unsigned packed = 0;
        for (int j = 0; j < count; ++j) {
            const bool kept = tf::uniform_from_word(words[j]) >= p;
            y[first + j] = tf::from_float<T>(tf::to_float(x[first + j]) * (kept ? scale : 0.0f));
            packed |= (unsigned)kept << (8 * j);
        }
        if (count == 4) {
            reinterpret_cast<unsigned*>(keep)[g] = packed;  // keep is the wrapper's own allocation: 4-byte aligned
        } else {
            for (int j = 0; j < count; ++j) keep[first + j] = (packed >> (8 * j)) & 1u;
        }
    }
}
