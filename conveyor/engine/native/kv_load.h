// Loads of K/V cache elements as fp32, for both CPU attention kernels. The cache holds fp32, or
// bfloat16 (--kv-cache-dtype bfloat16) as raw 16-bit words: a bf16 is the upper half of an fp32,
// so widening it is a shift and exact, and the kernels' arithmetic stays fp32 either way. Decode
// attention streams the whole cache every step; bf16 halves the bytes it reads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd_avx2.h"
#include "simd_avx512.h"

// The torch op namespace these sources register in (torch.ops.conveyor). A second build of them
// for another instruction set, loaded beside this one (the tests build the AVX2 and scalar paths on
// an AVX-512 machine), passes -DCONVEYOR_OPS=another: one name cannot be registered twice.
#ifndef CONVEYOR_OPS
#define CONVEYOR_OPS conveyor
#endif

namespace conveyor_kv {

using bf16_bits = uint16_t;  // at::BFloat16's storage, read without its class

inline float to_float(float x) { return x; }
inline float to_float(bf16_bits x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// acc + a * b for the scalar loops over cache elements, rounded once where the CPU has FMA (as the
// vector paths' FMA lanes), else rounded twice (a compiler cannot fuse without FMA). Spelled out
// because under GCC's default -ffp-contract=fast `acc += a * b` is fused or not at the compiler's
// choice, and it chooses per instantiation: with AVX-512 it vectorizes the fp32 loop's products
// unfused and fuses the bf16 loop's, and a bf16 cache then no longer reads as its fp32 widening.
inline float madd(float a, float b, float acc) {
#ifdef __FMA__
  return std::fma(a, b, acc);
#else
  return a * b + acc;
#endif
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
