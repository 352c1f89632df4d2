// A step's new keys and values into the paged cache on CPU, in one call for both (layout: see
// paged_decode.cpp; K is [head_dim, block_size] per block and head). torch does it in two
// index_put_ calls on permuted views, plus two conversions when the cache is bfloat16: at a
// decode step's ~64 tokens a layer, those ops' fixed costs are most of the write.
// bfloat16 rounding is c10::BFloat16's (round to nearest even), the one `Tensor.to` uses, so the
// cache holds the same bits either way.
// Only the torch headers used here: <torch/extension.h> takes ~30 s to parse per file.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <type_traits>

#include "kv_load.h"

namespace {

using conveyor_kv::bf16_bits;

inline float store_as(float x, float*) { return x; }
inline bf16_bits store_as(float x, bf16_bits*) { return c10::BFloat16(x).x; }

template <typename KvT>
void write(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache, const int64_t* slots) {
  const int64_t T = k.size(0), KV = k.size(1), D = k.size(2), bs = k_cache.size(2);
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  KvT* kc = static_cast<KvT*>(k_cache.data_ptr());
  KvT* vc = static_cast<KvT*>(v_cache.data_ptr());
  const int64_t k_row = k.stride(0), v_row = v.stride(0), k_head = k.stride(1), v_head = v.stride(1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t block = slots[t] / bs, off = slots[t] % bs;
    for (int64_t h = 0; h < KV; ++h) {
      const float* ks = kp + t * k_row + h * k_head;
      const float* vs = vp + t * v_row + h * v_head;
      KvT* kd = kc + (block * KV + h) * bs * D + off;  // column `off` of the [D, bs] block
      KvT* vd = vc + ((block * KV + h) * bs + off) * D;
      for (int64_t d = 0; d < D; ++d) kd[d * bs] = store_as(ks[d], kd);
      for (int64_t d = 0; d < D; ++d) vd[d] = store_as(vs[d], vd);
    }
  }
}

}  // namespace

// k, v [T, kv_heads, D] fp32 (rows may be strided: views into the fused qkv projection; each
// head's D values contiguous); caches [blocks, kv_heads, block_size, D], fp32 or bf16 (both the
// same); slots [T] int64, token t's cache slot (block * block_size + offset).
void write_kv(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots) {
  TORCH_CHECK(k.dim() == 3 && k.scalar_type() == at::kFloat && k.stride(2) == 1 && v.sizes() == k.sizes() &&
                  v.scalar_type() == at::kFloat && v.stride(2) == 1,
              "k, v: fp32 [tokens, kv_heads, D], each head's D values contiguous");
  const auto kind = k_cache.scalar_type();
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && (kind == at::kFloat || kind == at::kBFloat16) &&
                  v_cache.scalar_type() == kind && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(1) == k.size(1) && k_cache.size(3) == k.size(2),
              "caches: contiguous fp32 or bf16 (both the same) [blocks, kv_heads, block_size, D] of k's heads and D");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == k.size(0),
              "slots: int64 [tokens]");
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t capacity = k_cache.size(0) * k_cache.size(2);
  for (int64_t t = 0; t < slots.numel(); ++t)  // before any write: a bad slot changes nothing
    TORCH_CHECK(sp[t] >= 0 && sp[t] < capacity, "slot ", sp[t], " out of range [0, ", capacity, ")");
  if (kind == at::kBFloat16) return write<bf16_bits>(k, v, k_cache, v_cache, sp);
  write<float>(k, v, k_cache, v_cache, sp);
}

// A torch op (torch.ops.conveyor.write_kv), compiled into paged_decode.cpp's extension.
TORCH_LIBRARY_FRAGMENT(CONVEYOR_OPS, m) {
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots) -> ()", &write_kv);
}
