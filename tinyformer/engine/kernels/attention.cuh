// What both attention kernels (attention.cu on CUDA cores, attention_mma.cu on tensor cores)
// agree on: which keys a query sees, and the dropout mask on the probabilities.
//
// Masks: key j of sequence b is visible to query i iff j < key_lengths[b] (when given) and,
// if causal, j <= i + (Lk − Lq) (queries aligned with the last keys). A query that sees no
// key gets o = 0 and lse = −inf, and contributes no gradient.
//
// Dropout: keep iff philox_uniform(seed, offset, (bh·Lq + i)·Lk + j) >= p, bh = b·heads + h,
// kept values scaled by 1/(1 − p); the backward regenerates the same mask. The kernels take the
// seed as a value and a pointer (tf::resolve_seed): the pointer's entry, where given, wins.
#pragma once
#include "common.cuh"
#include "philox.cuh"

namespace tf {

struct AttentionProblem {
    int heads, len_q, len_k;
    const int* key_lengths;  // (batch,) or nullptr
    int causal;
    float scale, dropout_p;
    unsigned long long seed, offset;

    __device__ int visible_keys(int bh) const {  // keys [0, n) may be visible to some query
        return key_lengths ? min(len_k, max(key_lengths[bh / heads], 0)) : len_k;
    }
    __device__ bool visible(int bh, int i, int j) const { return visible_among(visible_keys(bh), i, j); }
    // The same with visible_keys(bh) = n_keys already read (once per block, not per element).
    __device__ bool visible_among(int n_keys, int i, int j) const {
        return i < len_q && j < n_keys && (!causal || j <= i + (len_k - len_q));
    }
    // One past the last key any of the queries [first, first + count) may see.
    __device__ int key_end(int bh, int first, int count) const {
        const int end = visible_keys(bh);
        return causal ? min(end, first + count + (len_k - len_q)) : end;
    }
    // 1/(1 − p) where kept, 0 where dropped (1 without dropout).
    __device__ float dropout_scale(int bh, int i, int j) const {
        if (dropout_p <= 0.0f) return 1.0f;
        const unsigned long long index = ((unsigned long long)bh * len_q + i) * len_k + j;
        return tf::philox_uniform(seed, offset, index) >= dropout_p ? 1.0f / (1.0f - dropout_p) : 0.0f;
    }
};

}  // namespace tf

// The forward's online softmax, traced (`tinyformer study trace`): TF_ATTENTION_TRACE(bh, row, key
// tile, running max, running sum) after each key tile records into a host buffer in the CPU
// emulation build only (tf_attention_trace sets it, tf_attention_traced counts the entries, those
// past its capacity dropped); under NVRTC it is nothing.
#if defined(TF_CPU_EMULATION)
namespace tf_attention_tracing {
inline float* buffer = nullptr;  // (capacity, 5): bh, row, tile, max, sum
inline long long capacity = 0, count = 0;
inline void record(int bh, int row, int tile, float row_max, float row_sum) {
    if (count < capacity) {
        float* entry = buffer + 5 * count;
        entry[0] = float(bh), entry[1] = float(row), entry[2] = float(tile), entry[3] = row_max, entry[4] = row_sum;
    }
    ++count;
}
}  // namespace tf_attention_tracing
extern "C" __attribute__((used)) void tf_attention_trace(float* buffer, long long capacity) {
    tf_attention_tracing::buffer = buffer, tf_attention_tracing::capacity = buffer ? capacity : 0;
    tf_attention_tracing::count = 0;
}
extern "C" __attribute__((used)) long long tf_attention_traced() { return tf_attention_tracing::count; }
#define TF_ATTENTION_TRACE(bh, row, tile, row_max, row_sum) tf_attention_tracing::record(bh, row, tile, row_max, row_sum)
#else
#define TF_ATTENTION_TRACE(bh, row, tile, row_max, row_sum) ((void)0)
#endif
