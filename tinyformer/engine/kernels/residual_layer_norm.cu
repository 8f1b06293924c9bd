// The post-LN sublayer connection in one pass per row: out = LayerNorm(x + dropout(y + y_bias)) (§5.4),
// y_bias (may be null) the sublayer's output bias, added here instead of by a launch of its own.
// Reference: functional.ResidualDropoutLayerNorm. The dropout mask is dropout.cu's for the same
// (seed, offset), seed = *seed_ptr where given: keep_e = philox_uniform(seed, offset, e) >= p over
// y's elements in C order, kept values scaled by `scale`; p = 0 keeps everything (no random
// numbers drawn).
//   forward:  h = x + (y + y_bias) ∘ keep · scale (y's term in float, rounded to T, then the sum: T is
//             what layer norm reads, as the unfused path would store it), out = layer_norm(h), μ and r per row
//   backward: dh = layer norm's input gradient (layer_norm.cuh), dx = dh, dy = dh ∘ keep · scale;
//             dw, db: each block's chunk of rows summed as it walks them (layer_norm.cuh's
//             ChunkSums), the chunks then by layer_norm.cu's layer_norm_reduce_params; d(y_bias) =
//             Σ_rows dy (dy as stored, in y's type) where partial_e is not null: ChunkSums' extra sum,
//             reduced by the same launch
// Two forms of each kernel: every operand of T (residual_layer_norm_*), and the mixed one of
// autocast (residual_layer_norm_*_mixed<T>): x, h, out and the parameters float, y and dy of T (the
// sublayer's half output read and its gradient written in its own type: no cast launches).
#include "layer_norm.cuh"
#include "philox.cuh"

namespace tf_residual {

// Row blockIdx.x of the forward; X is the type of x, h, out, the parameters and y_bias, Y that of y.
template <typename X, typename Y>
__device__ void forward_row(const X* x, const Y* y, const X* y_bias, const X* weight, const X* bias, X* h, X* out,
                            bool* keep,
                            float* mean_out, float* rstd_out, int cols, float p, float scale, float eps,
                            unsigned long long seed, const unsigned long long* seed_ptr, unsigned long long offset,
                            float* scratch) {
    seed = tf::resolve_seed(seed, seed_ptr);
    const long long first = (long long)blockIdx.x * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const long long e = first + j;
        const bool kept = p <= 0.0f || tf::philox_uniform(seed, offset, e) >= p;
        const float biased = y_bias == nullptr ? tf::to_float(y[e]) : tf::to_float(y[e]) + tf::to_float(y_bias[j]);
        const float dropped = p <= 0.0f ? biased : biased * (kept ? scale : 0.0f);
        h[e] = tf::from_float<X>(tf::to_float(tf::from_float<X>(dropped)) + tf::to_float(x[e]));
        keep[e] = kept;
    }
    __syncthreads();  // the row of h is written: the statistics read all of it
    tf_layer_norm::normalize_row(h + first, weight, bias, out + first, mean_out + blockIdx.x, rstd_out + blockIdx.x,
                                 cols, eps, scratch);
}

// One block per chunk of rows_per_chunk rows: dx (= dh, of X) and dy (of Y), and the chunk's sums of
// dw, db where partial_w is not null (layer_norm.cu's layer_norm_backward_input, with dy), of dy where
// partial_e is not null (d(y_bias)).
template <typename X, typename Y>
__device__ void backward_chunk(const X* h, const X* weight, const X* grad_out, const float* mean, const float* rstd,
                               const bool* keep, X* grad_x, Y* grad_y, float* partial_w, float* partial_b,
                               float* partial_e, int rows, int cols, int rows_per_chunk, float scale,
                               int sums_in_shared, unsigned char* shared, float* scratch) {
    const tf_layer_norm::ChunkSums sums(partial_w, partial_b, cols, sums_in_shared, shared, partial_e);
    const int first = blockIdx.x * rows_per_chunk, last = min(rows, first + rows_per_chunk);
    for (int row = first; row < last; ++row) {
        const long long offset = (long long)row * cols;
        tf_layer_norm::backward_row(h + offset, weight, grad_out + offset, mean[row], rstd[row], cols, scratch, sums,
                                    true, [&](int j, float dh) {
                                        const X rounded = tf::from_float<X>(dh);
                                        grad_x[offset + j] = rounded;
                                        const Y dy = tf::from_float<Y>(
                                            keep[offset + j] ? tf::to_float(rounded) * scale : 0.0f);
                                        grad_y[offset + j] = dy;
                                        sums.add_extra(j, tf::to_float(dy));
                                    });
    }
    sums.finish(partial_w, partial_b, cols, sums_in_shared, partial_e);
}

}  // namespace tf_residual

// One block per row; y_bias null: no output bias.
template <typename T>
__global__ void residual_layer_norm_forward(const T* __restrict__ x, const T* __restrict__ y,
                                            const T* __restrict__ y_bias, const T* __restrict__ weight,
                                            const T* __restrict__ bias,
                                            T* __restrict__ h, T* __restrict__ out, bool* __restrict__ keep,
                                            float* __restrict__ mean_out, float* __restrict__ rstd_out, int cols,
                                            float p, float scale, float eps, unsigned long long seed,
                                            const unsigned long long* __restrict__ seed_ptr,
                                            unsigned long long offset) {
    __shared__ float scratch[tf::kRowBlockWarps];
    tf_residual::forward_row(x, y, y_bias, weight, bias, h, out, keep, mean_out, rstd_out, cols, p, scale, eps, seed,
                             seed_ptr, offset, scratch);
}

// The same with x, h, out, the parameters and y_bias float, y of T.
template <typename T>
__global__ void residual_layer_norm_forward_mixed(const float* __restrict__ x, const T* __restrict__ y,
                                                  const float* __restrict__ y_bias, const float* __restrict__ weight,
                                                  const float* __restrict__ bias,
                                                  float* __restrict__ h, float* __restrict__ out,
                                                  bool* __restrict__ keep, float* __restrict__ mean_out,
                                                  float* __restrict__ rstd_out, int cols, float p, float scale,
                                                  float eps, unsigned long long seed,
                                                  const unsigned long long* __restrict__ seed_ptr,
                                                  unsigned long long offset) {
    __shared__ float scratch[tf::kRowBlockWarps];
    tf_residual::forward_row(x, y, y_bias, weight, bias, h, out, keep, mean_out, rstd_out, cols, p, scale, eps, seed,
                             seed_ptr, offset, scratch);
}

// dx, dy and the chunk sums of dw, db (and of dy where partial_e); grid ceil(rows / rows_per_chunk).
template <typename T>
__global__ void residual_layer_norm_backward(const T* __restrict__ h, const T* __restrict__ weight,
                                             const T* __restrict__ grad_out, const float* __restrict__ mean,
                                             const float* __restrict__ rstd, const bool* __restrict__ keep,
                                             T* __restrict__ grad_x, T* __restrict__ grad_y,
                                             float* __restrict__ partial_w, float* __restrict__ partial_b,
                                             float* __restrict__ partial_e, int rows, int cols, int rows_per_chunk,
                                             float scale, int sums_in_shared) {
    __shared__ float scratch[tf::kRowBlockWarps];
    TF_DYNAMIC_SHARED(shared);
    tf_residual::backward_chunk(h, weight, grad_out, mean, rstd, keep, grad_x, grad_y, partial_w, partial_b, partial_e,
                                rows, cols, rows_per_chunk, scale, sums_in_shared, shared, scratch);
}

// The same with h, dx and the parameters float, dy of T.
template <typename T>
__global__ void residual_layer_norm_backward_mixed(const float* __restrict__ h, const float* __restrict__ weight,
                                                   const float* __restrict__ grad_out, const float* __restrict__ mean,
                                                   const float* __restrict__ rstd, const bool* __restrict__ keep,
                                                   float* __restrict__ grad_x, T* __restrict__ grad_y,
                                                   float* __restrict__ partial_w, float* __restrict__ partial_b,
                                                   float* __restrict__ partial_e, int rows, int cols,
                                                   int rows_per_chunk, float scale, int sums_in_shared) {
    __shared__ float scratch[tf::kRowBlockWarps];
    TF_DYNAMIC_SHARED(shared);
    tf_residual::backward_chunk(h, weight, grad_out, mean, rstd, keep, grad_x, grad_y, partial_w, partial_b, partial_e,
                                rows, cols, rows_per_chunk, scale, sums_in_shared, shared, scratch);
}
