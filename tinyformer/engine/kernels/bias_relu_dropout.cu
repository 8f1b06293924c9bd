// The feed-forward net's epilogue after its first product (§3.3, with activation dropout):
// z = dropout(max(0, y + b)) in place, in one pass. Reference: functional.LinearReluDropout.
// Rounded as the unfused ops round (y + b to T, then the dropout's product to T); the mask is
// dropout.cu's for the same (seed, offset), seed = *seed_ptr where given: keep_e =
// philox_uniform(seed, offset, e) >= p over the elements in C order (p = 0 keeps everything and
// draws nothing). mask_e = [y_e + b > 0] ∧ keep_e, what the backward needs: dy = dz ∘ mask · scale.
#include "philox.cuh"

// y: n elements, rows of `cols`. A thread takes 4 consecutive elements (one Philox block);
// grid-stride, 64-bit indices.
template <typename T>
__global__ void bias_relu_dropout_forward(T* __restrict__ y, const T* __restrict__ bias, bool* __restrict__ mask,
                                          long long n, int cols, float p, float scale, unsigned long long seed,
                                          const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    seed = tf::resolve_seed(seed, seed_ptr);
    const long long groups = (n + 3) / 4, stride = (long long)gridDim.x * blockDim.x;
    for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        const tf::Philox4 r = p > 0.0f ? tf::philox_block(seed, offset, g) : tf::Philox4{0, 0, 0, 0};
        const unsigned words[4] = {r.x, r.y, r.z, r.w};
        for (int j = 0; j < 4 && 4 * g + j < n; ++j) {
            const long long e = 4 * g + j;
            const float z = tf::to_float(tf::from_float<T>(tf::to_float(y[e]) + tf::to_float(bias[e % cols])));
            const bool kept = p <= 0.0f || tf::uniform_from_word(words[j]) >= p, positive = z > 0.0f;
            y[e] = tf::from_float<T>(!positive || !kept ? 0.0f : p > 0.0f ? z * scale : z);
            mask[e] = positive && kept;
        }
    }
}

// dy = dz ∘ mask · scale (scale 1 without dropout), grid-stride.
template <typename T>
__global__ void bias_relu_dropout_backward(const T* __restrict__ grad_z, const bool* __restrict__ mask,
                                           T* __restrict__ grad_y, long long n, float scale) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        grad_y[e] = tf::from_float<T>(mask[e] ? tf::to_float(grad_z[e]) * scale : 0.0f);
}
