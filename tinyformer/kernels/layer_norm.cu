// Layer normalisation over the last axis. Reference: functional.LayerNorm.
//   y = x̂ ∘ w + b,  x̂ = (x − μ) · r,  r = 1 / √(σ² + eps)   (biased σ²)
//   dx = r · (g − mean(g) − x̂ ∘ mean(g ∘ x̂)) with g = dy ∘ w
//   dw = Σ_rows dy ∘ x̂,  db = Σ_rows dy   (two stages: partial sums per row chunk, then over chunks)
// float32 sums overflow for rows with |x| beyond ~1e19 (the squares) or ~1e38 (the values): such a
// row's statistics are computed again on x / s, s = max |x|, as the NumPy reference does
// (functional/layer_norm.py, _rescaled_rows): μ = s · mean(x/s), r = 1 / (s · √(mean((x/s − μ/s)²) + eps/s²)).
#include "common.cuh"

namespace tf_layer_norm {

// x̂ = (x − μ) · r; when x − μ overflows (|x|, |μ| near the float maximum, opposite signs), x·r − μ·r.
__device__ __forceinline__ float normalized(float x, float mu, float r) {
    const float centered = x - mu;
    return isfinite(centered) ? centered * r : x * r - mu * r;
}

}  // namespace tf_layer_norm

// One block per row; saves μ and r per row (float) for the backward.
template <typename T>
__global__ void layer_norm_forward(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                   int cols, float eps) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += tf::to_float(x[offset + j]);
    float mean = tf::block_sum(s, scratch) / cols;
    float squares = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float centered = tf::to_float(x[offset + j]) - mean;
        squares += centered * centered;
    }
    const float variance = tf::block_sum(squares, scratch) / cols;
    float rstd = 1.0f / sqrtf(variance + eps);
    if (!isfinite(mean) || !isfinite(variance)) {  // block-uniform: every thread holds the same sums
        float largest = 0.0f;
        for (int j = threadIdx.x; j < cols; j += blockDim.x)
            largest = fmaxf(largest, fabsf(tf::to_float(x[offset + j])));
        const float scale = tf::block_max(largest, scratch);
        if (isfinite(scale) && scale > 0.0f) {  // an infinite or NaN input keeps its NaN statistics
            const float inv_scale = 1.0f / scale;
            float unit_sum = 0.0f;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) unit_sum += tf::to_float(x[offset + j]) * inv_scale;
            const float unit_mean = tf::block_sum(unit_sum, scratch) / cols;
            float unit_squares = 0.0f;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) {
                const float centered = tf::to_float(x[offset + j]) * inv_scale - unit_mean;
                unit_squares += centered * centered;
            }
            const float unit_variance = tf::block_sum(unit_squares, scratch) / cols;
            mean = unit_mean * scale;
            const float spread = scale * sqrtf(unit_variance + eps * inv_scale * inv_scale);  // √(σ² + eps)
            rstd = spread > 0.0f ? 1.0f / spread : 1.0f / sqrtf(eps);  // 0: σ = 0 and eps/s² underflowed
        }
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float xhat = tf_layer_norm::normalized(tf::to_float(x[offset + j]), mean, rstd);
        y[offset + j] = tf::from_float<T>(xhat * tf::to_float(weight[j]) + tf::to_float(bias[j]));
    }
    if (threadIdx.x == 0) {
        mean_out[blockIdx.x] = mean;
        rstd_out[blockIdx.x] = rstd;
    }
}

// dx, one block per row.
template <typename T>
__global__ void layer_norm_backward_input(const T* __restrict__ x, const T* __restrict__ weight,
                                          const T* __restrict__ grad_y, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, T* __restrict__ grad_x, int cols) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    const float mu = mean[blockIdx.x], r = rstd[blockIdx.x];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(grad_y[offset + j]) * tf::to_float(weight[j]);
        sum_g += g;
        sum_g_xhat += g * tf_layer_norm::normalized(tf::to_float(x[offset + j]), mu, r);
    }
    const float mean_g = tf::block_sum(sum_g, scratch) / cols;
    const float mean_g_xhat = tf::block_sum(sum_g_xhat, scratch) / cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(grad_y[offset + j]) * tf::to_float(weight[j]);
        const float xhat = tf_layer_norm::normalized(tf::to_float(x[offset + j]), mu, r);
        grad_x[offset + j] = tf::from_float<T>(r * (g - mean_g - xhat * mean_g_xhat));
    }
}

// Stage 1 of dw, db: block (column block, row chunk) sums its rows for one column per thread
// into partial_w/partial_b[chunk, col]. grid (ceil(cols / blockDim.x), chunks).
template <typename T>
__global__ void layer_norm_backward_params(const T* __restrict__ x, const T* __restrict__ grad_y,
                                           const float* __restrict__ mean, const float* __restrict__ rstd,
                                           float* __restrict__ partial_w, float* __restrict__ partial_b, int rows,
                                           int cols, int rows_per_chunk) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    const int first = blockIdx.y * rows_per_chunk, last = min(rows, first + rows_per_chunk);
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int row = first; row < last; ++row) {
        const long long e = (long long)row * cols + col;
        const float g = tf::to_float(grad_y[e]);
        sum_w += g * tf_layer_norm::normalized(tf::to_float(x[e]), mean[row], rstd[row]);
        sum_b += g;
    }
    partial_w[(long long)blockIdx.y * cols + col] = sum_w;
    partial_b[(long long)blockIdx.y * cols + col] = sum_b;
}

// Stage 2: sum the chunks' partials in a fixed order (deterministic). grid ceil(cols / blockDim.x).
template <typename T>
__global__ void layer_norm_reduce_params(const float* __restrict__ partial_w, const float* __restrict__ partial_b,
                                         T* __restrict__ grad_w, T* __restrict__ grad_b, int chunks, int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float sum_w = 0.0f, sum_b = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        sum_w += partial_w[(long long)chunk * cols + col];
        sum_b += partial_b[(long long)chunk * cols + col];
    }
    grad_w[col] = tf::from_float<T>(sum_w);
    grad_b[col] = tf::from_float<T>(sum_b);
}
