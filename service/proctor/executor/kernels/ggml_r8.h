// Q4_K weights repacked at load, eight rows interleaved (the type Q4_K_R8 here, as llama.cpp's --repack does for
// its one-row loop): the few-activation-row products read each 32-byte load as 4 bytes of each of eight rows (lane
// r: weight row r), so the eight rows' sums build up lane by lane with no horizontal sums, and each block's scales
// and minimums are unpacked once for the eight rows in vectors (ggml's get_scale_min_k4, lane-wise). Measured first
// as bench/q4k_repack_probe.cpp.
//
// The same bits as the file's layout: per weight row and block, S = Σ_j scale_j·Σ q·a over sub-block j and
// M = Σ_j minimum_j·Σ a (exact integers; the pairs' int16 sums of one sub-block reach at most 16·15·128 = 30,720),
// then acc = fma(S, d·x_d, acc) and acc = fma(M, −dmin·x_d, acc) in block order: what few_rows and the Blocks do
// (ggml_dot.h). More activation rows take the many-row loops, their Blocks read straight from the groups
// (ggml_r8_blocks.h, included first, as is ggml_dot.h).
//
// Layout of one group of eight rows, per 256-input block (1,152 bytes: eight Q4_K blocks' bytes, moved):
//   d[8], dmin[8]                  float16, row r at r
//   scale words[3][8]              the 12 bytes of scales and minimums of row r as three 32-bit words, word w at 8w + r
//   codes[4][8][8][4]              for 64-input chunk c and 4-byte step l: row r's file bytes 32c + 4l .. + 3
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ggml_blocks.h"

namespace proctor_ggml {

// The file's eight rows (row_bytes apart, `blocks` blocks each) as one group, block by block.
inline void pack_r8(const uint8_t* rows, int64_t row_bytes, int64_t blocks, uint8_t* out) {
  for (int64_t b = 0; b < blocks; ++b, out += kR8Bytes) {
    for (int r = 0; r < 8; ++r) {
      const uint8_t* block = rows + r * row_bytes + b * 144;
      std::memcpy(out + 2 * r, block, 2);
      std::memcpy(out + 16 + 2 * r, block + 2, 2);
      for (int w = 0; w < 3; ++w) std::memcpy(out + 32 + 4 * (8 * w + r), block + 4 + 4 * w, 4);
      for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 8; ++l) std::memcpy(out + 128 + 4 * (8 * (8 * c + l) + r), block + 16 + 32 * c + 4 * l, 4);
      }
    }
  }
}

// One group's outputs for activation rows 0 .. R − 1: y[t·width + r] for weight row r of the group.
template <int R>
inline void r8_rows(const uint8_t* group, int64_t blocks, const ActivationView& x, float* y, int64_t width) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, group += kR8Bytes) {
    _mm_prefetch(reinterpret_cast<const char*>(group) + 2 * kR8Bytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(group) + 2 * kR8Bytes + 576, _MM_HINT_T0);
    __m256i sc[8], mn[8];
    proctor_ggml_avx2::r8_scale_lanes(group, sc, mn);
    for (int j = 0; j < 8; ++j) sc[j] = proctor_ggml_avx2::int16_pair(sc[j]), mn[j] = proctor_ggml_avx2::int16_pair(mn[j]);
    __m256i s32[R], m32[R];
    for (int t = 0; t < R; ++t) s32[t] = m32[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // 64 inputs: sub-blocks 2c (low nibbles) and 2c + 1 (high)
      __m256i lo16[R], hi16[R];
      for (int t = 0; t < R; ++t) lo16[t] = hi16[t] = _mm256_setzero_si256();
      for (int l = 0; l < 8; ++l) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 128 + 32 * (8 * c + l)));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int t = 0; t < R; ++t) {
          const int8_t* a = x.codes + t * x.k + 256 * b + 64 * c + 4 * l;
          int32_t first, second;
          std::memcpy(&first, a, 4);
          std::memcpy(&second, a + 32, 4);
          lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(first)));
          hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(second)));
        }
      }
      for (int t = 0; t < R; ++t) {
        s32[t] = _mm256_add_epi32(s32[t], _mm256_add_epi32(_mm256_madd_epi16(lo16[t], sc[2 * c]),
                                                           _mm256_madd_epi16(hi16[t], sc[2 * c + 1])));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group)));
    const __m256 ndmin = _mm256_xor_ps(_mm256_set1_ps(-0.f),  // −dmin exactly, as the file layout's loops negate it
                                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 16))));
    for (int t = 0; t < R; ++t) {
      const int16_t* bsums = x.bsums + (t * x.per_row_blocks + b) * 16;
      for (int j = 0; j < 8; ++j) {  // minimum_j·(Σa of inputs 32j .. 32j + 15, and of 32j + 16 .. 32j + 31)
        int32_t pair;
        std::memcpy(&pair, bsums + 2 * j, 4);
        m32[t] = _mm256_add_epi32(m32[t], _mm256_madd_epi16(mn[j], _mm256_set1_epi32(pair)));
      }
      const __m256 xd = _mm256_set1_ps(x.d[t * x.per_row_blocks + b]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[t]), _mm256_mul_ps(d, xd), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m32[t]), _mm256_mul_ps(ndmin, xd), acc[t]);
    }
  }
  for (int t = 0; t < R; ++t) _mm256_storeu_ps(y + t * width, acc[t]);
}

}  // namespace proctor_ggml
