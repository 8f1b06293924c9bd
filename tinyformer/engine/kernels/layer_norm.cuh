// Layer normalisation of one row by one block, shared by layer_norm.cu and residual_layer_norm.cu.
// Reference: functional.LayerNorm.
//   y = x̂ ∘ w + b,  x̂ = (x − μ) · r,  r = 1 / √(σ² + eps)   (biased σ²)
//   dx = r · (g − mean(g) − x̂ ∘ mean(g ∘ x̂)) with g = dy ∘ w
// float32 sums overflow for rows with |x| beyond ~1e19 (the squares) or ~1e38 (the values): such a
// row's statistics are computed again on x / s, s = max |x|, as the NumPy reference does
// (functional/layer_norm.py, _rescaled_rows): μ = s · mean(x/s), r = 1 / (s · √(mean((x/s − μ/s)²) + eps/s²)).
// Every thread of the block must call these (they reduce over the block).
#pragma once
#include "common.cuh"

namespace tf_layer_norm {

// x̂ = (x − μ) · r; when x − μ overflows (|x|, |μ| near the float maximum, opposite signs), x·r − μ·r.
__device__ __forceinline__ float normalized(float x, float mu, float r) {
    const float centered = x - mu;
    return isfinite(centered) ? centered * r : x * r - mu * r;
}

struct Statistics {
    float mean, rstd;
};

// μ and r of the row x[0, cols); scratch: __shared__ float[tf::kRowBlockWarps].
template <typename T>
__device__ Statistics row_statistics(const T* x, int cols, float eps, float* scratch) {
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += tf::to_float(x[j]);
    float mean = tf::block_sum(s, scratch) / cols;
    float squares = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float centered = tf::to_float(x[j]) - mean;
        squares += centered * centered;
    }
    const float variance = tf::block_sum(squares, scratch) / cols;
    float rstd = 1.0f / sqrtf(variance + eps);
    if (!isfinite(mean) || !isfinite(variance)) {  // block-uniform: every thread holds the same sums
        float largest = 0.0f;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) largest = fmaxf(largest, fabsf(tf::to_float(x[j])));
        const float scale = tf::block_max(largest, scratch);
        if (isfinite(scale) && scale > 0.0f) {  // an infinite or NaN input keeps its NaN statistics
            const float inv_scale = 1.0f / scale;
            float unit_sum = 0.0f;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) unit_sum += tf::to_float(x[j]) * inv_scale;
            const float unit_mean = tf::block_sum(unit_sum, scratch) / cols;
            float unit_squares = 0.0f;
            for (int j = threadIdx.x; j < cols; j += blockDim.x) {
                const float centered = tf::to_float(x[j]) * inv_scale - unit_mean;
                unit_squares += centered * centered;
            }
            const float unit_variance = tf::block_sum(unit_squares, scratch) / cols;
            mean = unit_mean * scale;
            const float spread = scale * sqrtf(unit_variance + eps * inv_scale * inv_scale);  // √(σ² + eps)
            rstd = spread > 0.0f ? 1.0f / spread : 1.0f / sqrtf(eps);  // 0: σ = 0 and eps/s² underflowed
        }
    }
    return {mean, rstd};
}

// y = x̂ ∘ w + b of the row, and μ, r into mean_out[0], rstd_out[0] (by thread 0).
template <typename T>
__device__ void normalize_row(const T* x, const T* weight, const T* bias, T* y, float* mean_out, float* rstd_out,
                              int cols, float eps, float* scratch) {
    const Statistics st = row_statistics(x, cols, eps, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float xhat = normalized(tf::to_float(x[j]), st.mean, st.rstd);
        y[j] = tf::from_float<T>(xhat * tf::to_float(weight[j]) + tf::to_float(bias[j]));
    }
    if (threadIdx.x == 0) {
        *mean_out = st.mean;
        *rstd_out = st.rstd;
    }
}

// store(j, dx_j) for the row's input gradient.
template <typename T, typename Store>
__device__ void input_gradient_row(const T* x, const T* weight, const T* grad_y, float mu, float r, int cols,
                                   float* scratch, Store store) {
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(grad_y[j]) * tf::to_float(weight[j]);
        sum_g += g;
        sum_g_xhat += g * normalized(tf::to_float(x[j]), mu, r);
    }
    const float mean_g = tf::block_sum(sum_g, scratch) / cols;
    const float mean_g_xhat = tf::block_sum(sum_g_xhat, scratch) / cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(grad_y[j]) * tf::to_float(weight[j]);
        store(j, r * (g - mean_g - normalized(tf::to_float(x[j]), mu, r) * mean_g_xhat));
    }
}

}  // namespace tf_layer_norm
