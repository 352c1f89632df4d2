// The sampler's greedy pick, fused: per row of float32 logits, the argmax (the first index of the
// largest value, as torch.argmax) and its logprob, -log(sum(exp(x - max))), without writing a
// log_softmax of the whole vocabulary. torch.argmax over a [64, 49152] batch is a scalar loop
// (~1 ms on 2 threads) and log_softmax another ~1 ms; here a row is read three times from L2.
//
// Each row is done by one thread, in one fixed order, so its result never depends on the other
// rows of the batch (what the sampler promises). A row holding a NaN gives its first NaN's index
// and a NaN logprob, as torch.argmax and log_softmax would.

// Only the torch headers used here: <torch/extension.h> takes ~30 s to parse per file.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <limits>
#include <tuple>

#if defined(__AVX2__)
#include <immintrin.h>
#include <sleef.h>
#endif

namespace {

float row_max(const float* x, int64_t n) {
  int64_t j = 0;
  float m = -std::numeric_limits<float>::infinity();
#if defined(__AVX2__)
  __m256 acc = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

int64_t first_equal(const float* x, int64_t n, float m) {
  int64_t j = 0;
#if defined(__AVX2__)
  const __m256 mv = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), mv, _CMP_EQ_OQ));
    if (mask) return j + __builtin_ctz(mask);
  }
#endif
  for (; j < n; ++j)
    if (x[j] == m) return j;
  return -1;
}

float sum_exp(const float* x, int64_t n, float m) {
  int64_t j = 0;
  float s = 0.0f;
#if defined(__AVX2__)
  const __m256 mv = _mm256_set1_ps(m);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    a0 = _mm256_add_ps(a0, Sleef_expf8_u10(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    a1 = _mm256_add_ps(a1, Sleef_expf8_u10(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), mv)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(a0, a1));
  for (float v : lanes) s += v;
#endif
  for (; j < n; ++j) s += std::exp(x[j] - m);
  return s;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> greedy(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.device().is_cpu(),
              "greedy takes [rows, vocab] float32 logits on CPU");
  auto x = logits.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  auto index = at::empty({rows}, at::kLong);
  auto logprob = at::empty({rows}, at::kFloat);
  const float* data = x.data_ptr<float>();
  int64_t* index_out = index.data_ptr<int64_t>();
  float* logprob_out = logprob.data_ptr<float>();
  // torch's own thread pool; a batch of one row runs inline, with no parallel region to wake.
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = data + r * vocab;
      const float m = row_max(row, vocab);
      const float s = sum_exp(row, vocab, m);
      if (std::isnan(s)) {  // a NaN in the row (max skips NaNs, the sum does not), or an infinity
        int64_t j = 0;
        while (j < vocab && !std::isnan(row[j])) ++j;
        index_out[r] = j < vocab ? j : first_equal(row, vocab, m);
        logprob_out[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      index_out[r] = first_equal(row, vocab, m);
      logprob_out[r] = -std::log(s);
    }
  });
  return {index, logprob};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("greedy", &greedy, "per row: argmax and its logprob (float32 logits on CPU)");
}
