// Fused scaled-dot-product attention, FlashAttention-style (Dao et al., 2022; Dao, 2023).
// Reference: functional.ScaledDotProductAttention.
//
// Shapes: q (BH, Lq, D), k and v (BH, Lk, D), o (BH, Lq, D), all contiguous; BH = batch·heads.
// The Lq × Lk score matrix never reaches global memory: each block streams tiles of keys
// (one per lane) through shared memory and keeps, per query row, the running maximum m, the running sum
// l = Σ exp(s − m) and the output accumulator (online softmax). It saves the row's
// log-sum-exp, lse = m + log l, from which the backward recomputes the probabilities.
//
// Work split: a block has TF_ATTENTION_WARPS warps; a warp owns ROWS_PER_WARP query rows (or
// key rows in the dK/dV kernel); within a key tile, lane j scores key j, and for the products
// with V, K, Q or dO lane j owns the columns j, j+32, ... of the head dimension (D/32 of them).
// The block sizes come from kernels/registry.py (defines and the ROWS_PER_WARP argument).
// No tensor cores: plain FMA.
//
// Masks and dropout: attention.cuh (shared with the tensor-core kernels of attention_mma.cu).
#include "attention.cuh"

namespace tf_attention {

using tf::kWarp;
constexpr int kWarps = TF_ATTENTION_WARPS;
constexpr int kKeys = TF_ATTENTION_KEY_TILE;
static_assert(kKeys == kWarp, "a key tile holds one key per lane");

template <int D, int ROWS_PER_WARP>
struct Shape {
    static_assert(D % kWarp == 0, "head dimension must be a multiple of the warp");
    static constexpr int kCols = D / kWarp;  // columns of the head dimension per lane
    static constexpr int kRows = ROWS_PER_WARP;
    static constexpr int kBlockRows = kWarps * kRows;
};

using Problem = tf::AttentionProblem;

// Loads rows [first, first + count) of a (len, D) matrix into shared rows of `stride` floats,
// zero past `len`.
template <typename T, int D>
__device__ void load_rows(float* dst, int stride, const T* src, int first, int count, int len) {
    for (int e = threadIdx.x; e < count * D; e += blockDim.x) {
        const int r = e / D, c = e % D, row = first + r;
        dst[r * stride + c] = row < len ? tf::to_float(src[(long long)row * D + c]) : 0.0f;
    }
}

template <int D>
__device__ float dot_shared(const float* a, const float* b) {
    float s = 0.0f;
#pragma unroll 8
    for (int c = 0; c < D; ++c) s += a[c] * b[c];
    return s;
}

}  // namespace tf_attention

// o = softmax(q kᵀ · scale + mask) v, and lse per query row (float, −inf for a fully masked row).
// grid (BH, ceil(Lq / kBlockRows)), block kWarps · kWarp.
template <typename T, int HEAD_DIM, int ROWS_PER_WARP>
__global__ void attention_forward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                  T* __restrict__ o, float* __restrict__ lse, const int* __restrict__ key_lengths,
                                  int heads, int len_q, int len_k, int causal, float scale, float dropout_p,
                                  unsigned long long seed, const unsigned long long* __restrict__ seed_ptr,
                                  unsigned long long offset) {
    using namespace tf_attention;
    using S = Shape<HEAD_DIM, ROWS_PER_WARP>;
    constexpr int D = HEAD_DIM;
    __shared__ float q_rows[S::kBlockRows][D];
    __shared__ float k_tile[kKeys][D + 1];  // +1: lane j reads row j without bank conflicts
    __shared__ float v_tile[kKeys][D];
    const Problem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                       tf::resolve_seed(seed, seed_ptr), offset};
    const int bh = blockIdx.x, first_row = blockIdx.y * S::kBlockRows;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const T* qb = q + (long long)bh * len_q * D;
    const T* kb = k + (long long)bh * len_k * D;
    const T* vb = v + (long long)bh * len_k * D;

    load_rows<T, D>(&q_rows[0][0], D, qb, first_row, S::kBlockRows, len_q);

    float row_max[S::kRows], row_sum[S::kRows], acc[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r) {
        row_max[r] = -TF_INFINITY;
        row_sum[r] = 0.0f;
        for (int c = 0; c < S::kCols; ++c) acc[r][c] = 0.0f;
    }
    const int key_end = P.key_end(bh, first_row, S::kBlockRows);

    for (int tile = 0; tile < key_end; tile += kKeys) {
        __syncthreads();  // the previous tile is no longer read
        load_rows<T, D>(&k_tile[0][0], D + 1, kb, tile, kKeys, len_k);
        load_rows<T, D>(&v_tile[0][0], D, vb, tile, kKeys, len_k);
        __syncthreads();
        const int j = tile + lane;
        for (int r = 0; r < S::kRows; ++r) {
            const int local = warp * S::kRows + r, i = first_row + local;
            const bool visible = P.visible(bh, i, j);
            const float s = visible ? dot_shared<D>(q_rows[local], k_tile[lane]) * scale : -TF_INFINITY;
            const float new_max = fmaxf(row_max[r], tf::warp_max(s));
            if (new_max == -TF_INFINITY) continue;  // warp-uniform: nothing visible yet in this row
            const float p = visible ? expf(s - new_max) : 0.0f;
            const float correction = expf(row_max[r] - new_max);  // 0 when row_max was −inf
            row_sum[r] = row_sum[r] * correction + tf::warp_sum(p);
            row_max[r] = new_max;
            if (lane == 0) TF_ATTENTION_TRACE(bh, i, tile / kKeys, row_max[r], row_sum[r]);  // emulation only
            const float p_out = visible ? p * P.dropout_scale(bh, i, j) : 0.0f;
            for (int c = 0; c < S::kCols; ++c) acc[r][c] *= correction;
            for (int src = 0; src < kKeys; ++src) {
                const float weight = __shfl_sync(tf::kFullMask, p_out, src);
                for (int c = 0; c < S::kCols; ++c) acc[r][c] += weight * v_tile[src][lane + kWarp * c];
            }
        }
    }
    for (int r = 0; r < S::kRows; ++r) {
        const int i = first_row + warp * S::kRows + r;
        if (i >= len_q) continue;
        const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
        for (int c = 0; c < S::kCols; ++c)
            o[((long long)bh * len_q + i) * D + lane + kWarp * c] = tf::from_float<T>(acc[r][c] * inv);
        if (lane == 0) lse[(long long)bh * len_q + i] = row_sum[r] > 0.0f ? row_max[r] + logf(row_sum[r]) : -TF_INFINITY;
    }
}

// delta = rowsum(dO ∘ O), one warp per row of the (rows, D) matrices.
// grid ceil(rows / warps per block), any whole number of warps per block.
template <typename T, int HEAD_DIM>
__global__ void attention_backward_delta(const T* __restrict__ o, const T* __restrict__ grad_o,
                                         float* __restrict__ delta, long long rows) {
    using tf::kWarp;
    constexpr int D = HEAD_DIM;
    const long long row = (long long)blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    float s = 0.0f;
    if (row < rows)
        for (int c = lane; c < D; c += kWarp) s += tf::to_float(o[row * D + c]) * tf::to_float(grad_o[row * D + c]);
    s = tf::warp_sum(s);
    if (row < rows && lane == 0) delta[row] = s;
}

// dK and dV for a block of keys, streaming tiles of kKeys queries:
//   p = exp(s − lse), z = dropout scale, dP = (dO · v)·z, dS = p ∘ (dP − delta)
//   dV_j = Σ_i p·z·dO_i,   dK_j = scale · Σ_i dS·q_i
// Each key's sums run over queries in a fixed order: deterministic, no atomics.
// grid (BH, ceil(Lk / kBlockRows)), block kWarps · kWarp.
template <typename T, int HEAD_DIM, int ROWS_PER_WARP>
__global__ void attention_backward_kv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                      const T* __restrict__ grad_o, const float* __restrict__ lse,
                                      const float* __restrict__ delta, T* __restrict__ grad_k, T* __restrict__ grad_v,
                                      const int* __restrict__ key_lengths, int heads, int len_q, int len_k, int causal,
                                      float scale, float dropout_p, unsigned long long seed,
                                      const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    using namespace tf_attention;
    using S = Shape<HEAD_DIM, ROWS_PER_WARP>;
    constexpr int D = HEAD_DIM;
    __shared__ float k_rows[S::kBlockRows][D];
    __shared__ float v_rows[S::kBlockRows][D];
    __shared__ float q_tile[kKeys][D + 1];
    __shared__ float go_tile[kKeys][D + 1];
    __shared__ float lse_tile[kKeys], delta_tile[kKeys];
    const Problem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                       tf::resolve_seed(seed, seed_ptr), offset};
    const int bh = blockIdx.x, first_key = blockIdx.y * S::kBlockRows;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const long long q_base = (long long)bh * len_q, k_base = (long long)bh * len_k;

    load_rows<T, D>(&k_rows[0][0], D, k + k_base * D, first_key, S::kBlockRows, len_k);
    load_rows<T, D>(&v_rows[0][0], D, v + k_base * D, first_key, S::kBlockRows, len_k);

    float dk[S::kRows][S::kCols], dv[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r)
        for (int c = 0; c < S::kCols; ++c) dk[r][c] = dv[r][c] = 0.0f;

    // The first query that may see one of this block's keys.
    const int query_start = causal ? max(0, first_key - (len_k - len_q)) / kKeys * kKeys : 0;
    const bool any_key = first_key < P.visible_keys(bh);
    for (int tile = any_key ? query_start : len_q; tile < len_q; tile += kKeys) {
        __syncthreads();
        load_rows<T, D>(&q_tile[0][0], D + 1, q + q_base * D, tile, kKeys, len_q);
        load_rows<T, D>(&go_tile[0][0], D + 1, grad_o + q_base * D, tile, kKeys, len_q);
        if (threadIdx.x < kKeys) {
            const int i = tile + threadIdx.x;
            lse_tile[threadIdx.x] = i < len_q ? lse[q_base + i] : 0.0f;
            delta_tile[threadIdx.x] = i < len_q ? delta[q_base + i] : 0.0f;
        }
        __syncthreads();
        const int i = tile + lane;
        for (int r = 0; r < S::kRows; ++r) {
            const int local = warp * S::kRows + r, j = first_key + local;
            const bool visible = P.visible(bh, i, j);
            float p = 0.0f, ds = 0.0f;
            if (visible) {
                const float z = P.dropout_scale(bh, i, j);
                p = expf(dot_shared<D>(q_tile[lane], k_rows[local]) * scale - lse_tile[lane]);
                const float dp = dot_shared<D>(go_tile[lane], v_rows[local]) * z;
                ds = p * (dp - delta_tile[lane]);
                p *= z;
            }
            for (int src = 0; src < kKeys; ++src) {
                const float p_src = __shfl_sync(tf::kFullMask, p, src);
                const float ds_src = __shfl_sync(tf::kFullMask, ds, src);
                for (int c = 0; c < S::kCols; ++c) {
                    dv[r][c] += p_src * go_tile[src][lane + kWarp * c];
                    dk[r][c] += ds_src * q_tile[src][lane + kWarp * c];
                }
            }
        }
    }
    for (int r = 0; r < S::kRows; ++r) {
        const int j = first_key + warp * S::kRows + r;
        if (j >= len_k) continue;
        for (int c = 0; c < S::kCols; ++c) {
            grad_k[(k_base + j) * D + lane + kWarp * c] = tf::from_float<T>(dk[r][c] * scale);
            grad_v[(k_base + j) * D + lane + kWarp * c] = tf::from_float<T>(dv[r][c]);
        }
    }
}

// dQ for a block of queries, streaming tiles of kKeys keys: dQ_i = scale · Σ_j dS_ij k_j.
// grid (BH, ceil(Lq / kBlockRows)), block kWarps · kWarp.
template <typename T, int HEAD_DIM, int ROWS_PER_WARP>
__global__ void attention_backward_q(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     const T* __restrict__ grad_o, const float* __restrict__ lse,
                                     const float* __restrict__ delta, T* __restrict__ grad_q,
                                     const int* __restrict__ key_lengths, int heads, int len_q, int len_k, int causal,
                                     float scale, float dropout_p, unsigned long long seed,
                                     const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    using namespace tf_attention;
    using S = Shape<HEAD_DIM, ROWS_PER_WARP>;
    constexpr int D = HEAD_DIM;
    __shared__ float q_rows[S::kBlockRows][D];
    __shared__ float go_rows[S::kBlockRows][D];
    __shared__ float k_tile[kKeys][D + 1];
    __shared__ float v_tile[kKeys][D + 1];
    const Problem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                       tf::resolve_seed(seed, seed_ptr), offset};
    const int bh = blockIdx.x, first_row = blockIdx.y * S::kBlockRows;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const long long q_base = (long long)bh * len_q, k_base = (long long)bh * len_k;

    load_rows<T, D>(&q_rows[0][0], D, q + q_base * D, first_row, S::kBlockRows, len_q);
    load_rows<T, D>(&go_rows[0][0], D, grad_o + q_base * D, first_row, S::kBlockRows, len_q);
    float row_lse[S::kRows], row_delta[S::kRows], dq[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r) {
        const int i = first_row + warp * S::kRows + r;
        row_lse[r] = i < len_q ? lse[q_base + i] : 0.0f;
        row_delta[r] = i < len_q ? delta[q_base + i] : 0.0f;
        for (int c = 0; c < S::kCols; ++c) dq[r][c] = 0.0f;
    }
    const int key_end = P.key_end(bh, first_row, S::kBlockRows);

    for (int tile = 0; tile < key_end; tile += kKeys) {
        __syncthreads();
        load_rows<T, D>(&k_tile[0][0], D + 1, k + k_base * D, tile, kKeys, len_k);
        load_rows<T, D>(&v_tile[0][0], D + 1, v + k_base * D, tile, kKeys, len_k);
        __syncthreads();
        const int j = tile + lane;
        for (int r = 0; r < S::kRows; ++r) {
            const int local = warp * S::kRows + r, i = first_row + local;
            float ds = 0.0f;
            if (P.visible(bh, i, j)) {
                const float p = expf(dot_shared<D>(q_rows[local], k_tile[lane]) * scale - row_lse[r]);
                const float dp = dot_shared<D>(go_rows[local], v_tile[lane]) * P.dropout_scale(bh, i, j);
                ds = p * (dp - row_delta[r]);
            }
            for (int src = 0; src < kKeys; ++src) {
                const float ds_src = __shfl_sync(tf::kFullMask, ds, src);
                for (int c = 0; c < S::kCols; ++c) dq[r][c] += ds_src * k_tile[src][lane + kWarp * c];
            }
        }
    }
    for (int r = 0; r < S::kRows; ++r) {
        const int i = first_row + warp * S::kRows + r;
        if (i >= len_q) continue;
        for (int c = 0; c < S::kCols; ++c)
            grad_q[(q_base + i) * D + lane + kWarp * c] = tf::from_float<T>(dq[r][c] * scale);
    }
}
