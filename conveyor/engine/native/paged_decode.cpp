// Paged decode attention on CPU: one query token per row, K/V read in place through the block
// table. The torch path gathers each row's blocks into a buffer first, so every K/V byte crosses
// memory three times (read, write, read by SDPA); here it is read once.
//
// Cache layout: V [blocks, kv_heads, block_size, head_dim], K the same but transposed within each
// (block, head): [head_dim, block_size]. A block is one contiguous run of memory, head after head,
// and the kernel reads it front to back. Decode attention is bound by how fast K/V stream in; this
// CPU's prefetchers stream contiguous runs at more than twice the rate of the 256-byte pieces, 768
// bytes apart, that a token-major layout gives one head. K transposed lets the scores of a block's
// tokens be computed side by side in SIMD lanes, with no horizontal sums. Elements are fp32, or
// bfloat16 (--kv-cache-dtype bfloat16: half the bytes to stream), widened exactly as they are
// loaded (kv_load.h); every sum and product is fp32 either way.
//
// One task = one partition of a row: its context split into runs of `partition` tokens counted from
// the row's first attended position (like vLLM's paged attention v2), so that a batch of ragged
// contexts (32..768 tokens) becomes tasks of nearly equal cost, handed out longest first to
// whichever thread is free. Per task, two passes: every score first (K blocks in order), one softmax
// over the partition (no running max, no rescaling), then p @ V (V blocks in order). A row of one
// partition is normalised in place and written out directly; a longer row keeps each partition's
// max, sum and unnormalised output, and the thread that finishes its last partition combines them
// in partition order. The query heads of a GQA group are scored together so each K/V vector is
// loaded once for all of them.
// Partition bounds and the reduction order depend only on the row's own context, never on the batch
// or the thread count, so results are bitwise batch-invariant.
// Only the torch headers used here: <torch/extension.h> takes ~30 s to parse per file.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
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
// The same exp polynomial and reduction as the prefill kernel (simd_avx2.h).
using conveyor_simd::exp8;
using conveyor_simd::hsum8;
#endif
#ifdef CONVEYOR_SIMD_AVX512
using conveyor_kv::load16;
using conveyor_simd::exp16;
using conveyor_simd::first_lanes;
using conveyor_simd::hmax16;
using conveyor_simd::hsum16;
#endif

// Scores of one block's tokens [off, off + n) against the group's G queries, K stored transposed
// within the block ([D, bs]): s[g * ld + t - off]. Vectorised over tokens: for each dimension d, one
// load of K's row d serves every query of the group (a broadcast of q[g][d] each), and no
// horizontal sums are needed. Lanes past n are computed and dropped. T: the cache's element (kv_load.h).
template <typename T>
inline void score_block(const float* q, const T* kt, int64_t bs, int64_t off, int64_t n, int64_t G,
                        int64_t D, int64_t ld, float* s) {
#ifdef CONVEYOR_SIMD_AVX512
  if (bs == 16 && D % 4 == 0) {
    // A block's 16 token scores in one zmm: up to three queries x four interleaved dimensions,
    // twelve independent FMA chains, each K row loaded once for the group.
    const __mmask16 keep = static_cast<__mmask16>(first_lanes(off + n) & ~first_lanes(off));
    for (int64_t g0 = 0; g0 < G; g0 += 3) {
      const int64_t gn = std::min<int64_t>(3, G - g0);
      const float* qg[3] = {q + g0 * D, q + (g0 + std::min<int64_t>(1, gn - 1)) * D, q + (g0 + gn - 1) * D};
      __m512 acc[3][4];
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j)
        for (int u = 0; u < 4; ++u) acc[j][u] = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 4) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const __m512 k = load16(kt + (d + u) * 16);
#pragma GCC unroll 3
          for (int j = 0; j < 3; ++j) acc[j][u] = _mm512_fmadd_ps(_mm512_set1_ps(qg[j][d + u]), k, acc[j][u]);
        }
      }
      // Lanes [off, off + n) moved down to [0, n) and stored: no copy through memory.
#pragma GCC unroll 3
      for (int j = 0; j < 3; ++j) {
        if (j >= gn) break;
        const __m512 v = _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]), _mm512_add_ps(acc[j][2], acc[j][3]));
        _mm512_mask_storeu_ps(s + (g0 + j) * ld, first_lanes(n), _mm512_maskz_compress_ps(keep, v));
      }
    }
    return;
  }
#endif
#ifdef CONVEYOR_SIMD_AVX2
  if (bs == 16 && D % 2 == 0) {
    // Up to three queries x two 8-token halves x two interleaved dimension sets: twelve independent
    // FMA chains, enough to hide the FMA latency.
    for (int64_t g0 = 0; g0 < G; g0 += 3) {
      const int64_t gn = std::min<int64_t>(3, G - g0);
      const float* q0 = q + g0 * D;
      const float* q1 = q + (g0 + std::min<int64_t>(1, gn - 1)) * D;
      const float* q2 = q + (g0 + gn - 1) * D;
      __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
      __m256 b00 = a00, b01 = a00, b10 = a00, b11 = a00, b20 = a00, b21 = a00;
      for (int64_t d = 0; d < D; d += 2) {
        const T* row = kt + d * bs;
        __m256 k0 = load8(row), k1 = load8(row + 8);
        __m256 x = _mm256_broadcast_ss(q0 + d);
        a00 = _mm256_fmadd_ps(x, k0, a00); a01 = _mm256_fmadd_ps(x, k1, a01);
        x = _mm256_broadcast_ss(q1 + d);
        a10 = _mm256_fmadd_ps(x, k0, a10); a11 = _mm256_fmadd_ps(x, k1, a11);
        x = _mm256_broadcast_ss(q2 + d);
        a20 = _mm256_fmadd_ps(x, k0, a20); a21 = _mm256_fmadd_ps(x, k1, a21);
        k0 = load8(row + bs); k1 = load8(row + bs + 8);
        x = _mm256_broadcast_ss(q0 + d + 1);
        b00 = _mm256_fmadd_ps(x, k0, b00); b01 = _mm256_fmadd_ps(x, k1, b01);
        x = _mm256_broadcast_ss(q1 + d + 1);
        b10 = _mm256_fmadd_ps(x, k0, b10); b11 = _mm256_fmadd_ps(x, k1, b11);
        x = _mm256_broadcast_ss(q2 + d + 1);
        b20 = _mm256_fmadd_ps(x, k0, b20); b21 = _mm256_fmadd_ps(x, k1, b21);
      }
      float tmp[3][16];
      _mm256_storeu_ps(tmp[0], _mm256_add_ps(a00, b00)); _mm256_storeu_ps(tmp[0] + 8, _mm256_add_ps(a01, b01));
      _mm256_storeu_ps(tmp[1], _mm256_add_ps(a10, b10)); _mm256_storeu_ps(tmp[1] + 8, _mm256_add_ps(a11, b11));
      _mm256_storeu_ps(tmp[2], _mm256_add_ps(a20, b20)); _mm256_storeu_ps(tmp[2] + 8, _mm256_add_ps(a21, b21));
      for (int64_t g = 0; g < gn; ++g) std::copy(tmp[g] + off, tmp[g] + off + n, s + (g0 + g) * ld);
    }
    return;
  }
#endif
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = 0; t < n; ++t) {
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc = madd(q[g * D + d], to_float(kt[d * bs + off + t]), acc);
      s[g * ld + t] = acc;
    }
}

// p[t] = exp(p[t] - m) in place for t < n.
inline void exp_shift(float* p, int64_t n, float m) {
  int64_t t = 0;
#ifdef CONVEYOR_SIMD_AVX512
  const __m512 mz = _mm512_set1_ps(m);
  for (; t < n; t += 16) {  // the tail through masked lanes: same code path for every lane
    const __mmask16 k = first_lanes(n - t);
    _mm512_mask_storeu_ps(p + t, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + t), mz)));
  }
  return;
#elif defined(CONVEYOR_SIMD_AVX2)
  __m256 mv = _mm256_set1_ps(m);
  for (; t + 8 <= n; t += 8) _mm256_storeu_ps(p + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), mv)));
  if (t < n) {  // tail through a padded copy: same code path for every lane, no scalar expf
    float tmp[8] = {0};
    std::copy(p + t, p + n, tmp);
    _mm256_storeu_ps(tmp, exp8(_mm256_sub_ps(_mm256_loadu_ps(tmp), mv)));
    std::copy(tmp, tmp + (n - t), p + t);
    t = n;
  }
#endif
  for (; t < n; ++t) p[t] = std::exp(p[t] - m);
}

#ifdef CONVEYOR_SIMD_AVX512
// o[g] += sum_t p[g][t] * v[t] for up to three queries of the group at once over J * 16 floats of
// the head: each V load serves all of them, 3 * J independent chains.
template <int J, typename T>
inline void accumulate16(float* o, const float* p, const T* v, int64_t stride, int64_t n, int64_t gn,
                         int64_t D, int64_t ld) {
  const float* pg[3] = {p, p + std::min<int64_t>(1, gn - 1) * ld, p + (gn - 1) * ld};
  __m512 acc[3][J];
#pragma GCC unroll 3
  for (int g = 0; g < 3; ++g)
    for (int j = 0; j < J; ++j) acc[g][j] = _mm512_loadu_ps(o + std::min<int64_t>(g, gn - 1) * D + 16 * j);
  for (int64_t t = 0; t < n; ++t) {
    const T* vt = v + t * stride;
    __m512 vj[J];
    for (int j = 0; j < J; ++j) vj[j] = load16(vt + 16 * j);
#pragma GCC unroll 3
    for (int g = 0; g < 3; ++g) {
      const __m512 pt = _mm512_set1_ps(pg[g][t]);
      for (int j = 0; j < J; ++j) acc[g][j] = _mm512_fmadd_ps(pt, vj[j], acc[g][j]);
    }
  }
#pragma GCC unroll 3
  for (int g = 0; g < 3; ++g) {
    if (g >= gn) break;  // a repeated query's lanes are dropped
    for (int j = 0; j < J; ++j) _mm512_storeu_ps(o + g * D + 16 * j, acc[g][j]);
  }
}
#endif

// o[g] += sum_t p[g][t] * v[t] over the block's n tokens. Up to 64 floats of o[g] stay in registers
// while t runs: eight independent chains, and o is loaded and stored once per block.
template <typename T>
inline void accumulate(float* o, const float* p, const T* v, int64_t stride, int64_t n, int64_t G,
                       int64_t D, int64_t ld) {
#ifdef CONVEYOR_SIMD_AVX512
  if (D % 16 == 0) {
    for (int64_t g0 = 0; g0 < G; g0 += 3) {
      const int64_t gn = std::min<int64_t>(3, G - g0);
      int64_t d = 0;
      for (; d + 64 <= D; d += 64) accumulate16<4>(o + g0 * D + d, p + g0 * ld, v + d, stride, n, gn, D, ld);
      for (; d < D; d += 16) accumulate16<1>(o + g0 * D + d, p + g0 * ld, v + d, stride, n, gn, D, ld);
    }
    return;
  }
#endif
  for (int64_t g = 0; g < G; ++g) {
    float* og = o + g * D;
    const float* pg = p + g * ld;
    int64_t d = 0;
#ifdef CONVEYOR_SIMD_AVX2
    for (; d + 64 <= D; d += 64) {
      __m256 acc[8];
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_loadu_ps(og + d + 8 * j);
      for (int64_t t = 0; t < n; ++t) {
        const __m256 pt = _mm256_set1_ps(pg[t]);
        const T* vt = v + t * stride + d;
        for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(pt, load8(vt + 8 * j), acc[j]);
      }
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(og + d + 8 * j, acc[j]);
    }
    for (; d + 8 <= D; d += 8) {
      __m256 acc = _mm256_loadu_ps(og + d);
      for (int64_t t = 0; t < n; ++t)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(pg[t]), load8(v + t * stride + d), acc);
      _mm256_storeu_ps(og + d, acc);
    }
#endif
    for (; d < D; ++d) {
      float acc = og[d];
      for (int64_t t = 0; t < n; ++t) acc = madd(pg[t], to_float(v[t * stride + d]), acc);
      og[d] = acc;
    }
  }
}

inline float max_of(const float* p, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
#ifdef CONVEYOR_SIMD_AVX512
  __m512 mz = _mm512_set1_ps(m);
  for (; t < n; t += 16) mz = _mm512_max_ps(mz, _mm512_mask_loadu_ps(_mm512_set1_ps(m), first_lanes(n - t), p + t));
  return hmax16(mz);
#elif defined(CONVEYOR_SIMD_AVX2)
  if (n >= 8) {
    __m256 mv = _mm256_loadu_ps(p);
    for (t = 8; t + 8 <= n; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + t));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    m = _mm_cvtss_f32(h);
  }
#endif
  for (; t < n; ++t) m = std::max(m, p[t]);
  return m;
}

inline float sum_of(const float* p, int64_t n) {
  float acc = 0.f;
  int64_t t = 0;
#ifdef CONVEYOR_SIMD_AVX512
  __m512 az = _mm512_setzero_ps();
  for (; t < n; t += 16) az = _mm512_add_ps(az, _mm512_maskz_loadu_ps(first_lanes(n - t), p + t));
  return hsum16(az);
#elif defined(CONVEYOR_SIMD_AVX2)
  __m256 a = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) a = _mm256_add_ps(a, _mm256_loadu_ps(p + t));
  acc = hsum8(a);
#endif
  for (; t < n; ++t) acc += p[t];
  return acc;
}

// One partition of one row: positions [lo, hi). slot < 0: the row's only partition, written to the
// output normalised; else its index into the partial results that the reduction combines, and
// split the row's index among the rows of several partitions.
struct Task {
  int64_t row, lo, hi, slot, split;
};

// Row r's output from its `parts` partitions at slots s0.. (max m, sum l, unnormalised output o of
// each head), combined in partition order: sum_p w_p o_p / sum_p w_p l_p, w_p = exp(m_p - max m).
void reduce_row(const float* part_out, const float* part_max, const float* part_sum, int64_t s0, int64_t parts,
                int64_t H, int64_t D, float* dst) {
  std::vector<float> w(parts);
  for (int64_t i = 0; i < H; ++i) {
    float m = -std::numeric_limits<float>::infinity(), total = 0.f;
    for (int64_t p = 0; p < parts; ++p) m = std::max(m, part_max[(s0 + p) * H + i]);
    for (int64_t p = 0; p < parts; ++p) {
      w[p] = std::exp(part_max[(s0 + p) * H + i] - m);
      total += w[p] * part_sum[(s0 + p) * H + i];
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.f;
      for (int64_t p = 0; p < parts; ++p) acc += w[p] * part_out[((s0 + p) * H + i) * D + d];
      dst[i * D + d] = acc * inv;
    }
  }
}

}  // namespace

// q, out [rows, heads, D] (rows may be strided); caches [blocks, kv, bs, D] (K's last two dims hold [D, bs]); tables [rows, width] int32; context [rows] int32.
// Row r attends to positions [max(0, ctx - window), ctx) (window < 0: no window), in partitions of
// `partition` tokens.
// T: the caches' element, float or bf16_bits (kv_load.h); paged_decode below checks and dispatches.
template <typename T>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
            const at::Tensor& context, double scale, int64_t window, int64_t partition, at::Tensor& out) {
  TORCH_CHECK(tables.scalar_type() == at::kInt && tables.is_contiguous() && tables.dim() == 2, "tables: int32 [rows, width]");
  TORCH_CHECK(context.scalar_type() == at::kInt && context.is_contiguous(), "context: int32 [rows]");
  TORCH_CHECK(partition > 0, "partition: tokens per partition, > 0");
  const int64_t rows = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KV = k_cache.size(1), bs = k_cache.size(2), nblocks = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == D && H % KV == 0 && tables.size(0) == rows && context.numel() == rows, "shape mismatch");
  const int64_t G = H / KV, width = tables.size(1), head_stride = bs * D, block_stride = KV * bs * D;
  const float* qp = q.data_ptr<float>();
  const int64_t q_row = q.stride(0), out_row = out.stride(0);
  const T* kp = static_cast<const T*>(k_cache.data_ptr());
  const T* vp = static_cast<const T*>(v_cache.data_ptr());
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int32_t* cp = context.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // Checked before the parallel region: an exception thrown inside it would end the process.
  std::vector<Task> tasks;
  std::vector<int64_t> first_slot;  // of each row of several partitions, and a last entry: the slot count
  int64_t slots = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ctx = cp[r];
    TORCH_CHECK(ctx >= 0 && ctx <= width * bs, "context longer than the block table");
    for (int64_t b = 0; b * bs < ctx; ++b)
      TORCH_CHECK(tp[r * width + b] >= 0 && tp[r * width + b] < nblocks, "block id out of range");
    const int64_t first = window >= 0 ? std::max<int64_t>(0, ctx - window) : 0;
    if (ctx - first <= partition) {
      tasks.push_back({r, first, ctx, -1, -1});
      continue;
    }
    const int64_t split = static_cast<int64_t>(first_slot.size());
    first_slot.push_back(slots);
    for (int64_t lo = first; lo < ctx; lo += partition)
      tasks.push_back({r, lo, std::min(ctx, lo + partition), slots++, split});
  }
  first_slot.push_back(slots);
  const int64_t num_split = static_cast<int64_t>(first_slot.size()) - 1;
  // Longest first: the short tasks left at the end even out the threads' finishing times. The
  // order changes only which thread computes a task, never what it computes.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.hi - a.lo > b.hi - b.lo; });
  // Kept between calls (grown, never shrunk): a fresh buffer of this size is a new mapping, page
  // faults and an munmap on every call. Every value read is written first in this call.
  thread_local std::vector<float> part_out, part_max, part_sum;
  if (static_cast<int64_t>(part_out.size()) < slots * H * D) part_out.resize(slots * H * D);
  if (static_cast<int64_t>(part_max.size()) < slots * H) part_max.resize(slots * H), part_sum.resize(slots * H);
  // Pointers, not the names: inside the parallel region a thread_local name is that thread's own.
  float *pout = part_out.data(), *pmax = part_max.data(), *psum = part_sum.data();
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  std::atomic<int64_t> next{0};
  // Partitions still to compute per split row: whichever thread finishes the last one reduces the
  // row, inside the same parallel region (a second region costs a wake-up of every thread).
  std::unique_ptr<std::atomic<int64_t>[]> pending(new std::atomic<int64_t>[num_split]);
  for (int64_t k = 0; k < num_split; ++k) pending[k].store(first_slot[k + 1] - first_slot[k]);

  at::parallel_for(0, std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_tasks)), 1,
                   [&](int64_t, int64_t) {
    std::vector<float> qs(H * D), o(H * D), s(H * std::min(partition, width * bs));
    for (int64_t t; (t = next.fetch_add(1)) < num_tasks;) {
      const Task task = tasks[t];
      const int64_t r = task.row, n_ctx = task.hi - task.lo;
      // Scale folded into the queries once instead of into every score.
      for (int64_t i = 0; i < H * D; ++i) qs[i] = qp[r * q_row + i] * fscale;
      std::fill(o.begin(), o.end(), 0.f);
      for (int64_t pos = task.lo; pos < task.hi;) {  // pass 1: scores, s[(kv head * G + g) * n_ctx + pos - lo]
        const int64_t b = pos / bs, off = pos % bs, n = std::min(bs - off, task.hi - pos);
        const T* kb = kp + tp[r * width + b] * block_stride;
        for (int64_t h = 0; h < KV; ++h)
          score_block(qs.data() + h * G * D, kb + h * head_stride, bs, off, n, G, D, n_ctx,
                      s.data() + h * G * n_ctx + (pos - task.lo));
        pos += n;
      }
      for (int64_t i = 0; i < H; ++i) {  // softmax over the partition, in place: s becomes p
        float* si = s.data() + i * n_ctx;
        const float m = max_of(si, n_ctx);
        exp_shift(si, n_ctx, m);
        const float sum = sum_of(si, n_ctx);
        if (task.slot >= 0) {  // kept unnormalised: the reduction rescales by the row's max
          pmax[task.slot * H + i] = m;
          psum[task.slot * H + i] = sum;
          continue;
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
        for (int64_t j = 0; j < n_ctx; ++j) si[j] *= inv;
      }
      for (int64_t pos = task.lo; pos < task.hi;) {  // pass 2: o = p @ V
        const int64_t b = pos / bs, off = pos % bs, n = std::min(bs - off, task.hi - pos);
        const T* vb = vp + tp[r * width + b] * block_stride + off * D;
        for (int64_t h = 0; h < KV; ++h)
          accumulate(o.data() + h * G * D, s.data() + h * G * n_ctx + (pos - task.lo), vb + h * head_stride, D, n,
                     G, D, n_ctx);
        pos += n;
      }
      if (task.slot < 0) {
        std::copy(o.begin(), o.end(), op + r * out_row);
        continue;
      }
      std::copy(o.begin(), o.end(), pout + task.slot * H * D);
      // acq_rel: the reducing thread sees the partitions the other threads wrote.
      if (pending[task.split].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        const int64_t s0 = first_slot[task.split];
        reduce_row(pout, pmax, psum, s0, first_slot[task.split + 1] - s0, H, D, op + r * out_row);
      }
    }
  });
}

// Whether each of t's rows [heads, D] is one contiguous run of floats (rows themselves may be
// strided: q is a view into the fused q|k projection, out may be rows of a larger buffer).
// A dimension of size 1 may carry any stride (torch leaves it free), as is_contiguous allows.
bool rows_packed(const at::Tensor& t) {
  return t.dim() == 3 && t.scalar_type() == at::kFloat && t.device().is_cpu() &&
         (t.size(2) <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == t.size(2)) &&
         (t.size(0) <= 1 || t.stride(0) >= t.size(1) * t.size(2));
}

at::Tensor paged_decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor tables,
                        at::Tensor context, double scale, int64_t window, int64_t partition,
                        std::optional<at::Tensor> out_arg) {
  TORCH_CHECK(rows_packed(q), "q: fp32 [rows, heads, D], each row's heads contiguous");
  const auto kind = k_cache.scalar_type();
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && (kind == at::kFloat || kind == at::kBFloat16) &&
                  v_cache.scalar_type() == kind && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "caches: contiguous fp32 or bf16 (both the same) [blocks, kv_heads, block_size, D]");
  at::Tensor out = out_arg.has_value() ? *out_arg : at::empty(q.sizes(), q.options());
  TORCH_CHECK(rows_packed(out) && out.sizes() == q.sizes(), "out: fp32 of q's shape, each row's heads contiguous");
  if (kind == at::kBFloat16) decode<bf16_bits>(q, k_cache, v_cache, tables, context, scale, window, partition, out);
  else decode<float>(q, k_cache, v_cache, tables, context, scale, window, partition, out);
  return out;
}

// Rows per decode task: 256 tokens, as vLLM's 512 halved for 2-16 CPU threads: a 768-token row is 3 tasks;
// smaller adds reductions, larger leaves threads idle on a few long rows (bench/decode_attention.py sweeps it).
constexpr int64_t kPartition = 256;

// paged_decode into `out`, at the default partition: the torch op (torch.ops.conveyor.paged_decode_into)
// that the model's C++ layer loop (engine/model/layer_loop.cpp, another extension) calls through the
// dispatcher.
void paged_decode_into(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor tables, at::Tensor context,
                       double scale, int64_t window, at::Tensor out) {
  paged_decode(q, k_cache, v_cache, tables, context, scale, window, kPartition, out);
}

TORCH_LIBRARY_FRAGMENT(CONVEYOR_OPS, m) {
  m.def("paged_decode_into(Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, Tensor context, float scale, "
        "int window, Tensor(a!) out) -> ()",
        &paged_decode_into);
}

// The widest vector paths this build compiled (it is built with -march=native for this CPU).
const char* simd() {
#if defined(CONVEYOR_SIMD_AVX512)
  return "avx512";
#elif defined(CONVEYOR_SIMD_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("simd", &simd, "the widest SIMD paths compiled in: avx512, avx2 or scalar");
  m.def("paged_decode", &paged_decode, "paged decode attention (fp32 queries, fp32 or bf16 cache; CPU)", py::arg("q"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("tables"), py::arg("context"), py::arg("scale"), py::arg("window"),
        py::arg("partition") = kPartition, py::arg("out") = py::none());
}
