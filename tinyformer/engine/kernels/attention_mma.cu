// Fused scaled-dot-product attention on tensor cores for __half and __nv_bfloat16 inputs with
// float accumulation: FlashAttention-2 (Dao, 2023) in raw CUDA. Reference:
// functional.ScaledDotProductAttention; masks and dropout as attention.cuh says.
//
// Layout. q, k, v are read where the projections left them: element (b, h, i, d) at
// b·batch + h·head + i·row + d (strides in elements, the head dimension contiguous; every
// stride a multiple of 8 and the pointers 16-byte aligned, for 16-byte copies). o, grad_o,
// grad_q, grad_k and grad_v are (batch, len, heads, D) with rows gq_row, gk_row, gv_row elements
// apart (heads·D: contiguous, the layout the output projection reads and its backward writes; a
// multiple of it where the gradients lie side by side in one buffer, as Q, K and V did in one
// product), so no head split or merge is copied. lse is
// (batch·heads, len_q), natural log; delta (from attention_backward_delta over the rows of o
// and grad_o) is indexed by those rows, (b·len_q + i)·heads + h.
//
// Work split. A block has TF_MMA_ATTENTION_WARPS warps; each warp owns 16 rows (the mma's M):
// 16 queries in the forward and in the dQ kernel, 16 keys in the dK/dV kernel, so no two warps
// sum into the same output and nothing needs atomics (deterministic). The other side streams
// through shared memory in tiles of TILE rows, double-buffered with cp.async: while one tile is
// used the next is in flight; each kernel drains its copies (cp.async.wait_all) before it exits,
// since a block with no tile to stream never waits for its first ones. Shared rows are D + 8
// elements long, so that the 8 rows an ldmatrix reads start 16 bytes apart in the bank cycle (no
// conflicts).
//
// Forward, per warp and key tile: S = Q·Kᵀ (Q's fragments stay in registers), the online
// softmax on the accumulators in base 2 (x = s·scale·log2 e; p = 2^(x − m)), and O += P·V with
// P's accumulators repacked as the A operand. Backward: dQ = scale·Σ dS·K (query blocks),
// dV = Σ P̃ᵀ·dO and dK = scale·Σ dSᵀ·Q (key blocks), P recomputed from lse,
// dS = P ∘ (dP·z − delta), dP = dO·Vᵀ, z the dropout scale.
#include "attention.cuh"
#include "mma.cuh"

namespace tf_mma_attention {

constexpr int kWarps = TF_MMA_ATTENTION_WARPS;
constexpr int kRows = TF_MMA_ROWS_PER_WARP;  // the mma's M
constexpr int kBlockRows = kWarps * kRows;
constexpr int kPad = TF_MMA_PAD;  // 16-bit elements of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int kStride = D + kPad;  // elements per shared row

struct Lane {
    int lane, group, quad;  // lane, lane / 4 (the fragment's row), lane % 4 (its column pair)
};
__device__ __forceinline__ Lane this_lane() {
    const int lane = threadIdx.x % tf::kWarp;
    return {lane, lane / 4, lane % 4};
}

// Rows [first, first + count) of a (len, D) matrix with `row` elements between rows, into
// shared rows of kStride<D> elements, by 16-byte cp.async; zero past `len`.
template <typename T, int D>
__device__ __forceinline__ void load_rows_async(T* dst, const T* src, long long row, int first, int count, int len) {
    constexpr int kPerChunk = tf::kCopyBytes / sizeof(T), kChunks = D / kPerChunk;
    for (int c = threadIdx.x; c < count * kChunks; c += blockDim.x) {
        const int r = c / kChunks, col = (c % kChunks) * kPerChunk, index = first + r;
        const bool valid = index < len;
        tf::cp_async_chunk(dst + r * kStride<D> + col, src + (valid ? index * row : 0) + col, valid);
    }
}

// ldmatrix.x4 addresses of this lane for the 16×16 block at (row0, col0) of a shared matrix.
// "a" order: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15): an A
// fragment, or with .trans the B fragments of two 8-column tiles of a (k, n) matrix.
template <typename T, int D>
__device__ __forceinline__ const T* a_order(const T* m, int row0, int col0, int lane) {
    return m + (row0 + lane % 8 + 8 * ((lane / 8) % 2)) * kStride<D> + col0 + 8 * (lane / 16);
}
// "b" order: (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15): the B fragments of
// two 8-column tiles of Mᵀ for an (n, k) matrix M.
template <typename T, int D>
__device__ __forceinline__ const T* b_order(const T* m, int row0, int col0, int lane) {
    return m + (row0 + lane % 8 + 8 * (lane / 16)) * kStride<D> + col0 + 8 * ((lane / 8) % 2);
}

// A fragment of rows [row0, row0 + 16), columns [col0, col0 + 16).
template <typename T, int D>
__device__ __forceinline__ void load_a(unsigned a[4], const T* m, int row0, int col0, int lane) {
    tf::ldmatrix_x4(a, a_order<T, D>(m, row0, col0, lane));
}
// B fragments (b[0..1], b[2..3]) of Mᵀ, M stored (n, k): n in [n0, n0 + 16), k in [k0, k0 + 16).
template <typename T, int D>
__device__ __forceinline__ void load_b_transposed(unsigned b[4], const T* m, int n0, int k0, int lane) {
    tf::ldmatrix_x4(b, b_order<T, D>(m, n0, k0, lane));
}
// B fragments (b[0..1], b[2..3]) of M stored (k, n): k in [k0, k0 + 16), n in [n0, n0 + 16).
template <typename T, int D>
__device__ __forceinline__ void load_b(unsigned b[4], const T* m, int k0, int n0, int lane) {
    tf::ldmatrix_x4<true>(b, a_order<T, D>(m, k0, n0, lane));
}

// The accumulators of two neighbouring 16×8 tiles as the A fragment of a 16×16 operand.
template <typename T>
__device__ __forceinline__ void to_a(unsigned a[4], const float left[4], const float right[4]) {
    a[0] = tf::pack2<T>(left[0], left[1]);
    a[1] = tf::pack2<T>(left[2], left[3]);
    a[2] = tf::pack2<T>(right[0], right[1]);
    a[3] = tf::pack2<T>(right[2], right[3]);
}

// acc[n][i] += A·B over a 16 × 16·K16 A (a[kk]) and a B of N 16-column blocks.
template <typename T, int N8>
__device__ __forceinline__ void mma_pair(float (&acc)[N8][4], int n2, const unsigned a[4], const unsigned b[4]) {
    tf::mma_m16n8k16<T>(acc[2 * n2], a, b);
    tf::mma_m16n8k16<T>(acc[2 * n2 + 1], a, b + 2);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(tf::kFullMask, v, 1));
    return fmaxf(v, __shfl_xor_sync(tf::kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(tf::kFullMask, v, 1);
    return v + __shfl_xor_sync(tf::kFullMask, v, 2);
}

template <int N8>
__device__ __forceinline__ void zero(float (&acc)[N8][4]) {
    #pragma unroll
    for (int n = 0; n < N8; ++n)
        #pragma unroll
        for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
}

// Writes a warp's 16 × D accumulators, row r scaled by factor[r / 8 of the fragment], into rows
// [row0, row0 + 16) (those below len) of `out`, rows `row` elements apart.
template <typename T, int D>
__device__ __forceinline__ void store_rows(T* out, long long row, const float (&acc)[D / 8][4], int row0, int len,
                                           const float factor[2], Lane l) {
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int index = row0 + l.group + 8 * half;
        if (index >= len) continue;
        #pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *reinterpret_cast<unsigned*>(out + index * row + 8 * n + 2 * l.quad) =
                tf::pack2<T>(acc[n][2 * half] * factor[half], acc[n][2 * half + 1] * factor[half]);
    }
}

// x += A·Bᵀ and y += A'·B'ᵀ over the head dimension, for a warp's 16 rows: A, A' rows
// [row0, row0 + 16) of a_s, a2_s; B, B' the TILE rows of b_s, b2_s (an (n, k) layout each).
template <typename T, int D, int TILE>
__device__ __forceinline__ void two_products(float (&x)[TILE / 8][4], float (&y)[TILE / 8][4], const T* a_s,
                                             const T* a2_s, int row0, const T* b_s, const T* b2_s, int lane) {
    zero(x);
    zero(y);
    #pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[4], a2[4];
        load_a<T, D>(a, a_s, row0, 16 * kk, lane);
        load_a<T, D>(a2, a2_s, row0, 16 * kk, lane);
    #pragma unroll
        for (int n2 = 0; n2 < TILE / 16; ++n2) {
            unsigned b[4], b2[4];
            load_b_transposed<T, D>(b, b_s, 16 * n2, 16 * kk, lane);
            load_b_transposed<T, D>(b2, b2_s, 16 * n2, 16 * kk, lane);
            mma_pair<T>(x, n2, a, b);
            mma_pair<T>(y, n2, a2, b2);
        }
    }
}

// acc (16 × D) += M·B: M a warp's 16 × TILE accumulators (P or dS), rounded to T on the way into
// the A fragment; B the TILE × D rows of b_s.
template <typename T, int D, int TILE>
__device__ __forceinline__ void accumulate_product(float (&acc)[D / 8][4], const float (&m)[TILE / 8][4],
                                                   const T* b_s, int lane) {
    #pragma unroll
    for (int kk = 0; kk < TILE / 16; ++kk) {
        unsigned a[4];
        to_a<T>(a, m[2 * kk], m[2 * kk + 1]);
    #pragma unroll
        for (int n2 = 0; n2 < D / 16; ++n2) {
            unsigned b[4];
            load_b<T, D>(b, b_s, 16 * kk, 16 * n2, lane);
            mma_pair<T>(acc, n2, a, b);
        }
    }
}

// Issues the copies of key tile `tile` (K, then V kTile elements after it) into `stage`.
template <typename T, int D, int TILE>
__device__ __forceinline__ void load_key_tile(T* stage, const T* k, long long k_row, const T* v, long long v_row,
                                              int tile, int len_k) {
    load_rows_async<T, D>(stage, k, k_row, tile * TILE, TILE, len_k);
    load_rows_async<T, D>(stage + kStride<D> * TILE, v, v_row, tile * TILE, TILE, len_k);
}

// Where a block of the forward or dQ kernel is: kBlockRows queries from first_row of one (batch,
// head) bh = b·heads + h, its warp's 16 from row0, the keys any of them may see (n_keys) and the
// key tiles to stream.
struct QueryBlock {
    int bh, b, h, first_row, n_keys, warp, row0, tiles;
};

template <int TILE>
__device__ __forceinline__ QueryBlock query_block(const tf::AttentionProblem& P) {
    const int bh = blockIdx.x, first_row = blockIdx.y * kBlockRows, warp = threadIdx.x / tf::kWarp;
    return {bh, bh / P.heads, bh % P.heads, first_row, P.visible_keys(bh), warp, first_row + warp * kRows,
            (P.key_end(bh, first_row, kBlockRows) + TILE - 1) / TILE};
}

}  // namespace tf_mma_attention

// o = softmax(q kᵀ · scale + mask) v and lse. grid (batch·heads, ceil(Lq / block rows)),
// block TF_MMA_ATTENTION_WARPS · 32 threads, dynamic shared memory
// (block rows + 4·TILE) · (HEAD_DIM + 8) · 2 bytes (registry.attention_mma_shared_bytes).
template <typename T, int HEAD_DIM, int TILE>
__global__ void __launch_bounds__(TF_MMA_ATTENTION_WARPS * TF_WARP_SIZE)
attention_mma_forward(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                      float* __restrict__ lse, const int* __restrict__ key_lengths, long long q_batch,
                      long long q_head, long long q_row, long long k_batch, long long k_head, long long k_row,
                      long long v_batch, long long v_head, long long v_row, int heads, int len_q, int len_k,
                      int causal, float scale, float dropout_p, unsigned long long seed,
                      const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    using namespace tf_mma_attention;
    constexpr int D = HEAD_DIM, kTile = kStride<D> * TILE;
    static_assert(D % 16 == 0 && TILE % 16 == 0, "head dimension and tile must be multiples of 16");
    TF_DYNAMIC_SHARED(shared);
    T* q_s = reinterpret_cast<T*>(shared);
    T* kv_s = q_s + kBlockRows * kStride<D>;  // stage s: K at kv_s + 2s·kTile, V after it
    const tf::AttentionProblem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                                    tf::resolve_seed(seed, seed_ptr), offset};
    const auto [bh, b, h, first_row, n_keys, warp, row0, tiles] = query_block<TILE>(P);
    const Lane l = this_lane();
    const T* kb = k + b * k_batch + h * k_head;
    const T* vb = v + b * v_batch + h * v_head;

    load_rows_async<T, D>(q_s, q + b * q_batch + h * q_head, q_row, first_row, kBlockRows, len_q);
    tf::cp_async_commit();
    if (tiles > 0) load_key_tile<T, D, TILE>(kv_s, kb, k_row, vb, v_row, 0, len_k);
    tf::cp_async_commit();

    unsigned qf[D / 16][4];
    float acc[D / 8][4], row_max[2] = {-TF_INFINITY, -TF_INFINITY}, row_sum[2] = {0.0f, 0.0f};
    zero(acc);
    const float scale_log2 = scale * kLog2e;
    for (int tile = 0; tile < tiles; ++tile) {
        if (tile + 1 < tiles) load_key_tile<T, D, TILE>(kv_s + 2 * ((tile + 1) % 2) * kTile, kb, k_row, vb, v_row,
                                                        tile + 1, len_k);
        tf::cp_async_commit();
        tf::cp_async_wait<1>();  // everything but the tile just issued has landed
        __syncthreads();
        if (tile == 0)
            #pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) load_a<T, D>(qf[kk], q_s, warp * kRows, 16 * kk, l.lane);
        const T* k_s = kv_s + 2 * (tile % 2) * kTile;
        const T* v_s = k_s + kTile;

        float s[TILE / 8][4];
        zero(s);
        #pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            #pragma unroll
            for (int n2 = 0; n2 < TILE / 16; ++n2) {
                unsigned kf[4];
                load_b_transposed<T, D>(kf, k_s, 16 * n2, 16 * kk, l.lane);
                mma_pair<T>(s, n2, qf[kk], kf);
            }
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int i = row0 + l.group + 8 * half;
            float tile_max = -TF_INFINITY;
            #pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int j = tile * TILE + 8 * n + 2 * l.quad + e;
                    float& x = s[n][2 * half + e];
                    x = P.visible_among(n_keys, i, j) ? x * scale_log2 : -TF_INFINITY;
                    tile_max = fmaxf(tile_max, x);
                }
            const float new_max = fmaxf(row_max[half], quad_max(tile_max));
            const float base = new_max == -TF_INFINITY ? 0.0f : new_max;  // nothing visible yet: p = 0
            const float correction = exp2f(row_max[half] - base);
            row_max[half] = new_max;
            float sum = 0.0f;
            #pragma unroll
            for (int n = 0; n < TILE / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[n][2 * half + e];
                    const float p = exp2f(x - base);
                    sum += p;
                    x = p * P.dropout_scale(bh, i, tile * TILE + 8 * n + 2 * l.quad + e);
                }
            row_sum[half] = row_sum[half] * correction + sum;  // this lane's columns; summed over the quad at the end
            #pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                acc[n][2 * half] *= correction;
                acc[n][2 * half + 1] *= correction;
            }
        }
        accumulate_product<T, D, TILE>(acc, s, v_s, l.lane);
        __syncthreads();  // this stage is read: the next iteration's copies may overwrite it
    }
    tf::cp_async_wait_all();  // nothing in flight at exit (with no tile, the first copies are not waited for)
    float inverse[2];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float total = quad_sum(row_sum[half]);
        const int i = row0 + l.group + 8 * half;
        inverse[half] = total > 0.0f ? 1.0f / total : 0.0f;
        if (l.quad == 0 && i < len_q)
            lse[(long long)bh * len_q + i] = total > 0.0f ? row_max[half] * kLn2 + logf(total) : -TF_INFINITY;
    }
    store_rows<T, D>(o + ((long long)b * len_q * heads + h) * D, (long long)heads * D, acc, row0, len_q, inverse, l);
}

// dQ for a block of queries, streaming key tiles: dQ_i = scale · Σ_j dS_ij k_j.
// grid (batch·heads, ceil(Lq / block rows)), shared (2·block rows + 4·TILE) · (HEAD_DIM + 8) · 2 bytes.
template <typename T, int HEAD_DIM, int TILE>
__global__ void __launch_bounds__(TF_MMA_ATTENTION_WARPS * TF_WARP_SIZE)
attention_mma_backward_q(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const T* __restrict__ grad_o, const float* __restrict__ lse,
                         const float* __restrict__ delta, T* __restrict__ grad_q, const int* __restrict__ key_lengths,
                         long long q_batch, long long q_head, long long q_row, long long k_batch, long long k_head,
                         long long k_row, long long v_batch, long long v_head, long long v_row, long long gq_row,
                         int heads, int len_q, int len_k, int causal, float scale, float dropout_p,
                         unsigned long long seed, const unsigned long long* __restrict__ seed_ptr,
                         unsigned long long offset) {
    using namespace tf_mma_attention;
    constexpr int D = HEAD_DIM, kTile = kStride<D> * TILE;
    TF_DYNAMIC_SHARED(shared);
    T* q_s = reinterpret_cast<T*>(shared);
    T* go_s = q_s + kBlockRows * kStride<D>;
    T* kv_s = go_s + kBlockRows * kStride<D>;
    const tf::AttentionProblem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                                    tf::resolve_seed(seed, seed_ptr), offset};
    const auto [bh, b, h, first_row, n_keys, warp, row0, tiles] = query_block<TILE>(P);
    const Lane l = this_lane();
    const T* kb = k + b * k_batch + h * k_head;
    const T* vb = v + b * v_batch + h * v_head;
    const long long canonical = ((long long)b * len_q * heads + h) * D, canonical_row = (long long)heads * D;

    load_rows_async<T, D>(q_s, q + b * q_batch + h * q_head, q_row, first_row, kBlockRows, len_q);
    load_rows_async<T, D>(go_s, grad_o + canonical, canonical_row, first_row, kBlockRows, len_q);
    tf::cp_async_commit();
    if (tiles > 0) load_key_tile<T, D, TILE>(kv_s, kb, k_row, vb, v_row, 0, len_k);
    tf::cp_async_commit();

    float row_lse[2], row_delta[2], dq[D / 8][4];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int i = row0 + l.group + 8 * half;
        row_lse[half] = i < len_q ? lse[(long long)bh * len_q + i] * kLog2e : 0.0f;
        row_delta[half] = i < len_q ? delta[((long long)b * len_q + i) * heads + h] : 0.0f;
    }
    zero(dq);
    const float scale_log2 = scale * kLog2e;
    for (int tile = 0; tile < tiles; ++tile) {
        if (tile + 1 < tiles) load_key_tile<T, D, TILE>(kv_s + 2 * ((tile + 1) % 2) * kTile, kb, k_row, vb, v_row,
                                                        tile + 1, len_k);
        tf::cp_async_commit();
        tf::cp_async_wait<1>();
        __syncthreads();
        const T* k_s = kv_s + 2 * (tile % 2) * kTile;
        const T* v_s = k_s + kTile;
        float s[TILE / 8][4], dp[TILE / 8][4];  // S = Q·Kᵀ and dP = dO·Vᵀ
        two_products<T, D, TILE>(s, dp, q_s, go_s, warp * kRows, k_s, v_s, l.lane);
        #pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int i = row0 + l.group + 8 * (c / 2), j = tile * TILE + 8 * n + 2 * l.quad + c % 2;
                float ds = 0.0f;
                if (P.visible_among(n_keys, i, j)) {
                    const float p = exp2f(s[n][c] * scale_log2 - row_lse[c / 2]);
                    ds = p * (dp[n][c] * P.dropout_scale(bh, i, j) - row_delta[c / 2]);
                }
                s[n][c] = ds;
            }
        accumulate_product<T, D, TILE>(dq, s, k_s, l.lane);
        __syncthreads();
    }
    tf::cp_async_wait_all();
    const float factor[2] = {scale, scale};
    store_rows<T, D>(grad_q + (long long)b * len_q * gq_row + (long long)h * D, gq_row, dq, row0, len_q, factor, l);
}

// dK and dV for a block of keys, streaming query tiles (key blocks outer, as FlashAttention-2):
//   dV_j = Σ_i P̃_ij dO_i,  dK_j = scale · Σ_i dS_ij q_i.
// grid (batch·heads, ceil(Lk / block rows)), shared
// (2·block rows + 4·TILE) · (HEAD_DIM + 8) · 2 + 4·TILE · 4 bytes.
template <typename T, int HEAD_DIM, int TILE>
__global__ void __launch_bounds__(TF_MMA_ATTENTION_WARPS * TF_WARP_SIZE)
attention_mma_backward_kv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ grad_o, const float* __restrict__ lse,
                          const float* __restrict__ delta, T* __restrict__ grad_k, T* __restrict__ grad_v,
                          const int* __restrict__ key_lengths, long long q_batch, long long q_head, long long q_row,
                          long long k_batch, long long k_head, long long k_row, long long v_batch, long long v_head,
                          long long v_row, long long gk_row, long long gv_row, int heads, int len_q, int len_k,
                          int causal, float scale, float dropout_p, unsigned long long seed,
                          const unsigned long long* __restrict__ seed_ptr, unsigned long long offset) {
    using namespace tf_mma_attention;
    constexpr int D = HEAD_DIM, kTile = kStride<D> * TILE;
    static_assert(TILE <= kWarps * tf::kWarp, "one thread loads each query's lse and delta");
    TF_DYNAMIC_SHARED(shared);
    T* k_s = reinterpret_cast<T*>(shared);
    T* v_s = k_s + kBlockRows * kStride<D>;
    T* qg_s = v_s + kBlockRows * kStride<D>;                     // stage s: Q at qg_s + 2s·kTile, dO after it
    float* stats_s = reinterpret_cast<float*>(qg_s + 4 * kTile);  // stage s: lse at 2s·TILE, delta after it
    const tf::AttentionProblem P = {heads, len_q, len_k, key_lengths, causal, scale, dropout_p,
                                    tf::resolve_seed(seed, seed_ptr), offset};
    const int bh = blockIdx.x, b = bh / heads, h = bh % heads, first_key = blockIdx.y * kBlockRows;
    const int n_keys = P.visible_keys(bh);
    const int warp = threadIdx.x / tf::kWarp, key0 = first_key + warp * kRows;
    const Lane l = this_lane();
    const T* qb = q + b * q_batch + h * q_head;
    const long long go_base = ((long long)b * len_q * heads + h) * D, canonical_row = (long long)heads * D;
    // The first query that may see one of this block's keys; none when the keys are all masked.
    const int first_query = causal ? max(0, first_key - (len_k - len_q)) / TILE * TILE : 0;
    const int tiles = first_key < n_keys && first_query < len_q ? (len_q - first_query + TILE - 1) / TILE : 0;

    auto load_queries = [&](int tile, int stage) {
        const int first = first_query + tile * TILE;
        T* dst = qg_s + 2 * stage * kTile;
        load_rows_async<T, D>(dst, qb, q_row, first, TILE, len_q);
        load_rows_async<T, D>(dst + kTile, grad_o + go_base, canonical_row, first, TILE, len_q);
        if (threadIdx.x < TILE) {
            const int i = first + threadIdx.x;
            stats_s[2 * stage * TILE + threadIdx.x] = i < len_q ? lse[(long long)bh * len_q + i] * kLog2e : 0.0f;
            stats_s[(2 * stage + 1) * TILE + threadIdx.x] =
                i < len_q ? delta[((long long)b * len_q + i) * heads + h] : 0.0f;
        }
    };
    load_rows_async<T, D>(k_s, k + b * k_batch + h * k_head, k_row, first_key, kBlockRows, len_k);
    load_rows_async<T, D>(v_s, v + b * v_batch + h * v_head, v_row, first_key, kBlockRows, len_k);
    tf::cp_async_commit();
    if (tiles > 0) load_queries(0, 0);
    tf::cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
    zero(dk);
    zero(dv);
    const float scale_log2 = scale * kLog2e;
    for (int tile = 0; tile < tiles; ++tile) {
        if (tile + 1 < tiles) load_queries(tile + 1, (tile + 1) % 2);
        tf::cp_async_commit();
        tf::cp_async_wait<1>();
        __syncthreads();
        const int stage = tile % 2, first = first_query + tile * TILE;
        const T* q_s = qg_s + 2 * stage * kTile;
        const T* go_s = q_s + kTile;
        const float* lse_s = stats_s + 2 * stage * TILE;
        const float* delta_s = lse_s + TILE;
        float st[TILE / 8][4], dpt[TILE / 8][4];  // Sᵀ and dPᵀ: this warp's keys × the tile's queries
        two_products<T, D, TILE>(st, dpt, k_s, v_s, warp * kRows, q_s, go_s, l.lane);
        #pragma unroll
        for (int n = 0; n < TILE / 8; ++n)
            #pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int local = 8 * n + 2 * l.quad + c % 2, i = first + local, j = key0 + l.group + 8 * (c / 2);
                float p = 0.0f, ds = 0.0f;
                if (P.visible_among(n_keys, i, j)) {
                    const float z = P.dropout_scale(bh, i, j);
                    p = exp2f(st[n][c] * scale_log2 - lse_s[local]);
                    ds = p * (dpt[n][c] * z - delta_s[local]);
                    p *= z;
                }
                st[n][c] = p;
                dpt[n][c] = ds;
            }
        accumulate_product<T, D, TILE>(dv, st, go_s, l.lane);
        accumulate_product<T, D, TILE>(dk, dpt, q_s, l.lane);
        __syncthreads();
    }
    tf::cp_async_wait_all();
    const float factor_k[2] = {scale, scale}, factor_v[2] = {1.0f, 1.0f};
    store_rows<T, D>(grad_k + (long long)b * len_k * gk_row + (long long)h * D, gk_row, dk, key0, len_k, factor_k, l);
    store_rows<T, D>(grad_v + (long long)b * len_k * gv_row + (long long)h * D, gv_row, dv, key0, len_k, factor_v, l);
}
