// Fused scaled-dot-product attention, FlashAttention-style (Dao et al., 2022; Dao, 2023).
// Reference: functional.ScaledDotProductAttention.
//
// Shapes: q (B, H, Lq, D), k and v (B, H, Lk, D), o (B, H, Lq, D), each with its own strides in
// elements (batch, head, row; the head dimension contiguous): a head split by reshape and transpose
// is read where it is, and o and the gradients written in the layout the launcher chose (the
// projections' (B, L, H, D) for the model, (BH, L, D) for the kernel tests); BH = batch·heads.
// delta (backward) is indexed by o's rows: o is contiguous, so row (b, h, i) is its element offset / D.
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

// An operand's strides in elements: between batches, heads and rows (columns are contiguous).
struct Strides {
    long long batch, head, row;
    // The element offset where head bh = b·heads + h of the operand starts, and that head's pointer.
    __device__ long long offset(int bh, int heads) const {
        return (long long)(bh / heads) * batch + (long long)(bh % heads) * head;
    }
    template <typename P>
    __device__ P* of_head(P* base, int bh, int heads) const { return base + offset(bh, heads); }
};

// Loads rows [first, first + count) of a (len, D) matrix whose rows are `src_row` elements apart
// into shared rows of `stride` floats, zero past `len`.
template <typename T, int D>
__device__ void load_rows(float* dst, int stride, const T* src, long long src_row, int first, int count, int len) {
    for (int e = threadIdx.x; e < count * D; e += blockDim.x) {
        const int r = e / D, c = e % D, row = first + r;
        dst[r * stride + c] = row < len ? tf::to_float(src[(long long)row * src_row + c]) : 0.0f;
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
                                  long long q_batch, long long q_head, long long q_row, long long k_batch,
                                  long long k_head, long long k_row, long long v_batch, long long v_head,
                                  long long v_row, long long o_batch, long long o_head, long long o_row,
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
    const Strides qs = {q_batch, q_head, q_row}, ks = {k_batch, k_head, k_row}, vs = {v_batch, v_head, v_row};
    const Strides os = {o_batch, o_head, o_row};
    const T* qb = qs.of_head(q, bh, heads);
    const T* kb = ks.of_head(k, bh, heads);
    const T* vb = vs.of_head(v, bh, heads);
    T* ob = os.of_head(o, bh, heads);

    load_rows<T, D>(&q_rows[0][0], D, qb, q_row, first_row, S::kBlockRows, len_q);

    float row_max[S::kRows], row_sum[S::kRows], acc[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r) {
        row_max[r] = -TF_INFINITY;
        row_sum[r] = 0.0f;
        for (int c = 0; c < S::kCols; ++c) acc[r][c] = 0.0f;
    }
    const int key_end = P.key_end(bh, first_row, S::kBlockRows);

    for (int tile = 0; tile < key_end; tile += kKeys) {
        __syncthreads();  // the previous tile is no longer read
        load_rows<T, D>(&k_tile[0][0], D + 1, kb, k_row, tile, kKeys, len_k);
        load_rows<T, D>(&v_tile[0][0], D, vb, v_row, tile, kKeys, len_k);
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
            ob[(long long)i * o_row + lane + kWarp * c] = tf::from_float<T>(acc[r][c] * inv);
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
                                      const int* __restrict__ key_lengths, long long q_batch, long long q_head,
                                      long long q_row, long long k_batch, long long k_head, long long k_row,
                                      long long v_batch, long long v_head, long long v_row, long long o_batch,
                                      long long o_head, long long o_row, long long gk_batch, long long gk_head,
                                      long long gk_row, long long gv_batch, long long gv_head, long long gv_row,
                                      int heads, int len_q, int len_k, int causal,
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
    const long long q_base = (long long)bh * len_q;
    const Strides qs = {q_batch, q_head, q_row}, ks = {k_batch, k_head, k_row}, vs = {v_batch, v_head, v_row};
    const Strides os = {o_batch, o_head, o_row}, gks = {gk_batch, gk_head, gk_row}, gvs = {gv_batch, gv_head, gv_row};
    const T* qb = qs.of_head(q, bh, heads);
    const T* gob = os.of_head(grad_o, bh, heads);
    const long long delta_base = os.offset(bh, heads);  // where o's head starts: delta's rows follow o's

    load_rows<T, D>(&k_rows[0][0], D, ks.of_head(k, bh, heads), k_row, first_key, S::kBlockRows, len_k);
    load_rows<T, D>(&v_rows[0][0], D, vs.of_head(v, bh, heads), v_row, first_key, S::kBlockRows, len_k);

    float dk[S::kRows][S::kCols], dv[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r)
        for (int c = 0; c < S::kCols; ++c) dk[r][c] = dv[r][c] = 0.0f;

    // The first query that may see one of this block's keys.
    const int query_start = causal ? max(0, first_key - (len_k - len_q)) / kKeys * kKeys : 0;
    const bool any_key = first_key < P.visible_keys(bh);
    for (int tile = any_key ? query_start : len_q; tile < len_q; tile += kKeys) {
        __syncthreads();
        load_rows<T, D>(&q_tile[0][0], D + 1, qb, q_row, tile, kKeys, len_q);
        load_rows<T, D>(&go_tile[0][0], D + 1, gob, o_row, tile, kKeys, len_q);
        if (threadIdx.x < kKeys) {
            const int i = tile + threadIdx.x;
            lse_tile[threadIdx.x] = i < len_q ? lse[q_base + i] : 0.0f;
            delta_tile[threadIdx.x] = i < len_q ? delta[(delta_base + (long long)i * o_row) / D] : 0.0f;
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
        T* gk = gks.of_head(grad_k, bh, heads) + (long long)j * gk_row;
        T* gv = gvs.of_head(grad_v, bh, heads) + (long long)j * gv_row;
        for (int c = 0; c < S::kCols; ++c) {
            gk[lane + kWarp * c] = tf::from_float<T>(dk[r][c] * scale);
            gv[lane + kWarp * c] = tf::from_float<T>(dv[r][c]);
        }
    }
}

// dQ for a block of queries, streaming tiles of kKeys keys: dQ_i = scale · Σ_j dS_ij k_j.
// grid (BH, ceil(Lq / kBlockRows)), block kWarps · kWarp.
template <typename T, int HEAD_DIM, int ROWS_PER_WARP>
__global__ void attention_backward_q(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                     const T* __restrict__ grad_o, const float* __restrict__ lse,
                                     const float* __restrict__ delta, T* __restrict__ grad_q,
                                     const int* __restrict__ key_lengths, long long q_batch, long long q_head,
                                     long long q_row, long long k_batch, long long k_head, long long k_row,
                                     long long v_batch, long long v_head, long long v_row, long long o_batch,
                                     long long o_head, long long o_row, long long gq_batch, long long gq_head,
                                     long long gq_row, int heads, int len_q, int len_k, int causal,
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
    const long long q_base = (long long)bh * len_q;
    const Strides qs = {q_batch, q_head, q_row}, ks = {k_batch, k_head, k_row}, vs = {v_batch, v_head, v_row};
    const Strides os = {o_batch, o_head, o_row}, gqs = {gq_batch, gq_head, gq_row};
    const T* kb = ks.of_head(k, bh, heads);
    const T* vb = vs.of_head(v, bh, heads);
    const long long delta_base = os.offset(bh, heads);  // where o's head starts: delta's rows follow o's

    load_rows<T, D>(&q_rows[0][0], D, qs.of_head(q, bh, heads), q_row, first_row, S::kBlockRows, len_q);
    load_rows<T, D>(&go_rows[0][0], D, os.of_head(grad_o, bh, heads), o_row, first_row, S::kBlockRows, len_q);
    float row_lse[S::kRows], row_delta[S::kRows], dq[S::kRows][S::kCols];
    for (int r = 0; r < S::kRows; ++r) {
        const int i = first_row + warp * S::kRows + r;
        row_lse[r] = i < len_q ? lse[q_base + i] : 0.0f;
        row_delta[r] = i < len_q ? delta[(delta_base + (long long)i * o_row) / D] : 0.0f;
        for (int c = 0; c < S::kCols; ++c) dq[r][c] = 0.0f;
    }
    const int key_end = P.key_end(bh, first_row, S::kBlockRows);

    for (int tile = 0; tile < key_end; tile += kKeys) {
        __syncthreads();
        load_rows<T, D>(&k_tile[0][0], D + 1, kb, k_row, tile, kKeys, len_k);
        load_rows<T, D>(&v_tile[0][0], D + 1, vb, v_row, tile, kKeys, len_k);
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
        T* gq = gqs.of_head(grad_q, bh, heads) + (long long)i * gq_row;
        for (int c = 0; c < S::kCols; ++c) gq[lane + kWarp * c] = tf::from_float<T>(dq[r][c] * scale);
    }
}
