// The float16 KV cache mode (CudaBackend.kv_dtype = float16): attention over half K/V and
// the captured decode step's row write into a half cache. The kernels are attention.cu's
// and step.cu's with half storage; everything they compute is float32 (attention.cuh widens
// each K/V value as it is read), so a half cache halves the KV bytes stored and read, and
// adds only the rounding of K and V to half (relative 2^-11, docs/cuda.md states parity).
// A module of its own so attention.cu keeps compiling with NVRTC alone (no cuda_fp16.h).
#include "half.cuh"
#include "attention.cuh"
#include "kv_store.cuh"

KV_MODE_KERNELS(__half, attn_kv_f16, attn_kv_f16_pos, attn_kv_f16_slot, attn_vec_kv_f16_e2,
                attn_vec_kv_f16_e2_pos, attn_vec_kv_f16_e2_slot, attn_vec_kv_f16_e4,
                attn_vec_kv_f16_e4_pos, attn_vec_kv_f16_e4_slot, attn_vec_kv_f16_e8,
                attn_vec_kv_f16_e8_pos, attn_vec_kv_f16_e8_slot, kv_store_f16,
                rope_kv_f16)  // see kv_store.cuh
