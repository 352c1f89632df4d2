// AVX2 helpers for the CPU attention kernels (header-only, inline): exp and horizontal reductions
// over 8 float lanes. CONVEYOR_SIMD_AVX2 is defined when the compiler targets AVX2 + FMA.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CONVEYOR_SIMD_AVX2 1

namespace conveyor_simd {

// exp for 8 lanes (Cephes polynomial, ~2 ulp), for both attention kernels: scalar expf per score
// would cost as much as the rest of a kernel. Inputs are score - running max <= 0, and below -87 the result flushes to ~0.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  const float c[] = {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  for (float ci : c) y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(ci));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

inline float hmax8(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

inline float hsum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

}  // namespace conveyor_simd
#endif
