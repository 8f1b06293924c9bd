// Layer normalisation over the last axis (the row arithmetic: layer_norm.cuh). Reference: functional.LayerNorm.
//   dw = Σ_rows dy ∘ x̂,  db = Σ_rows dy   (each backward block sums its chunk of rows as it walks
//   them, layer_norm.cuh's ChunkSums; then one launch sums the chunks and adds into the gradients)
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

// One block per chunk of rows_per_chunk rows, walked in order: dx where grad_x is not null, and the
// chunk's sums of dw, db into partial_w/partial_b[chunk, col] where partial_w is not null.
// grid ceil(rows / rows_per_chunk); sums_in_shared: the launch gave 2 · cols floats of dynamic shared memory.
template <typename T>
__global__ void layer_norm_backward_input(const T* __restrict__ x, const T* __restrict__ weight,
                                          const T* __restrict__ grad_y, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, T* __restrict__ grad_x,
                                          float* __restrict__ partial_w, float* __restrict__ partial_b, int rows,
                                          int cols, int rows_per_chunk, int sums_in_shared) {
    __shared__ float scratch[tf::kRowBlockWarps];
    TF_DYNAMIC_SHARED(shared);
    const tf_layer_norm::ChunkSums sums(partial_w, partial_b, cols, sums_in_shared, shared);
    const int first = blockIdx.x * rows_per_chunk, last = min(rows, first + rows_per_chunk);
    for (int row = first; row < last; ++row) {
        const long long offset = (long long)row * cols;
        tf_layer_norm::backward_row(x + offset, weight, grad_y + offset, mean[row], rstd[row], cols, scratch, sums,
                                    grad_x != nullptr,
                                    [&](int j, float dx) { grad_x[offset + j] = tf::from_float<T>(dx); });
    }
    sums.finish(partial_w, partial_b, cols, sums_in_shared);
}

// Stage 2 of dw, db, one thread per column: the chunks' partials summed in chunk order (deterministic),
// added to what grad_w, grad_b hold where accumulate_w, accumulate_b (a parameter's .grad), else
// written there; partial_w null: no dw, db. The same for the extra sum partial_e into grad_e where
// partial_e is not null (residual_layer_norm.cu's d(y_bias)). grid ceil(cols / blockDim.x).
template <typename T>
__global__ void layer_norm_reduce_params(const float* __restrict__ partial_w, const float* __restrict__ partial_b,
                                         const float* __restrict__ partial_e, T* __restrict__ grad_w,
                                         T* __restrict__ grad_b, T* __restrict__ grad_e, int chunks, int cols,
                                         int accumulate_w, int accumulate_b, int accumulate_e) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float sum_w = 0.0f, sum_b = 0.0f, sum_e = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        const long long at = (long long)chunk * cols + col;
        if (partial_w != nullptr) {
            sum_w += partial_w[at];
            sum_b += partial_b[at];
        }
        if (partial_e != nullptr) sum_e += partial_e[at];
    }
    if (partial_w != nullptr) {
        grad_w[col] = tf::from_float<T>(accumulate_w ? tf::to_float(grad_w[col]) + sum_w : sum_w);
        grad_b[col] = tf::from_float<T>(accumulate_b ? tf::to_float(grad_b[col]) + sum_b : sum_b);
    }
    if (partial_e != nullptr) grad_e[col] = tf::from_float<T>(accumulate_e ? tf::to_float(grad_e[col]) + sum_e : sum_e);
}
