// Adam over all parameters in one launch. Reference: optim.Adam.step.
//   g ← g·grad_multiplier + λθ;  m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  θ ← θ − step_size · m / (√(v / bias2) + ε)
// with step_size = lr / (1 − β₁ᵗ) and bias2 = 1 − β₂ᵗ computed on the host; grad_multiplier undoes
// the loss scale and applies gradient clipping (1 without either).
// The parameters are a table of pointers; the work is cut into chunks of `chunk_size`
// elements, chunk c being elements [chunk_start[c], chunk_start[c] + chunk_size) of tensor
// chunk_tensor[c] (clipped to its size). One block per chunk.
// Mixed precision: `copies` (or null) is a table of each parameter's compute copy (null where it
// has none), of `copy_type` 1 (__half) or 2 (__nv_bfloat16): the updated θ is rounded into it in
// the same pass, so the half-precision weights need no pass of their own.
#include "common.cuh"

template <typename T>
__global__ void adam_update(T* const* __restrict__ params, const T* const* __restrict__ grads, T* const* __restrict__ m,
                            T* const* __restrict__ v, void* const* __restrict__ copies, int copy_type,
                            const long long* __restrict__ sizes,
                            const int* __restrict__ chunk_tensor, const long long* __restrict__ chunk_start,
                            int chunk_size, float grad_multiplier, float step_size, float beta1, float beta2,
                            float bias2, float eps, float weight_decay) {
    const int tensor = chunk_tensor[blockIdx.x];
    const long long first = chunk_start[blockIdx.x];
    const long long last = min(sizes[tensor], first + chunk_size);
    T* p = params[tensor];
    const T* g = grads[tensor];
    T* m_t = m[tensor];
    T* v_t = v[tensor];
    void* copy = copies == nullptr ? nullptr : copies[tensor];
    for (long long e = first + threadIdx.x; e < last; e += blockDim.x) {
        const float theta = tf::to_float(p[e]);
        const float grad = tf::to_float(g[e]) * grad_multiplier + weight_decay * theta;
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
