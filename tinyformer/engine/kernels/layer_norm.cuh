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

// store(j, dx_j, dy_j, x̂_j) for the row's input gradient (dy and x̂ for the parameters' sums).
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
        const float dy = tf::to_float(grad_y[j]);
        const float g = dy * tf::to_float(weight[j]);
        const float xhat = normalized(tf::to_float(x[j]), mu, r);
        store(j, r * (g - mean_g - xhat * mean_g_xhat), dy, xhat);
    }
}

// dw and db of one block's chunk of rows, summed as the block walks its rows (the backward kernels
// of layer_norm.cu and residual_layer_norm.cu): column j's sums belong to thread j mod blockDim for
// every row, so they need no synchronisation and are added in row order (the same bits at every
// run). They live in the block's dynamic shared memory (cols floats per sum) where the launch gave it
// (`in_shared`), else in the chunk's own row of the partials; `partial_w` null: no dw, db. `partial_e`
// (not null): one more column sum beside them, of what the kernel hands `add_extra` (the residual's
// d(y_bias) = Σ_rows dy), after dw and db in shared memory.
struct ChunkSums {
    float* w;
    float* b;
    float* e;

    __device__ ChunkSums(float* partial_w, float* partial_b, int cols, bool in_shared, unsigned char* shared,
                         float* partial_e = nullptr) {
        w = b = e = nullptr;
        const long long row = (long long)blockIdx.x * cols;
        float* next = reinterpret_cast<float*>(shared);
        if (partial_w != nullptr) {
            w = in_shared ? next : partial_w + row;
            b = in_shared ? next + cols : partial_b + row;
            next += 2 * cols;
        }
        if (partial_e != nullptr) e = in_shared ? next : partial_e + row;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            if (w != nullptr) w[j] = b[j] = 0.0f;
            if (e != nullptr) e[j] = 0.0f;
        }
    }

    __device__ __forceinline__ void add(int j, float dy, float xhat) const {
        if (w == nullptr) return;
        w[j] += dy * xhat;
        b[j] += dy;
    }

    __device__ __forceinline__ void add_extra(int j, float value) const {
        if (e != nullptr) e[j] += value;
    }

    // The chunk's sums into its row of partial_w, partial_b, partial_e (already there when not in shared memory).
    __device__ void finish(float* partial_w, float* partial_b, int cols, bool in_shared,
                           float* partial_e = nullptr) const {
        if (!in_shared) return;
        const long long row = (long long)blockIdx.x * cols;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            if (w != nullptr) {
                partial_w[row + j] = w[j];
                partial_b[row + j] = b[j];
            }
            if (e != nullptr) partial_e[row + j] = e[j];
        }
    }
};

// One row of the backward: store(j, dx_j) where `need_input` (block-uniform), and the row's terms of
// dw, db into `sums`.
template <typename T, typename Store>
__device__ void backward_row(const T* x, const T* weight, const T* grad_y, float mu, float r, int cols,
                             float* scratch, const ChunkSums& sums, bool need_input, Store store) {
    if (need_input) {
        input_gradient_row(x, weight, grad_y, mu, r, cols, scratch, [&](int j, float dx, float dy, float xhat) {
            store(j, dx);
            sums.add(j, dy, xhat);
        });
        return;
    }
    if (sums.w == nullptr) return;
    for (int j = threadIdx.x; j < cols; j += blockDim.x)
        sums.add(j, tf::to_float(grad_y[j]), normalized(tf::to_float(x[j]), mu, r));
}

}  // namespace tf_layer_norm
