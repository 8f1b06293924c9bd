// Layer normalisation over the last axis (the row arithmetic: layer_norm.cuh). Reference: functional.LayerNorm.
//   dw = Σ_rows dy ∘ x̂,  db = Σ_rows dy   (two stages: partial sums per row chunk, then over chunks)
#include "layer_norm.cuh"

// One block per row; saves μ and r per row (float) for the backward.
template <typename T>
__global__ void layer_norm_forward(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                   T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                   int cols, float eps) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    tf_layer_norm::normalize_row(x + offset, weight, bias, y + offset, mean_out + blockIdx.x, rstd_out + blockIdx.x,
                                 cols, eps, scratch);
}

// dx, one block per row.
template <typename T>
__global__ void layer_norm_backward_input(const T* __restrict__ x, const T* __restrict__ weight,
                                          const T* __restrict__ grad_y, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, T* __restrict__ grad_x, int cols) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    tf_layer_norm::input_gradient_row(x + offset, weight, grad_y + offset, mean[blockIdx.x], rstd[blockIdx.x], cols,
                                      scratch, [&](int j, float dx) { grad_x[offset + j] = tf::from_float<T>(dx); });
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
