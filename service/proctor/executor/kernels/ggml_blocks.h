// GGUF's block types as llama.cpp stores them (ggml-common.h), unpacked for the integer products of
// ggml_linear.cpp, and the activations quantized per block as llama.cpp quantizes them for each type
// (its vec_dot_type): Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, float16 for
// F16, bfloat16 for BF16. A block's product is an exact integer sum of codes times codes, scaled in
// float in one fixed order, so a row's result is the same bits alone or in any batch, on any thread.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace proctor_ggml {

// ggml_type numbers (ggml.h).
enum Type : int64_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

// What the activations are quantized to for a weight of each type.
enum class Activation { q8_0, q8_1, q8_k, f16, bf16, f32 };

struct Layout {
  int64_t elements;  // weights per block
  int64_t bytes;     // bytes per block
  Activation activation;
};

inline bool layout_of(int64_t type, Layout& out) {
  switch (type) {
    case F32: out = {1, 4, Activation::f32}; return true;
    case F16: out = {1, 2, Activation::f16}; return true;
    case BF16: out = {1, 2, Activation::bf16}; return true;
    case Q4_0: out = {32, 18, Activation::q8_0}; return true;
    case Q4_1: out = {32, 20, Activation::q8_1}; return true;
    case Q5_0: out = {32, 22, Activation::q8_0}; return true;
    case Q5_1: out = {32, 24, Activation::q8_1}; return true;
    case Q8_0: out = {32, 34, Activation::q8_0}; return true;
    case Q4_K: out = {256, 144, Activation::q8_k}; return true;
    case Q5_K: out = {256, 176, Activation::q8_k}; return true;
    case Q6_K: out = {256, 210, Activation::q8_k}; return true;
    default: return false;
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

inline uint16_t half_bits(float value) { return _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT); }

inline float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

// ggml's GGML_FP32_TO_BF16: round to nearest even (a NaN stays a quiet NaN).
inline uint16_t bf16_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

// Round to nearest, ties to even (llama.cpp's nearest_int and its SIMD quantizers).
inline int nearest(float x) { return static_cast<int>(std::nearbyint(x)); }

// One row of activations in the type a weight's blocks take (k inputs).
struct ActivationRow {
  // q8_0 / q8_1: per 32 inputs; q8_k: per 256.
  int8_t* codes;
  float* d;         // the scale per block (q8_0/q8_1: float16-rounded, as llama.cpp stores it)
  float* s;         // q8_1: d·Σcodes per block (float16-rounded)
  int16_t* sums;    // q8_0 / q8_1: Σcodes per block, exact (the offset of unsigned weight codes)
  int16_t* bsums;   // q8_k: Σcodes per 16 inputs
  float* values;    // f16 / bf16 / f32: the rounded activations as float
};

inline void quantize_q8_0(const float* x, int64_t k, ActivationRow& row, bool with_sum) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* v = x + 32 * b;
    float peak = 0.f;
    for (int i = 0; i < 32; ++i) peak = std::fmax(peak, std::fabs(v[i]));
    const float d = peak / 127.f, inverse = d != 0.f ? 1.f / d : 0.f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = nearest(v[i] * inverse);
      row.codes[32 * b + i] = static_cast<int8_t>(q);
      sum += q;
    }
    row.d[b] = _cvtsh_ss(half_bits(d));
    row.sums[b] = static_cast<int16_t>(sum);
    if (with_sum) row.s[b] = _cvtsh_ss(half_bits(static_cast<float>(sum) * d));
  }
}

// ggml's quantize_row_q8_K_ref: scale −127/max by the largest magnitude's signed value, codes capped at 127.
inline void quantize_q8_k(const float* x, int64_t k, ActivationRow& row) {
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* v = x + 256 * b;
    int8_t* q = row.codes + 256 * b;
    float peak = 0.f, signed_peak = 0.f;
    for (int i = 0; i < 256; ++i) {
      if (std::fabs(v[i]) > peak) peak = std::fabs(v[i]), signed_peak = v[i];
    }
    if (peak == 0.f) {
      row.d[b] = 0.f;
      std::memset(q, 0, 256);
      for (int j = 0; j < 16; ++j) row.bsums[16 * b + j] = 0;
      continue;
    }
    const float iscale = -127.f / signed_peak;
    for (int i = 0; i < 256; ++i) q[i] = static_cast<int8_t>(std::min(127, nearest(iscale * v[i])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[16 * j + i];
      row.bsums[16 * b + j] = static_cast<int16_t>(sum);
    }
    row.d[b] = 1.f / iscale;
  }
}

// Activations in one weight type's form (ggml_blocks.h), row r's values at r·k (codes, values) and
// r·per_row_blocks (scales, sums; bsums 16 a block).
struct ActivationView {
  const int8_t* codes;
  const float* d;
  const float* s;
  const int16_t* sums;
  const int16_t* bsums;
  const float* values;
  int64_t k;
  int64_t per_row_blocks;
};

constexpr int64_t kGroupRows = 8;               // weight rows ggml_dot.h's group() takes: the lanes of 256 bits
constexpr int64_t kWideRows = 2 * kGroupRows;  // and ggml_wide.h's wide_group(): two groups in 512 bits

constexpr int64_t Q4_K_R8 = 112;  // not a ggml type: Q4_K weights eight rows to a group (ggml_r8.h, repack_q4_k)
constexpr int64_t kR8Bytes = 8 * 144;  // a group's bytes per 256-input block

// ggml_dot.h's rows(), and ggml_wide.h's wide_group(), compiled with AVX-512 VNNI (ggml_vnni.cpp): the same
// bits as the AVX2 copy's rows() and group().
void rows_vnni(int64_t count, int64_t type, const uint8_t* w, int64_t k, const ActivationView& x, int64_t r0,
               float* out);
void wide_group_vnni(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x,
                     int64_t rows, float* y, int64_t width);
// wide_group_vnni(Q4_K, …) on sixteen rows grouped as ggml_r8.h lays them out (ggml_r8_blocks.h): the same bits.
void wide_groups_vnni(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x, int64_t rows,
                      float* y, int64_t width);

}  // namespace proctor_ggml
