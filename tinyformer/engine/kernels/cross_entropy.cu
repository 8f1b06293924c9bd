// Label-smoothed cross entropy fused with log-softmax over the vocabulary.
// Reference: functional.CrossEntropy. With lse = log Σ exp(z), ε the smoothing, V the vocabulary:
//   nll  = lse − z_t
//   loss = (1 − ε)·nll + ε·(lse − mean(z))          (= −Σ_v q_v log p_v, q = (1−ε)·onehot + ε/V)
//   dz   = (g_loss + g_nll)·p − ((1 − ε)·g_loss + g_nll)·onehot(t) − (ε/V)·g_loss
// Only lse is kept per row: p = exp(z − lse) is recomputed in the backward (no V-wide softmax stored).
// A row whose target equals ignore_index (when has_ignore) has loss = nll = 0 and dz = 0.
#include "common.cuh"

// One block per row.
template <typename T>
__global__ void cross_entropy_forward(const T* __restrict__ logits, const long long* __restrict__ target,
                                      float* __restrict__ loss, float* __restrict__ nll, float* __restrict__ lse_out,
                                      int vocab, long long ignore_index, int has_ignore, float smoothing) {
    __shared__ tf::MaxSum scratch[tf::kRowBlockWarps];
    __shared__ float sum_scratch[tf::kRowBlockWarps];
    const long long row = blockIdx.x, offset = row * vocab;
    tf::MaxSum stats = {-TF_INFINITY, 0.0f};
    float total = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float z = tf::to_float(logits[offset + j]);
        stats = tf::max_sum_add(stats, z);
        total += z;
    }
    stats = tf::block_max_sum(stats, scratch);
    total = tf::block_sum(total, sum_scratch);
    if (threadIdx.x == 0) {
        const long long t = target[row];
        const float lse = stats.max + logf(stats.sum);
        const bool ignored = has_ignore && t == ignore_index;
        const float row_nll = ignored ? 0.0f : lse - tf::to_float(logits[offset + t]);
        nll[row] = row_nll;
        loss[row] = ignored ? 0.0f : (1.0f - smoothing) * row_nll + smoothing * (lse - total / vocab);
        lse_out[row] = lse;
    }
}

// One block per row; g_loss and g_nll are the per-row upstream gradients (reduction applied).
template <typename T>
__global__ void cross_entropy_backward(const T* __restrict__ logits, const long long* __restrict__ target,
                                       const float* __restrict__ lse, const float* __restrict__ grad_loss,
                                       const float* __restrict__ grad_nll, T* __restrict__ grad_logits, int vocab,
                                       long long ignore_index, int has_ignore, float smoothing) {
    const long long row = blockIdx.x, offset = row * vocab;
    const long long t = target[row];
    const bool ignored = has_ignore && t == ignore_index;
    const float gl = ignored ? 0.0f : grad_loss[row], gn = ignored ? 0.0f : grad_nll[row];
    const float row_lse = lse[row], uniform = smoothing / vocab * gl, target_weight = (1.0f - smoothing) * gl + gn;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float p = expf(tf::to_float(logits[offset + j]) - row_lse);
        const float g = (gl + gn) * p - (j == t ? target_weight : 0.0f) - uniform;
        grad_logits[offset + j] = tf::from_float<T>(g);
    }
}
