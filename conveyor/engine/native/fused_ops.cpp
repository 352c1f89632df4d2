// The Llama forward's elementwise ops, fused (as vLLM's CPU build fuses them): one pass each
// instead of the several torch ops, temporaries and strided copies they take in torch.
//
// silu_and_mul: act = silu(gate) * up from the gate_up GEMM's output [rows, 2 * inter] (gate and
//   up are its two halves, so torch reads them as strided views). silu is torch's own formula,
//   x / (1 + exp(-x)), with the same exp torch's vectorised kernel calls (SLEEF's expf, 1.0 ulp),
//   rounded to float32 before the multiply as torch's two ops round it.
// rope: q and k together, out = x * cos + rotate_half(x) * sin, from the qkv GEMM's output (rows
//   strided) into a contiguous [rows, heads, head_dim] buffer, rounded as torch's mul_ + addcmul
//   round it: fma(x, cos, rotate_half(x) * sin), the sin product rounded first (addcmul is an FMA
//   in torch's vectorised kernel), so the result is the torch path's bit for bit. Built with
//   -ffp-contract=off so that the compiler fuses nothing else.
//
// Every element is computed by the same instructions wherever it sits in the row (a row's tail goes
// through the vector code in a padded buffer), and rows are independent: a row's result never
// depends on the batch around it. AVX-512 where the compiler has it (-march=native), AVX2 else,
// plain C++ on other CPUs.

// Only the torch headers used here: <torch/extension.h> takes ~30 s to parse per file.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include "fused_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#include <sleef.h>
#endif

namespace {

#if defined(__AVX512F__)
constexpr int64_t W = 16;
using vec = __m512;
inline vec load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec silu(vec x) {
  const vec one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(x, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}
#elif defined(__AVX2__)
constexpr int64_t W = 8;
using vec = __m256;
inline vec load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec silu(vec x) {
  const vec one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(x, _mm256_add_ps(one, Sleef_expf8_u10(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
#else
constexpr int64_t W = 1;
using vec = float;
inline vec load(const float* p) { return *p; }
inline void store(float* p, vec v) { *p = v; }
inline vec mul(vec a, vec b) { return a * b; }
inline vec fma(vec a, vec b, vec c) { return std::fma(a, b, c); }
inline vec silu(vec x) { return x / (1.0f + std::exp(-x)); }
#endif

// Rows per task: at least ~16k elements, so that a decode-sized call is not split into tasks
// smaller than the cost of waking the other thread.
int64_t grain(int64_t row_elems) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elems)); }

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.stride(1) == 1,
              name, " must be a float32 CPU matrix with contiguous rows");
}

void silu_mul_row(const float* g, const float* u, float* o, int64_t n) {
  int64_t j = 0;
  for (; j + W <= n; j += W) store(o + j, mul(silu(load(g + j)), load(u + j)));
  if (j < n) {  // the tail through the same vector code, zero-padded
    float gb[W] = {}, ub[W] = {}, ob[W];
    std::memcpy(gb, g + j, (n - j) * sizeof(float));
    std::memcpy(ub, u + j, (n - j) * sizeof(float));
    store(ob, mul(silu(load(gb)), load(ub)));
    std::memcpy(o + j, ob, (n - j) * sizeof(float));
  }
}

// out[j] = fma(x[j], c[j], x[j ^ half] * s[j]) over one head (s: sin, rotate_half's sign folded in).
void rope_head(const float* x, const float* c, const float* s, float* o, int64_t half) {
  int64_t j = 0;
  for (; j + W <= half; j += W) {
    const vec lo = load(x + j), hi = load(x + half + j);
    store(o + j, fma(lo, load(c + j), mul(hi, load(s + j))));
    store(o + half + j, fma(hi, load(c + half + j), mul(lo, load(s + half + j))));
  }
  for (; j < half; ++j) {  // scalar: the same roundings
    const float lo = x[j], hi = x[half + j];
    o[j] = std::fma(lo, c[j], hi * s[j]);
    o[half + j] = std::fma(hi, c[half + j], lo * s[half + j]);
  }
}

// Sum of squares of one row, in the order torch's CPU sum reduces a contiguous row of x.pow(2)
// (ATen/native/cpu/SumKernel.cpp, vectorized_inner_sum: `lanes` = the vector width that kernel
// sums in here, found at load by fused_ops.norm_lanes; 8 under torch 2.13 on this AVX-512 CPU,
// not the 16 its capability would suggest): lane-wise vector sums
// into 4 interleaved accumulators, cascaded every 16 vector groups (multi_row_sum), combined
// 0+1+2+3; then a scalar sum starting from the row's tail past the last whole vector, then the
// lanes in order. Every square is rounded before it is added (-ffp-contract=off), as torch
// materialises pow(2) first. The lane loops are independent float adds: any vectorisation by the
// compiler gives the same bits. The width is a template argument so that the compiler keeps the
// accumulators in vector registers (a run-time width left them in memory: ~3x slower).
template <int64_t lanes>
float sum_of_squares(const float* x, int64_t n) {
  constexpr int64_t kIlp = 4, kLevels = 4;
  const int64_t vectors = n / lanes, groups = vectors / kIlp;
  // CeilLog2(groups) / 4 is under 4 for any row shorter than 2^16 groups: torch's floor of 4 rules.
  int64_t ceil_log2 = 1;
  while (groups > 2 && (int64_t{1} << ceil_log2) < groups) ++ceil_log2;
  const int64_t power = std::max<int64_t>(4, ceil_log2 / kLevels), step = int64_t{1} << power;
  const int64_t mask = step - 1;
  float acc[kLevels][kIlp][lanes] = {};
  auto add_group = [&](int64_t g) {
    for (int64_t k = 0; k < kIlp; ++k) {
      const float* v = x + (g * kIlp + k) * lanes;
      for (int64_t l = 0; l < lanes; ++l) acc[0][k][l] += v[l] * v[l];
    }
  };
  int64_t i = 0;
  while (i + step <= groups) {
    for (int64_t j = 0; j < step; ++j, ++i) add_group(i);
    for (int64_t level = 1; level < kLevels; ++level) {
      for (int64_t k = 0; k < kIlp; ++k)
        for (int64_t l = 0; l < lanes; ++l) {
          acc[level][k][l] += acc[level - 1][k][l];
          acc[level - 1][k][l] = 0.0f;
        }
      if ((i & (mask << (level * power))) != 0) break;
    }
  }
  for (; i < groups; ++i) add_group(i);
  for (int64_t level = 1; level < kLevels; ++level)
    for (int64_t k = 0; k < kIlp; ++k)
      for (int64_t l = 0; l < lanes; ++l) acc[0][k][l] += acc[level][k][l];
  // row_sum: the vectors left over after the groups go into accumulator 0, then 0 += 1, 2, 3
  for (int64_t v = groups * kIlp; v < vectors; ++v)
    for (int64_t l = 0; l < lanes; ++l) acc[0][0][l] += x[v * lanes + l] * x[v * lanes + l];
  for (int64_t k = 1; k < kIlp; ++k)
    for (int64_t l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0.0f;
  for (int64_t j = vectors * lanes; j < n; ++j) total += x[j] * x[j];
  for (int64_t l = 0; l < lanes; ++l) total += acc[0][0][l];
  return total;
}

}  // namespace

// out = x * rsqrt(mean(x^2) + eps) * weight per row, rounded as F.rms_norm's ops round it on CPU:
// the sum above, / n, + eps, 1 / sqrt, then (x * r) * w, each rounded to float32.
void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t lanes, at::Tensor& out) {
  check_rows(x, "x");
  check_rows(out, "out");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(lanes == 8 || lanes == 16, "lanes must be 8 or 16 (torch's Vectorized<float>::size())");
  TORCH_CHECK(n >= lanes, "rows shorter than a vector take another path in torch's sum");
  TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
              weight.numel() == n, "weight must be a contiguous float32 CPU vector of x.size(1) elements");
  TORCH_CHECK(out.size(0) == rows && out.size(1) == n, "out must be the shape of x");
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  const float eps_f = static_cast<float>(eps), count = static_cast<float>(n);
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * xs;
      const float squares = lanes == 8 ? sum_of_squares<8>(row, n) : sum_of_squares<16>(row, n);
      const float inv = 1.0f / std::sqrt(squares / count + eps_f);
      float* dst = op + r * os;
      for (int64_t j = 0; j < n; ++j) dst[j] = row[j] * inv * wp[j];
    }
  });
}

void silu_and_mul(const at::Tensor& gate_up, at::Tensor& out) {
  check_rows(gate_up, "gate_up");
  check_rows(out, "out");
  const int64_t rows = gate_up.size(0), n = out.size(1);
  TORCH_CHECK(gate_up.size(1) == 2 * n && out.size(0) == rows, "out must be [rows, gate_up.size(1) / 2]");
  const float* in = gate_up.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t in_stride = gate_up.stride(0), out_stride = out.stride(0);
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = in + r * in_stride;
      silu_mul_row(g, g + n, dst + r * out_stride, n);
    }
  });
}

void rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads,
          at::Tensor& out) {
  check_rows(x, "x");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(out.device().is_cpu() && out.scalar_type() == at::kFloat && out.is_contiguous(),
              "out must be a contiguous float32 CPU tensor");
  const int64_t rows = x.size(0), hd = cos.size(1), half = hd / 2;
  TORCH_CHECK(hd % 2 == 0 && heads > 0 && x.size(1) >= heads * hd, "x must hold heads * head_dim columns");
  TORCH_CHECK(cos.size(0) == rows && sin.size(0) == rows && sin.size(1) == hd, "cos, sin: [rows, head_dim]");
  TORCH_CHECK(out.numel() == rows * heads * hd, "out must hold rows * heads * head_dim elements");
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0), cs = cos.stride(0), ss = sin.stride(0);
  at::parallel_for(0, rows, grain(heads * hd), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t h = 0; h < heads; ++h)
        rope_head(xp + r * xs + h * hd, cp + r * cs, sp + r * ss, op + (r * heads + h) * hd, half);
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("silu_and_mul", &silu_and_mul, "out = silu(gate) * up, gate_up = [gate | up] per row");
  m.def("rope", &rope, "out = x * cos + rotate_half(x) * sin for the first `heads` heads of x");
  m.def("rms_norm", &rms_norm, "out = x * rsqrt(mean(x^2) + eps) * weight per row, F.rms_norm's bits");
  bind_layer_loop(m);
}
