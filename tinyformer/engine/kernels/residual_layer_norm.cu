// The post-LN sublayer connection in one pass per row: out = LayerNorm(x + dropout(y)) (§5.4).
// Reference: functional.ResidualDropoutLayerNorm. The dropout mask is dropout.cu's for the same
// (seed, offset), seed = *seed_ptr where given: keep_e = philox_uniform(seed, offset, e) >= p over
// y's elements in C order, kept values scaled by `scale`; p = 0 keeps everything (no random
// numbers drawn).
//   forward:  h = x + y ∘ keep · scale (stored in T: layer norm reads it as the unfused path would),
//             out = layer_norm(h), μ and r per row
//   backward: dh = layer norm's input gradient (layer_norm.cuh), dx = dh, dy = dh ∘ keep · scale;
//             dw, db: layer_norm.cu's two-stage reduction on h
#include "layer_norm.cuh"
#include "philox.cuh"

// One block per row.
template <typename T>
__global__ void residual_layer_norm_forward(const T* __restrict__ x, const T* __restrict__ y,
                                            const T* __restrict__ weight, const T* __restrict__ bias,
                                            T* __restrict__ h, T* __restrict__ out, bool* __restrict__ keep,
                                            float* __restrict__ mean_out, float* __restrict__ rstd_out, int cols,
                                            float p, float scale, float eps, unsigned long long seed,
                                            const unsigned long long* __restrict__ seed_ptr,
                                            unsigned long long offset) {
    seed = tf::resolve_seed(seed, seed_ptr);
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long first = (long long)blockIdx.x * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const long long e = first + j;
        const bool kept = p <= 0.0f || tf::philox_uniform(seed, offset, e) >= p;
        const float dropped = p <= 0.0f ? tf::to_float(y[e]) : tf::to_float(y[e]) * (kept ? scale : 0.0f);
        h[e] = tf::from_float<T>(tf::to_float(tf::from_float<T>(dropped)) + tf::to_float(x[e]));
        keep[e] = kept;
    }
    __syncthreads();  // the row of h is written: the statistics read all of it
    tf_layer_norm::normalize_row(h + first, weight, bias, out + first, mean_out + blockIdx.x, rstd_out + blockIdx.x,
                                 cols, eps, scratch);
}

// dx (= dh) and dy, one block per row.
template <typename T>
__global__ void residual_layer_norm_backward(const T* __restrict__ h, const T* __restrict__ weight,
                                             const T* __restrict__ grad_out, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, const bool* __restrict__ keep,
                                             T* __restrict__ grad_x, T* __restrict__ grad_y, int cols, float scale) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long first = (long long)blockIdx.x * cols;
    tf_layer_norm::input_gradient_row(h + first, weight, grad_out + first, mean[blockIdx.x], rstd[blockIdx.x], cols,
                                      scratch, [&](int j, float dh) {
                                          const T rounded = tf::from_float<T>(dh);
                                          grad_x[first + j] = rounded;
                                          grad_y[first + j] = tf::from_float<T>(
                                              keep[first + j] ? tf::to_float(rounded) * scale : 0.0f);
                                      });
}
