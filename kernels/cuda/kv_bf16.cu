// The bfloat16 KV cache mode (CudaBackend(kv_dtype="bfloat16")): attention over bfloat16
// K/V and the captured decode step's row write, as kv_f16.cu does for half. bfloat16 is the
// high 16 bits of a float32 (quants.cuh reads BF16 weights the same way): float32's range,
// 8 bits of mantissa (relative rounding 2^-9, four times half's). The host stores it as
// uint16 bit patterns (ops.BF16, bf16.cuh). No CUDA header is needed: widening is a shift.
#include "bf16.cuh"

#include "attention.cuh"
#include "kv_store.cuh"

KV_MODE_KERNELS(bf16_t, attn_kv_bf16, attn_kv_bf16_pos, attn_kv_bf16_slot, attn_vec_kv_bf16_e2,
                attn_vec_kv_bf16_e2_pos, attn_vec_kv_bf16_e2_slot, attn_vec_kv_bf16_e4,
                attn_vec_kv_bf16_e4_pos, attn_vec_kv_bf16_e4_slot, attn_vec_kv_bf16_e8,
                attn_vec_kv_bf16_e8_pos, attn_vec_kv_bf16_e8_slot, kv_store_bf16,
                rope_kv_bf16)  // see kv_store.cuh
