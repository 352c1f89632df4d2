// Paged prefill attention on CPU: every prefill chunk of a step in one call, K/V read in place
// through the block tables (layout: see paged_decode.cpp; K is [head_dim, block_size] per block
// and head; elements fp32 or bfloat16, widened as loaded). The torch path gathers each chunk's context and runs SDPA chunk by chunk (~60 GFLOP/s
// on causal chunks); here a step's chunks are cut into tasks that run side by side.
//
// One task = (chunk, KV head, tile of up to kTile query rows). The tile's G * rows query vectors
// (the whole GQA group of each row: K/V loaded once for all of them) walk the key blocks in order
// with an online softmax (running max and sum, output rescaled when the max grows), flash-attention
// style, over spans of ~64 keys (whole blocks, aligned to absolute positions): a vector's per-step
// work (max, sum, rescale) is then small beside the span's FMAs. Causal and window masks are
// per-row token ranges within a span: masked lanes get p = 0 exactly, and a span with no visible
// key for a row leaves that row untouched.
//
// Bitwise batch invariance: a query vector's result depends only on its own values, its position
// and the cache. Vectors are grouped for register blocking, but each keeps its own accumulators
// and the same operation order in every group; extra terms from a partner's wider range are
// fma(0, v, acc) = acc. So a row's output is the same alone or in any batch, any chunking of its
// prompt, any tile boundary and any thread count.
// Only the torch headers used here: <torch/extension.h> takes ~30 s to parse per file.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kv_load.h"
#include "simd_avx2.h"
#include "simd_avx512.h"

namespace {

using conveyor_kv::bf16_bits;
using conveyor_kv::madd;
using conveyor_kv::to_float;
#ifdef CONVEYOR_SIMD_AVX2
using conveyor_kv::load8;
using conveyor_simd::exp8;
using conveyor_simd::hmax8;
using conveyor_simd::hsum8;
#endif
#ifdef CONVEYOR_SIMD_AVX512
using conveyor_kv::load16;
using conveyor_simd::exp16;
using conveyor_simd::hmax16;
using conveyor_simd::hsum16;
#endif

constexpr int64_t kTile = 16;  // query rows per task: G * 16 vectors share each K/V block load
constexpr int64_t kSpan = 64;  // keys per online-softmax step, rounded to whole blocks


// One span of one vector's online softmax, in place: s[t] becomes exp(s[t] - m') for t in [a, e)
// and 0 elsewhere in [0, L), where m' = max(m, max s[a..e)) is written back to m; returns the sum
// of the new p. Scalar loops here would cost as much as the span's FMAs (long chains of dependent
// adds and maxes), so the span stays in vectors with the mask as lanes; lanes outside [a, e) may
// hold anything (they are never computed for blocks before the window).
inline float softmax_span(float* sn, int64_t L, int64_t a, int64_t e, float& m) {
#ifdef CONVEYOR_SIMD_AVX512
  if (L % 16 == 0) {  // the AVX2 path below in 16 lanes, the mask in a mask register
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i av = _mm512_set1_epi32(static_cast<int>(a) - 1), ev = _mm512_set1_epi32(static_cast<int>(e));
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    auto mask = [&](int64_t t) {
      const __m512i i = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(t)));
      return static_cast<__mmask16>(_mm512_cmpgt_epi32_mask(i, av) & _mm512_cmpgt_epi32_mask(ev, i));
    };
    const bool whole = a == 0 && e == L;
    __m512 mx = ninf;
    for (int64_t t = 0; t < L; t += 16) {
      const __m512 x = _mm512_loadu_ps(sn + t);
      mx = _mm512_max_ps(mx, whole ? x : _mm512_mask_mov_ps(ninf, mask(t), x));
    }
    m = std::max(m, hmax16(mx));
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < L; t += 16) {
      __m512 p;
      if (whole) {
        p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sn + t), mv));
      } else {
        const __mmask16 k = mask(t);
        p = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_mask_mov_ps(ninf, k, _mm512_loadu_ps(sn + t)), mv)));
      }
      _mm512_storeu_ps(sn + t, p);
      sum = _mm512_add_ps(sum, p);
    }
    return hsum16(sum);
  }
#endif
#ifdef CONVEYOR_SIMD_AVX2
  if (L % 8 == 0) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i av = _mm256_set1_epi32(static_cast<int>(a) - 1), ev = _mm256_set1_epi32(static_cast<int>(e));
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    auto mask = [&](int64_t t) {
      const __m256i i = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(t)));
      return _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(i, av), _mm256_cmpgt_epi32(ev, i)));
    };
    // Most spans are visible whole: no mask then (the same lanes, the same results).
    const bool whole = a == 0 && e == L;
    __m256 mx = ninf;
    for (int64_t t = 0; t < L; t += 8) {
      const __m256 x = _mm256_loadu_ps(sn + t);
      mx = _mm256_max_ps(mx, whole ? x : _mm256_blendv_ps(ninf, x, mask(t)));
    }
    m = std::max(m, hmax8(mx));
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < L; t += 8) {
      __m256 p;
      if (whole) {
        p = exp8(_mm256_sub_ps(_mm256_loadu_ps(sn + t), mv));
      } else {
        const __m256 k = mask(t);
        p = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(sn + t), k), mv)), k);
      }
      _mm256_storeu_ps(sn + t, p);
      sum = _mm256_add_ps(sum, p);
    }
    return hsum8(sum);
  }
#endif
  m = std::max(m, *std::max_element(sn + a, sn + e));
  float sum = 0.f;
  for (int64_t t = 0; t < L; ++t) {
    sn[t] = t >= a && t < e ? std::exp(sn[t] - m) : 0.f;
    sum += sn[t];
  }
  return sum;
}

// s[n * ld + t] = q[n] . k[t] for the block's bs tokens (all lanes; masking comes later). K is
// [D, bs]: for each dimension one load of K's row serves six query vectors, twelve FMA chains.
// T: the cache's element (kv_load.h).
template <typename T>
void scores(const float* q, const T* kt, int64_t N, int64_t D, int64_t bs, int64_t ld, float* s) {
#ifdef CONVEYOR_SIMD_AVX512
  if (bs == 16) {  // K's row of 16 tokens in one zmm, serving twelve query vectors: twelve chains
    for (int64_t n0 = 0; n0 < N; n0 += 12) {
      const int64_t nn = std::min<int64_t>(12, N - n0);
      const float* qj[12];
      for (int j = 0; j < 12; ++j) qj[j] = q + std::min<int64_t>(n0 + j, N - 1) * D;  // tail: repeats, dropped
      __m512 acc[12];
#pragma GCC unroll 12
      for (int j = 0; j < 12; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        const __m512 k = load16(kt + d * 16);
#pragma GCC unroll 12
        for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(qj[j][d]), k, acc[j]);
      }
#pragma GCC unroll 12
      for (int j = 0; j < 12; ++j)
        if (j < nn) _mm512_storeu_ps(s + (n0 + j) * ld, acc[j]);
    }
    return;
  }
#endif
#ifdef CONVEYOR_SIMD_AVX2
  if (bs == 16) {
    for (int64_t n0 = 0; n0 < N; n0 += 6) {
      const int64_t nn = std::min<int64_t>(6, N - n0);
      const float* qj[6];
      for (int j = 0; j < 6; ++j) qj[j] = q + std::min<int64_t>(n0 + j, N - 1) * D;  // tail: repeats, dropped
      __m256 lo[6], hi[6];
      for (int j = 0; j < 6; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; ++d) {
        const __m256 k0 = load8(kt + d * 16), k1 = load8(kt + d * 16 + 8);
        for (int j = 0; j < 6; ++j) {
          const __m256 x = _mm256_broadcast_ss(qj[j] + d);
          lo[j] = _mm256_fmadd_ps(x, k0, lo[j]);
          hi[j] = _mm256_fmadd_ps(x, k1, hi[j]);
        }
      }
      // Stored by constant index only: a loop to nn would make the compiler keep lo/hi in memory
      // (a store per FMA).
      float tmp[6][16];
      for (int j = 0; j < 6; ++j) {
        _mm256_storeu_ps(tmp[j], lo[j]);
        _mm256_storeu_ps(tmp[j] + 8, hi[j]);
      }
      for (int64_t j = 0; j < nn; ++j) std::copy(tmp[j], tmp[j] + 16, s + (n0 + j) * ld);
    }
    return;
  }
#endif
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < bs; ++t) {
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc = madd(q[n * D + d], to_float(kt[d * bs + t]), acc);
      s[n * ld + t] = acc;
    }
}

// o[n] += sum_t p[n * L + t] * v[t] for t in [a[n], e[n]), v[t] the row at vrow[t]. Two vectors at a time over 32 dimensions:
// eight accumulators, each V load serves both (the pair runs over the union of their ranges; the
// other's lanes there have p = 0 and add exactly nothing).
#ifdef CONVEYOR_SIMD_AVX512
// values() for four vectors n0.. (repeats of the last past N, dropped) over J * 16 dimensions from
// d: each V load serves all four, 4 * J chains.
template <int J, typename T>
inline void values16(float* o, const float* p, const T* const* vrow, int64_t n0, int64_t nn, int64_t ta,
                     int64_t te, int64_t d, int64_t D, int64_t L) {
  const float* pj[4];
  float* oj[4];
  for (int i = 0; i < 4; ++i) {
    const int64_t n = n0 + std::min<int64_t>(i, nn - 1);
    pj[i] = p + n * L;
    oj[i] = o + n * D + d;
  }
  __m512 acc[4][J];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < J; ++j) acc[i][j] = _mm512_loadu_ps(oj[i] + 16 * j);
  for (int64_t t = ta; t < te; ++t) {
    const T* vt = vrow[t] + d;
    __m512 v[J];
    for (int j = 0; j < J; ++j) v[j] = load16(vt + 16 * j);
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m512 b = _mm512_set1_ps(pj[i][t]);
      for (int j = 0; j < J; ++j) acc[i][j] = _mm512_fmadd_ps(b, v[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    if (i < nn)
      for (int j = 0; j < J; ++j) _mm512_storeu_ps(oj[i] + 16 * j, acc[i][j]);
}
#endif

template <typename T>
void values(float* o, const float* p, const T* const* vrow, const int64_t* a, const int64_t* e, int64_t N,
            int64_t D, int64_t L) {
#ifdef CONVEYOR_SIMD_AVX512
  if (D % 16 == 0) {  // four vectors at a time, over the union of their ranges (p = 0 outside each)
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      const int64_t nn = std::min<int64_t>(4, N - n0);
      int64_t ta = a[n0], te = e[n0];
      for (int64_t n = n0 + 1; n < n0 + nn; ++n) ta = std::min(ta, a[n]), te = std::max(te, e[n]);
      if (ta >= te) continue;
      int64_t d = 0;
      for (; d + 64 <= D; d += 64) values16<4>(o, p, vrow, n0, nn, ta, te, d, D, L);
      for (; d < D; d += 16) values16<1>(o, p, vrow, n0, nn, ta, te, d, D, L);
    }
    return;
  }
#endif
  for (int64_t n0 = 0; n0 < N; n0 += 2) {
    const int64_t n1 = std::min(n0 + 1, N - 1);
    const int64_t ta = std::min(a[n0], a[n1]), te = std::max(e[n0], e[n1]);
    if (ta >= te) continue;
    const float* p0 = p + n0 * L;
    const float* p1 = p + n1 * L;
    int64_t d = 0;
#ifdef CONVEYOR_SIMD_AVX2
    for (; d + 32 <= D; d += 32) {
      __m256 x[4], y[4];
      for (int j = 0; j < 4; ++j) x[j] = _mm256_loadu_ps(o + n0 * D + d + 8 * j);
      for (int j = 0; j < 4; ++j) y[j] = _mm256_loadu_ps(o + n1 * D + d + 8 * j);
      for (int64_t t = ta; t < te; ++t) {
        const __m256 b0 = _mm256_set1_ps(p0[t]), b1 = _mm256_set1_ps(p1[t]);
        const T* vt = vrow[t] + d;
        for (int j = 0; j < 4; ++j) {
          const __m256 vj = load8(vt + 8 * j);
          x[j] = _mm256_fmadd_ps(b0, vj, x[j]);
          y[j] = _mm256_fmadd_ps(b1, vj, y[j]);
        }
      }
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + n0 * D + d + 8 * j, x[j]);
      if (n1 != n0)
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + n1 * D + d + 8 * j, y[j]);
    }
#endif
    for (int64_t n = n0; n <= n1; ++n)  // dimensions left over (D not a multiple of 32)
      for (int64_t dd = d; dd < D; ++dd) {
        float acc = o[n * D + dd];
        for (int64_t t = ta; t < te; ++t) acc = madd(p[n * L + t], to_float(vrow[t][dd]), acc);
        o[n * D + dd] = acc;
      }
  }
}

struct Task {
  int64_t chunk, head, row, rows;  // rows [row, row + rows) of the chunk
  int64_t cost;                    // ~ query rows x keys, for the longest-first order
};

}  // namespace

// q [T, heads, D] (rows may be strided: a view into the fused qkv projection), the chunks' rows
// one after another; out: contiguous, the same shape, written in place; caches as in paged_decode; tables
// [chunks, width] int32; starts, lens [chunks] int32 (chunk c's rows are positions
// start .. start + len - 1, its context start + len, every key already written to the cache).
// A row at position p attends to keys (max(0, p - window), p] (window < 0: no window).
// T: the caches' element, float or bf16_bits (kv_load.h); paged_prefill below dispatches.
template <typename KvT>
void prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor tables, at::Tensor starts,
             at::Tensor lens, double scale, int64_t window, at::Tensor out) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q: fp32 [rows, heads, D], each row's heads contiguous");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.sizes() == q.sizes(),
              "out: contiguous fp32, q's shape");
  const auto kind = std::is_same_v<KvT, float> ? at::kFloat : at::kBFloat16;
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == kind &&
                  v_cache.scalar_type() == kind && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches: contiguous fp32 or bf16 (both the same) [blocks, kv_heads, block_size, D]");
  TORCH_CHECK(tables.scalar_type() == at::kInt && tables.is_contiguous() && tables.dim() == 2, "tables: int32 [chunks, width]");
  TORCH_CHECK(starts.scalar_type() == at::kInt && starts.is_contiguous() && lens.scalar_type() == at::kInt &&
                  lens.is_contiguous() && starts.numel() == tables.size(0) && lens.numel() == tables.size(0),
              "starts, lens: int32 [chunks]");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), chunks = tables.size(0);
  const int64_t KV = k_cache.size(1), bs = k_cache.size(2), nblocks = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == D && H % KV == 0, "shape mismatch");
  const int64_t G = H / KV, width = tables.size(1), head_stride = bs * D, block_stride = KV * bs * D;
  const int64_t span_blocks = std::max<int64_t>(1, kSpan / bs), L = span_blocks * bs;
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int32_t* sp = starts.data_ptr<int32_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  // Checked before the parallel region: an exception thrown inside it would end the process.
  std::vector<int64_t> first_row(chunks + 1, 0);
  std::vector<Task> tasks;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t start = sp[c], len = lp[c], ctx = start + len;
    TORCH_CHECK(start >= 0 && len >= 0 && ctx <= width * bs, "chunk context longer than its block table");
    for (int64_t b = 0; b * bs < ctx; ++b)
      TORCH_CHECK(tp[c * width + b] >= 0 && tp[c * width + b] < nblocks, "block id out of range");
    first_row[c + 1] = first_row[c] + len;
    for (int64_t r = 0; r < len; r += kTile) {
      const int64_t rows = std::min(kTile, len - r), last = start + r + rows - 1;
      const int64_t lo = window >= 0 ? std::max<int64_t>(0, start + r - window + 1) : 0;
      for (int64_t h = 0; h < KV; ++h) tasks.push_back({c, h, r, rows, rows * (last + 1 - lo)});
    }
  }
  TORCH_CHECK(first_row[chunks] == T, "q has ", T, " rows but the chunks' lengths sum to ", first_row[chunks]);
  // Longest first, taken from a shared counter: causal tiles differ in cost by the chunk length,
  // and an even split of the task range would leave one thread with all the long ones. Which
  // thread runs a task never changes its result.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });

  const float* qp = q.data_ptr<float>();
  const int64_t q_row = q.stride(0);
  const KvT* kp = static_cast<const KvT*>(k_cache.data_ptr());
  const KvT* vp = static_cast<const KvT*>(v_cache.data_ptr());
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
  const int64_t nthreads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ntasks));
  std::atomic<int64_t> next{0};

  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    const int64_t N_max = kTile * G;
    std::vector<float> qs(N_max * D), o(N_max * D), s(N_max * L), m(N_max), l(N_max);
    std::vector<int64_t> a(N_max), e(N_max);
    std::vector<const KvT*> vrow(L);
    for (int64_t i; (i = next.fetch_add(1)) < ntasks;) {
      const Task& task = tasks[i];
      const int64_t start = sp[task.chunk], h = task.head, N = task.rows * G;
      const int32_t* table = tp + task.chunk * width;
      // Vector n = (row n / G, query head h * G + n % G), scale folded in once.
      for (int64_t r = 0; r < task.rows; ++r) {
        const float* src = qp + (first_row[task.chunk] + task.row + r) * q_row + h * G * D;
        for (int64_t j = 0; j < G * D; ++j) qs[r * G * D + j] = src[j] * fscale;
      }
      std::fill(o.begin(), o.begin() + N * D, 0.f);
      std::fill(m.begin(), m.begin() + N, neg_inf);
      std::fill(l.begin(), l.begin() + N, 0.f);
      const int64_t p0 = start + task.row, p1 = p0 + task.rows - 1;  // first and last query position
      const int64_t lo = window >= 0 ? std::max<int64_t>(0, p0 - window + 1) : 0;
      for (int64_t span = lo / bs / span_blocks; span * L <= p1; ++span) {
        const int64_t base = span * L;  // position of the span's first lane
        // Blocks before the window's first are neither scored nor read: their lanes are masked.
        const int64_t b0 = std::max(span * span_blocks, lo / bs), b1 = std::min((span + 1) * span_blocks, p1 / bs + 1);
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t lane = (b - span * span_blocks) * bs;
          scores(qs.data(), kp + table[b] * block_stride + h * head_stride, N, D, bs, L, s.data() + lane);
          const KvT* vb = vp + table[b] * block_stride + h * head_stride;
          for (int64_t t = 0; t < bs; ++t) vrow[lane + t] = vb + t * D;
        }
        for (int64_t n = 0; n < N; ++n) {
          const int64_t pos = p0 + n / G;
          const int64_t first = window >= 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
          a[n] = std::clamp<int64_t>(first - base, 0, L);
          e[n] = std::clamp<int64_t>(pos + 1 - base, 0, L);
          float* sn = s.data() + n * L;
          if (a[n] >= e[n]) {  // no visible key in this span: the row's state stays as it is
            std::fill(sn, sn + L, 0.f);
            continue;
          }
          const float mold = m[n];
          const float sum = softmax_span(sn, L, a[n], e[n], m[n]);
          if (m[n] != mold && mold != neg_inf) {  // the max grew: rescale what was summed so far
            const float alpha = std::exp(mold - m[n]);
            l[n] *= alpha;
            for (int64_t d = 0; d < D; ++d) o[n * D + d] *= alpha;
          }
          l[n] += sum;
        }
        values(o.data(), s.data(), vrow.data(), a.data(), e.data(), N, D, L);
      }
      for (int64_t n = 0; n < N; ++n) {  // every row sees at least its own key: l > 0
        const float inv = 1.f / l[n];
        float* dst = op + ((first_row[task.chunk] + task.row + n / G) * H + h * G + n % G) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = o[n * D + d] * inv;
      }
    }
  });
}

void paged_prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor tables,
                   at::Tensor starts, at::Tensor lens, double scale, int64_t window, at::Tensor out) {
  if (k_cache.scalar_type() == at::kBFloat16) return prefill<bf16_bits>(q, k_cache, v_cache, tables, starts, lens, scale, window, out);
  prefill<float>(q, k_cache, v_cache, tables, starts, lens, scale, window, out);
}

// Registered as a torch op (torch.ops.conveyor.paged_prefill) rather than a pybind function: it is
// compiled into the same extension as paged_decode.cpp, which owns the module's PYBIND11_MODULE.
TORCH_LIBRARY_FRAGMENT(CONVEYOR_OPS, m) {
  m.def("paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, Tensor starts, Tensor lens, "
        "float scale, int window, Tensor(a!) out) -> ()",
        &paged_prefill);
}
