// The q4 products' inner loops (q4_decode.cpp), compiled twice: for AVX2 in q4_decode.cpp, and with
// AVX-512 VNNI in q4_vnni.cpp, where one vpdpbusd replaces maddubs + madd. Both compute every block's
// integer sums exactly, then convert and accumulate them in the same order, so the two give the same
// bits (tests/unit/test_fused_decode.py) and a record replays the same on a machine with either.
// Self-contained (no ATen): the VNNI copy is compiled under a target pragma, and nothing shared with
// other files may be.
//
// Weight layout (q4_types.h): output rows in groups of 8, each 32-bit lane of a vector one row of the
// group. For a group and block b the vector for inputs 4c..4c+3 of the block holds those four codes of
// each of the 8 rows; the activation's four codes are broadcast to every lane. So a block's 8 integer
// sums (one per row) build up lane by lane with no horizontal reduction, and one float multiply-add per
// block scales all 8: y[r][j] = Σ_b float(I_rjb)·(d_jb·a_rb) + Σ_b m_jb·(a_rb·Σp_rb), each sum in block
// order, whatever the batch or the thread.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "q4_types.h"

namespace PROCTOR_DOT_NAMESPACE {

using proctor_q4::Activations;
using proctor_q4::kBlock;
using proctor_q4::kGroup;

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Σ over the 32 inputs of one block of the 8 rows' q4 codes (`quads`: the 8 vectors of unpacked codes)
// times one activation row's codes p: 8 exact int32 sums.
inline __m256i q4_block_sums(const __m256i* quads, const int8_t* p) {
#ifdef PROCTOR_VNNI
  __m256i sums = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) sums = _mm256_dpbusd_epi32(sums, quads[c], broadcast4(p + 4 * c));
  return sums;
#else
  // Pairs of u4·s8 products summed in int16: at most 8 · 2 · 15 · 127 = 30480, no overflow.
  __m256i pairs = _mm256_maddubs_epi16(quads[0], broadcast4(p));
  for (int c = 1; c < 8; ++c) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(quads[c], broadcast4(p + 4 * c)));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

// The same for q8 (signed) codes, in both copies: |w| · sign(p, w) keeps maddubs's first operand
// unsigned; a pair can reach 2·127·127, so the pairs widen to int32 for every four inputs.
inline __m256i q8_block_sums(const __m256i* codes, const int8_t* p) {
  __m256i sums = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i pc = broadcast4(p + 4 * c);
    sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(codes[c], codes[c]),
                                                                         _mm256_sign_epi8(pc, codes[c])),
                                                    _mm256_set1_epi16(1)));
  }
  return sums;
}

// One group of 8 weight rows (`group`: its bytes) times R activation rows from r0: out[t·n + 0..7].
template <int R, bool Q4>
inline void group_tile(const uint8_t* group, const Activations& x, int64_t r0, float* out, int64_t n) {
  const int64_t nb = x.blocks;
  const uint16_t* d = reinterpret_cast<const uint16_t*>(group);  // [nb][8]
  const uint16_t* m = d + nb * kGroup;                              // [nb][8], Q4_1 only
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(Q4 ? m + nb * kGroup : d + nb * kGroup);
  const __m256i low_nibbles = _mm256_set1_epi8(0x0F);
  __m256 acc[R], minimum_terms[R];
  for (int t = 0; t < R; ++t) acc[t] = minimum_terms[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i quads[8];
    if constexpr (Q4) {
      const uint8_t* block = codes + b * 128;
      for (int c = 0; c < 4; ++c) {
        const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * c));
        quads[c] = _mm256_and_si256(packed, low_nibbles);
        quads[c + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
      }
    } else {
      const uint8_t* block = codes + b * 256;
      for (int c = 0; c < 8; ++c) quads[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * c));
    }
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + b * kGroup)));
    __m256 minimum;
    if constexpr (Q4) minimum = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + b * kGroup)));
    for (int t = 0; t < R; ++t) {
      const int64_t r = r0 + t;
      const int8_t* p = x.codes + (r * nb + b) * kBlock;
      const __m256i sums = Q4 ? q4_block_sums(quads, p) : q8_block_sums(quads, p);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(scale, _mm256_set1_ps(x.scale[r * nb + b])),
                               acc[t]);
      if constexpr (Q4) {
        minimum_terms[t] = _mm256_fmadd_ps(minimum, _mm256_set1_ps(x.scaled_sum[r * nb + b]), minimum_terms[t]);
      }
    }
  }
  for (int t = 0; t < R; ++t) _mm256_storeu_ps(out + t * n, _mm256_add_ps(acc[t], minimum_terms[t]));
}

// Group `g` of a weight matrix times every activation row, in tiles of up to 4 rows: y [rows, n].
template <bool Q4>
inline void group_rows(const uint8_t* group, const Activations& x, int64_t rows, float* y, int64_t n, int64_t g) {
  float* out = y + g * kGroup;
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) group_tile<4, Q4>(group, x, r, out + r * n, n);
  switch (rows - r) {
    case 3: group_tile<3, Q4>(group, x, r, out + r * n, n); break;
    case 2: group_tile<2, Q4>(group, x, r, out + r * n, n); break;
    case 1: group_tile<1, Q4>(group, x, r, out + r * n, n); break;
    default: break;
  }
}

inline void group_rows_any(bool q4, const uint8_t* group, const Activations& x, int64_t rows, float* y, int64_t n,
                           int64_t g) {
  if (q4) {
    group_rows<true>(group, x, rows, y, n, g);
  } else {
    group_rows<false>(group, x, rows, y, n, g);
  }
}

}  // namespace PROCTOR_DOT_NAMESPACE
