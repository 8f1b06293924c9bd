// Row softmax and log-softmax over the last axis: one block per row.
// Reference: functional.Softmax / functional.LogSoftmax.
#include "common.cuh"

// y = softmax(x) (or log_softmax when log != 0) of each row of `cols` elements.
// One pass reads the row for the online maximum m and sum s = Σ exp(x - m); a second
// pass writes exp(x - m) / s (or x - m - log s).
template <typename T>
__global__ void softmax_forward(const T* __restrict__ x, T* __restrict__ y, int cols, int log) {
    __shared__ tf::MaxSum scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    tf::MaxSum stats = {-TF_INFINITY, 0.0f};
    for (int j = threadIdx.x; j < cols; j += blockDim.x) stats = tf::max_sum_add(stats, tf::to_float(x[offset + j]));
    stats = tf::block_max_sum(stats, scratch);
    const float log_sum = logf(stats.sum), inv_sum = 1.0f / stats.sum;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float shifted = tf::to_float(x[offset + j]) - stats.max;
        y[offset + j] = tf::from_float<T>(log ? shifted - log_sum : expf(shifted) * inv_sum);
    }
}

// Backward from the forward's output y:
//   softmax:      dx = y ∘ (dy − Σ dy ∘ y)
//   log-softmax:  dx = dy − exp(y) · Σ dy
template <typename T>
__global__ void softmax_backward(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int cols,
                                 int log) {
    __shared__ float scratch[tf::kRowBlockWarps];
    const long long offset = (long long)blockIdx.x * cols;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(dy[offset + j]);
        dot += log ? g : g * tf::to_float(y[offset + j]);
    }
    dot = tf::block_sum(dot, scratch);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float g = tf::to_float(dy[offset + j]), out = tf::to_float(y[offset + j]);
        dx[offset + j] = tf::from_float<T>(log ? g - expf(out) * dot : out * (g - dot));
    }
}
