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
