// Adam over all parameters, with the global gradient norm, clipping and the non-finite skip
// decided on the device: two launches, no host read, no per-step value in the arguments (a CUDA
// graph can hold them). Reference: optim.adam.fused_update (its NumPy twin) and
// optim.Adam.step.
//
// The parameters are a table of pointers; the work is cut into chunks of `chunk_size`
// elements, chunk c being elements [chunk_start[c], chunk_start[c] + chunk_size) of tensor
// chunk_tensor[c] (clipped to its size). One block per chunk in both kernels.
//
//   adam_norm_partials: partials[c] = Σ g² over chunk c, in double (one block per chunk, no
//     atomics: the same sums in the same order every time).
//   adam_update: every block sums the partials in one fixed order, so all agree on ‖g‖², and
//     reads the step's scalars from `hyper` (float32; kernels/adam.py: ADAM_HYPER): step_size = lr / (1 − β₁ᵗ),
//     bias2 = 1 − β₂ᵗ, the loss scale s (1 without), max_grad_norm (≤ 0: no clipping) and
//     skip_nonfinite (0: update whatever the norm, as Adam.step without it). Then
//       norm = √‖g‖² / s;  applied = !skip_nonfinite || (float(norm) finite && (loss null or finite))
//     Not applied: the block writes nothing. Applied, with multiplier μ = clip / s, where clip =
//     max_norm / (norm + 1e-12) if max_norm > 0 and the norm is finite and above it, else 1:
//       g ← g·μ + λθ;  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  θ ← θ − step_size · m / (√(v / bias2) + ε)
//     Block 0 writes result[0] = float(norm) (inf or nan as computed), result[1] = applied.
//
// Mixed precision: `copies` (or null) is a table of each parameter's compute copy (null where it
// has none), of `copy_type` 1 (__half) or 2 (__nv_bfloat16): the updated θ is rounded into it in
// the same pass, so the half-precision weights need no pass of their own.
#include "common.cuh"

namespace tf_adam {

// Entries of `hyper` (kernels/adam.py: ADAM_HYPER names them in the same order).
enum Hyper { kStepSize, kBias2, kGradScale, kMaxGradNorm, kSkipNonfinite };

struct Chunk {
    int tensor;
    long long first, last;
};

__device__ __forceinline__ Chunk this_chunk(const long long* sizes, const int* chunk_tensor,
                                            const long long* chunk_start, int chunk_size) {
    const int tensor = chunk_tensor[blockIdx.x];
    const long long first = chunk_start[blockIdx.x];
    return {tensor, first, min(sizes[tensor], first + chunk_size)};
}

struct StepScalars {
    float norm;             // ‖g‖ / s as reported
    bool applied;           // whether the update runs
    float grad_multiplier;  // clip(norm) / s
};

// What optim.adam._clip_factor and Adam.step decide on the host, from ‖g‖² of the scaled gradients.
__device__ __forceinline__ StepScalars step_scalars(double squared_norm, const float* hyper, const float* loss) {
    const double scale = hyper[kGradScale], max_norm = hyper[kMaxGradNorm];
    const double norm = sqrt(squared_norm) / scale;
    const float reported = (float)norm;
    const bool finite = isfinite(reported) && (loss == nullptr || isfinite(*loss));
    const double clip = max_norm > 0.0 && isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-12) : 1.0;
    return {reported, hyper[kSkipNonfinite] == 0.0f || finite, (float)(clip / scale)};
}

}  // namespace tf_adam

// grid: the plan's chunks; block: registry.ADAM_BLOCK threads (at most 1024).
template <typename T>
__global__ void adam_norm_partials(const T* const* __restrict__ grads, const long long* __restrict__ sizes,
                                   const int* __restrict__ chunk_tensor, const long long* __restrict__ chunk_start,
                                   int chunk_size, double* __restrict__ partials) {
    __shared__ double scratch[tf::kWarp];  // one entry per warp of a block of up to 1024 threads
    const tf_adam::Chunk c = tf_adam::this_chunk(sizes, chunk_tensor, chunk_start, chunk_size);
    const T* g = grads[c.tensor];
    double sum = 0.0;
    for (long long e = c.first + threadIdx.x; e < c.last; e += blockDim.x) {
        const double x = tf::to_float(g[e]);
        sum += x * x;
    }
    sum = tf::block_sum_double(sum, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// grid: max(chunks, 1) (a plan without elements still writes `result`); block: registry.ADAM_BLOCK.
template <typename T>
__global__ void adam_update(T* const* __restrict__ params, const T* const* __restrict__ grads, T* const* __restrict__ m,
                            T* const* __restrict__ v, void* const* __restrict__ copies, int copy_type,
                            const long long* __restrict__ sizes, const int* __restrict__ chunk_tensor,
                            const long long* __restrict__ chunk_start, int chunk_size, int chunks,
                            const double* __restrict__ partials, const float* __restrict__ hyper,
                            const float* __restrict__ loss, float* __restrict__ result, float beta1, float beta2,
                            float eps, float weight_decay) {
    __shared__ double scratch[tf::kWarp];
    double squared_norm = 0.0;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) squared_norm += partials[i];
    squared_norm = tf::block_sum_double(squared_norm, scratch);
    const tf_adam::StepScalars s = tf_adam::step_scalars(squared_norm, hyper, loss);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        result[0] = s.norm;
        result[1] = s.applied ? 1.0f : 0.0f;
    }
    if (!s.applied || (int)blockIdx.x >= chunks) return;
    const float step_size = hyper[tf_adam::kStepSize], bias2 = hyper[tf_adam::kBias2];
    const tf_adam::Chunk c = tf_adam::this_chunk(sizes, chunk_tensor, chunk_start, chunk_size);
    T* p = params[c.tensor];
    const T* g = grads[c.tensor];
    T* m_t = m[c.tensor];
    T* v_t = v[c.tensor];
    void* copy = copies == nullptr ? nullptr : copies[c.tensor];
    for (long long e = c.first + threadIdx.x; e < c.last; e += blockDim.x) {
        const float theta = tf::to_float(p[e]);
        const float grad = tf::to_float(g[e]) * s.grad_multiplier + weight_decay * theta;
        const float m_new = beta1 * tf::to_float(m_t[e]) + (1.0f - beta1) * grad;
        const float v_new = beta2 * tf::to_float(v_t[e]) + (1.0f - beta2) * grad * grad;
        m_t[e] = tf::from_float<T>(m_new);
        v_t[e] = tf::from_float<T>(v_new);
        const T theta_new = tf::from_float<T>(theta - step_size * m_new / (sqrtf(v_new / bias2) + eps));
        p[e] = theta_new;
        if (copy != nullptr) {
            if (copy_type == 1) static_cast<__half*>(copy)[e] = tf::from_float<__half>(tf::to_float(theta_new));
            else static_cast<__nv_bfloat16*>(copy)[e] = tf::from_float<__nv_bfloat16>(tf::to_float(theta_new));
        }
    }
}
