// The gguf products' inner loops (ggml_linear.cpp): one weight row's blocks, unpacked into vectors once
// per block, times a tile of activation rows. Compiled twice: for AVX2 in ggml_linear.cpp, and in
// ggml_vnni.cpp with AVX-512 VNNI on 256-bit vectors, where vpdpbusd replaces maddubs + madd(1) and
// vpdpwssd replaces madd(scale) + add. Each computes the same int32 lanes (no pair can saturate: at most
// 2·128·127), then the same float operations in the same order: the same bits (tests/unit/test_gguf_linear.py).
// Self-contained (no ATen): the VNNI copy is compiled under a target pragma, and nothing shared with
// other files may be.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "ggml_blocks.h"

namespace PROCTOR_GGML_NAMESPACE {

using namespace proctor_ggml;


inline float sum8(__m256 v) {  // the 8 lanes in one fixed order
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

// A K-quant block (ggml-common.h: Q4_K d, dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of
// nibbles; Q5_K the same with 32 bytes of fifth bits before the nibbles; Q6_K 128 bytes of low nibbles,
// 64 of high bit pairs, 16 int8 scales, d) as 8 vectors of 32 unsigned codes (Q4_K 0..15, Q5_K 0..31,
// Q6_K q + 32 in 0..63), its scales as int16 lanes per vector (the low 128 bits the first 16 inputs'
// scale, the high the next 16's) and, for Q4_K/Q5_K, a minimum per 16 inputs:
// w = d·scale·code − dmin·minimum (Q6_K: d·scale·(code − 32)).
struct KVectors {
  __m256i codes[8], scales[8], minimums;  // minimums: 16 int16, min of inputs 16i..16i+15
  __m256i scales16;                       // Q6_K: its 16 scales as int16
  float d, dmin;
};

[[gnu::always_inline]] inline void unpack_k_vectors(int64_t type, const uint8_t* block, KVectors& out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03), low1 = _mm256_set1_epi8(0x01);
  if (type == Q6_K) {
    out.d = half_at(block + 208);
    out.dmin = 0.f;
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    out.scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    for (int n = 0; n < 2; ++n) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * n));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * n + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * n));
      auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), low2), 4); };
      out.codes[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(l0, low4), high(0));
      out.codes[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, low4), high(2));
      out.codes[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), high(4));
      out.codes[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), high(6));
    }
    for (int c = 0; c < 8; ++c) out.scales[c] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
    return;
  }
  out.d = half_at(block);
  out.dmin = half_at(block + 2);
  const bool five = type == Q5_K;
  const uint8_t* qs = five ? block + 48 : block + 16;
  // The 8 six-bit scales and minimums (ggml's get_scale_min_k4) unpacked in four 32-bit words, as llama.cpp does:
  // words 0-1 hold the scales' bytes, words 2-3 the minimums'.
  uint32_t packed[4];
  std::memcpy(packed, block + 4, 12);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4_words = 0x0f0f0f0f, low2_words = 0x03030303;
  packed[3] = ((packed[2] >> 4) & low4_words) | (((packed[1] >> 6) & low2_words) << 4);
  const uint32_t minimums_low = packed[1] & low6;
  packed[1] = (packed[2] & low4_words) | (((packed[0] >> 6) & low2_words) << 4);
  packed[2] = minimums_low;
  packed[0] &= low6;
  const __m128i bytes = _mm_set_epi32(static_cast<int32_t>(packed[3]), static_cast<int32_t>(packed[2]),
                                      static_cast<int32_t>(packed[1]), static_cast<int32_t>(packed[0]));
  alignas(16) int16_t scales[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(scales), _mm_cvtepu8_epi16(bytes));
  for (int j = 0; j < 8; ++j) out.scales[j] = _mm256_set1_epi16(scales[j]);
  // each minimum twice: one per 16 inputs, as the activations' sums come
  out.minimums = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(bytes, _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10,
                                                                              10, 9, 9, 8, 8)));
  const __m256i qh = five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)) : _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    if (five) {
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), low1), 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), low1), 4));
    }
    out.codes[2 * c] = lo;
    out.codes[2 * c + 1] = hi;
  }
}

// One weight row (`w`, its blocks) times activation rows r0 .. r0 + R − 1: out[t]. Per block and row,
// the integer sums in 8 lanes (Q6_K less 32·Σ scale·Σcodes, its codes' offset), scaled by d·a into
// float lanes (Q4_K/Q5_K less dmin·a·Σ min·Σcodes), summed across lanes once at the end.
template <int R>
[[gnu::always_inline]] inline void k_rows(int64_t type, const uint8_t* w, int64_t blocks, int64_t block_bytes,
                                          const ActivationView& x, int64_t r0, float* out) {
  KVectors kv;
  __m256 acc[R];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    unpack_k_vectors(type, w + b * block_bytes, kv);
    for (int t = 0; t < R; ++t) {
      const int64_t r = r0 + t;
      const int8_t* p = x.codes + r * x.k + 256 * b;
      const __m256i bsums =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums + (r * x.per_row_blocks + b) * 16));
      __m256i sums = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i pc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
#ifdef PROCTOR_VNNI
        sums = _mm256_dpwssd_epi32(sums, _mm256_maddubs_epi16(kv.codes[c], pc), kv.scales[c]);
#else
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(kv.codes[c], pc), kv.scales[c]));
#endif
      }
      const float xd = x.d[r * x.per_row_blocks + b];
      if (type == Q6_K) {
        sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_madd_epi16(bsums, kv.scales16), 5));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(kv.d * xd), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(kv.d * xd), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, kv.minimums)),
                                 _mm256_set1_ps(-(kv.dmin * xd)), acc[t]);
      }
    }
  }
  for (int t = 0; t < R; ++t) out[t] = sum8(acc[t]);
}

// A 32-input block of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 row (float16 d, Q4_1/Q5_1 float16 m, Q5 32 fifth bits,
// then 16 bytes of nibbles: element j low in byte j, j + 16 high; Q8_0: 32 int8) as one vector of int8
// codes (Q4_0 q − 8, Q5_0 q − 16), its d and m: w = d·code + m.
[[gnu::always_inline]] inline __m256i unpack_small_vector(int64_t type, const uint8_t* block, float& d,
                                                          float& m) {
  d = half_at(block);
  m = 0.f;
  if (type == Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
  const bool has_min = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
  if (has_min) m = half_at(block + 2);
  const uint8_t* qh = block + (has_min ? 4 : 2);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(five ? qh + 4 : qh));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
  if (five) {  // llama.cpp's bytes_from_bits_32: byte e all ones where bit e of qh is set
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi64x(-1));
    codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
  }
  if (!has_min) codes = _mm256_sub_epi8(codes, _mm256_set1_epi8(five ? 16 : 8));
  return codes;
}

template <int R>
[[gnu::always_inline]] inline void small_rows(int64_t type, const uint8_t* w, int64_t blocks, int64_t block_bytes,
                                              const ActivationView& x, int64_t r0, float* out) {
  const bool unsigned_codes = type == Q4_1 || type == Q5_1;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  float minimums[R] = {};
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    float d, m;
    const __m256i codes = unpack_small_vector(type, w + b * block_bytes, d, m);
    const __m256i magnitudes = _mm256_sign_epi8(codes, codes);
    for (int t = 0; t < R; ++t) {
      const int64_t r = r0 + t, at = r * x.per_row_blocks + b;
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes + r * x.k + 32 * b));
#ifdef PROCTOR_VNNI
      const __m256i sums = unsigned_codes ? _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, p)
                                          : _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitudes,
                                                                _mm256_sign_epi8(p, codes));
#else
      const __m256i sums = _mm256_madd_epi16(unsigned_codes ? _mm256_maddubs_epi16(codes, p)
                                                            : _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(p, codes)),
                                             ones);
#endif
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(d * x.d[at]), acc[t]);
      if (unsigned_codes) minimums[t] += m * x.s[at];
    }
  }
  for (int t = 0; t < R; ++t) out[t] = sum8(acc[t]) + minimums[t];
}

template <int R>
[[gnu::always_inline]] inline void float_rows(int64_t type, const uint8_t* w, int64_t k, const ActivationView& x,
                                              int64_t r0, float* out) {
  __m256 acc[R];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    __m256 weights;
    if (type == F16) {
      weights = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
    } else if (type == BF16) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i));
      weights = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
    } else {
      weights = _mm256_loadu_ps(reinterpret_cast<const float*>(w + 4 * i));
    }
    for (int t = 0; t < R; ++t) acc[t] = _mm256_fmadd_ps(weights, _mm256_loadu_ps(x.values + (r0 + t) * x.k + i), acc[t]);
  }
  for (int t = 0; t < R; ++t) out[t] = sum8(acc[t]);
}

template <int R>
void tile(int64_t type, const Layout& layout, const uint8_t* w, int64_t k, const ActivationView& x, int64_t r0,
          float* out) {
  if (layout.elements == 256) {
    k_rows<R>(type, w, k / 256, layout.bytes, x, r0, out);
  } else if (layout.elements == 32) {
    small_rows<R>(type, w, k / 32, layout.bytes, x, r0, out);
  } else {
    float_rows<R>(type, w, k, x, r0, out);
  }
}


// Weight row `w` times activation rows r0 .. r0 + count − 1 (count ≤ 8): out[0 .. count).
inline void rows(int64_t count, int64_t type, const Layout& layout, const uint8_t* w, int64_t k,
                 const ActivationView& x, int64_t r0, float* out) {
  switch (count) {
    case 8: tile<8>(type, layout, w, k, x, r0, out); break;
    case 7: tile<7>(type, layout, w, k, x, r0, out); break;
    case 6: tile<6>(type, layout, w, k, x, r0, out); break;
    case 5: tile<5>(type, layout, w, k, x, r0, out); break;
    case 4: tile<4>(type, layout, w, k, x, r0, out); break;
    case 3: tile<3>(type, layout, w, k, x, r0, out); break;
    case 2: tile<2>(type, layout, w, k, x, r0, out); break;
    default: tile<1>(type, layout, w, k, x, r0, out); break;
  }
}

}  // namespace PROCTOR_GGML_NAMESPACE
