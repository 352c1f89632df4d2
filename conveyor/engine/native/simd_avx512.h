// AVX-512 helpers for the CPU attention kernels (header-only, inline): exp, horizontal reductions
// and tail masks over 16 float lanes. CONVEYOR_SIMD_AVX512 is defined when the compiler targets
// AVX-512F (the kernels are built with -march=native; a CPU without it keeps the AVX2 paths).
#pragma once

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define CONVEYOR_SIMD_AVX512 1

namespace conveyor_simd {

// exp for 16 lanes: exp8's Cephes polynomial, operation for operation (simd_avx2.h), so each lane
// gets the same bits as exp8 would give it.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
  __m512 fx = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f));
  fx = _mm512_roundscale_ps(fx, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
  const float c[] = {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  for (float ci : c) y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(ci));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

// Fixed-order tree reductions (the compiler's _mm512_reduce_* are the same tree, spelled out here
// so the order is this file's, not a library version's).
// The upper 8 lanes (AVX-512F only: the 32x8 extract needs DQ).
inline __m256 upper8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

inline float hsum16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), upper8(v));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

inline float hmax16(__m512 v) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), upper8(v));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
}

// Lanes [0, n) of 16 set, n in 0..16.
inline __mmask16 first_lanes(int64_t n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFFu : (1u << n) - 1u);
}

}  // namespace conveyor_simd
#endif
