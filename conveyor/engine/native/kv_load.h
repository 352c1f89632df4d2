// Loads of K/V cache elements as fp32, for both CPU attention kernels. The cache holds fp32, or
// bfloat16 (--kv-cache-dtype bfloat16) as raw 16-bit words: a bf16 is the upper half of an fp32,
// so widening it is a shift and exact, and the kernels' arithmetic stays fp32 either way. Decode
// attention streams the whole cache every step; bf16 halves the bytes it reads.
#pragma once

#include <cstdint>
#include <cstring>

#include "simd_avx2.h"
#include "simd_avx512.h"

namespace conveyor_kv {

using bf16_bits = uint16_t;  // at::BFloat16's storage, read without its class

inline float to_float(float x) { return x; }
inline float to_float(bf16_bits x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

#ifdef CONVEYOR_SIMD_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16_bits* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#ifdef CONVEYOR_SIMD_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16_bits* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

}  // namespace conveyor_kv
