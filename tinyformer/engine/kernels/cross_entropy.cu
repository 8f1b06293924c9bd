// Label-smoothed cross entropy fused with log-softmax over the vocabulary.
// Reference: functional.CrossEntropy. With lse = log Σ exp(z), ε the smoothing, V the vocabulary:
//   nll  = lse − z_t
//   loss = (1 − ε)·nll + ε·(lse − mean(z))          (= −Σ_v q_v log p_v, q = (1−ε)·onehot + ε/V)
//   dz   = (g_loss + g_nll)·p − ((1 − ε)·g_loss + g_nll)·onehot(t) − (ε/V)·g_loss
// Only lse is kept per row: p = exp(z − lse) is recomputed in the backward (no V-wide softmax stored).
// A row whose target equals ignore_index (when has_ignore) has loss = nll = 0 and dz = 0.
#include "common.cuh"

// One block per row: the row's loss, NLL and lse. With `reduce` (functional.CrossEntropy's "sum" and
// "mean"; "none" without) the same launch also writes totals = {Σ loss·scale, Σ nll·scale, scale},
// scale = 1 ("sum") or, with `average` ("mean"), 1 / max(kept rows, 1), the kept rows counted here
// from the targets (no host read). Deterministic: each block
// counts itself done in `blocks_done` once its row is written; the last block to do so sums the
// rows in a fixed order (thread i the rows i, i + blockDim, ..., then the block's fixed tree) and
// sets `blocks_done` back to 0, so that the next launch (a CUDA graph's next replay) starts at 0.
// `blocks_done` must be 0 at launch and not shared with a launch running at the same time.
template <typename T>
__global__ void cross_entropy_forward(const T* __restrict__ logits, const long long* __restrict__ target,
                                      float* loss, float* nll, float* __restrict__ lse_out, float* __restrict__ totals,
                                      int* blocks_done, int vocab, long long ignore_index, int has_ignore,
                                      float smoothing, int reduce, int average) {
    __shared__ tf::MaxSum scratch[tf::kRowBlockWarps];
    __shared__ float sum_scratch[tf::kRowBlockWarps];
    __shared__ int last_block;
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
    if (!reduce) return;
    if (threadIdx.x == 0) {
        __threadfence();  // this row's loss and nll visible to every block before the row counts as done
        last_block = atomicAdd(blocks_done, 1) == int(gridDim.x) - 1;
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    // volatile: the other blocks' rows are read from memory, never from a cache filled before they landed
    const volatile float* row_loss = loss;
    const volatile float* row_nll = nll;
    float loss_sum = 0.0f, nll_sum = 0.0f, kept = 0.0f;
    for (long long r = threadIdx.x; r < gridDim.x; r += blockDim.x) {
        loss_sum += row_loss[r];
        nll_sum += row_nll[r];
        kept += (has_ignore && target[r] == ignore_index) ? 0.0f : 1.0f;
    }
    loss_sum = tf::block_sum(loss_sum, sum_scratch);
    nll_sum = tf::block_sum(nll_sum, sum_scratch);
    kept = tf::block_sum(kept, sum_scratch);  // whole numbers: exact below 2^24 rows
    if (threadIdx.x == 0) {
        const float scale = average ? 1.0f / fmaxf(kept, 1.0f) : 1.0f;
        totals[0] = loss_sum * scale;
        totals[1] = nll_sum * scale;
        totals[2] = scale;
        *blocks_done = 0;
    }
}

// One block per row. The upstream gradients are read as they come: grad_loss[row · loss_stride]
// (stride 1: one per row, reduction "none"; stride 0: one for every row, "sum" and "mean"), the
// same for grad_nll; a null pointer is a zero gradient. Both are multiplied by scale[0] (the
// forward's totals[2]: 1 / kept rows for "mean") unless scale is null. Ignored rows get dz = 0.
template <typename T>
__global__ void cross_entropy_backward(const T* __restrict__ logits, const long long* __restrict__ target,
                                       const float* __restrict__ lse, const float* __restrict__ grad_loss,
                                       const float* __restrict__ grad_nll, long long loss_stride, long long nll_stride,
                                       const float* __restrict__ scale, T* __restrict__ grad_logits, int vocab,
                                       long long ignore_index, int has_ignore, float smoothing) {
    const long long row = blockIdx.x, offset = row * vocab;
    const long long t = target[row];
    const bool ignored = has_ignore && t == ignore_index;
    const float s = scale ? scale[0] : 1.0f;
    const float gl = ignored || !grad_loss ? 0.0f : grad_loss[row * loss_stride] * s;
    const float gn = ignored || !grad_nll ? 0.0f : grad_nll[row * nll_stride] * s;
    const float row_lse = lse[row], uniform = smoothing / vocab * gl, target_weight = (1.0f - smoothing) * gl + gn;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        const float p = expf(tf::to_float(logits[offset + j]) - row_lse);
        const float g = (gl + gn) * p - (j == t ? target_weight : 0.0f) - uniform;
        grad_logits[offset + j] = tf::from_float<T>(g);
    }
}
