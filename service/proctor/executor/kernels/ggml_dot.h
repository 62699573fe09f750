// The gguf products' inner loops (ggml_linear.cpp). Every block type goes eight weight rows at a time, their
// codes transposed so that activations are broadcast and the eight rows' integer sums build up in one
// vector, scaled once a block; the K-quants times a few activation rows go a weight row at a time
// (few_rows), each block's integer sums totalled exactly and then scaled as one lane of the group is.
// Compiled twice: for AVX2 in ggml_linear.cpp, and in ggml_vnni.cpp with AVX-512 VNNI (256-bit vectors, and
// 512-bit ones for the groups in ggml_wide.h), where vpdpbusd replaces maddubs + madd(1) and vpdpwssd
// replaces madd(scale) + add. Each computes the same exact integer sums (no pair can saturate: at most
// 2·128·127), then the same float operations in the same order: the same bits (tests/unit/test_gguf_linear.py).
// Self-contained (no ATen, and no standard template but on this file's own types): the VNNI copy is compiled
// under a target pragma, and nothing shared with other files may be.

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

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

// A Q4_K/Q5_K block's 8 six-bit scales (bytes 0-7) and minimums (bytes 8-15), ggml's get_scale_min_k4
// unpacked in four 32-bit words as llama.cpp does.
[[gnu::always_inline]] inline __m128i k_scale_bytes(const uint8_t* block) {
  uint32_t packed[4];
  std::memcpy(packed, block + 4, 12);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4_words = 0x0f0f0f0f, low2_words = 0x03030303;
  packed[3] = ((packed[2] >> 4) & low4_words) | (((packed[1] >> 6) & low2_words) << 4);
  const uint32_t minimums_low = packed[1] & low6;
  packed[1] = (packed[2] & low4_words) | (((packed[0] >> 6) & low2_words) << 4);
  packed[2] = minimums_low;
  packed[0] &= low6;
  return _mm_set_epi32(static_cast<int32_t>(packed[3]), static_cast<int32_t>(packed[2]),
                       static_cast<int32_t>(packed[1]), static_cast<int32_t>(packed[0]));
}

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
  const __m128i bytes = k_scale_bytes(block);
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

// A 32-input block of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 row (float16 d, Q4_1/Q5_1 float16 m, Q5 32 fifth bits,
// then 16 bytes of nibbles: element j low in byte j, j + 16 high; Q8_0: 32 int8) as one vector of unsigned
// codes u with w = d·(u − offset) + m: Q4_0 q and 8, Q5_0 q and 16, Q8_0 its int8 + 128 and 128, Q4_1/Q5_1 q.
constexpr int small_offset(int64_t type) { return type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q8_0 ? 128 : 0; }

[[gnu::always_inline]] inline __m256i unpack_small_unsigned(int64_t type, const uint8_t* block) {
  if (type == Q8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2)), _mm256_set1_epi8(-128));
  }
  const bool has_min = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
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
  return codes;
}

// The same block as int8 codes (u − offset, wrapping: Q8_0's own bytes), its d and m: w = d·code + m.
[[gnu::always_inline]] inline __m256i unpack_small_vector(int64_t type, const uint8_t* block, float& d,
                                                          float& m) {
  d = half_at(block);
  m = type == Q4_1 || type == Q5_1 ? half_at(block + 2) : 0.f;
  return _mm256_sub_epi8(unpack_small_unsigned(type, block), _mm256_set1_epi8(static_cast<char>(small_offset(type))));
}

// Eight rows of eight 32-bit words transposed in place: afterwards v[j] holds word j of every row, row i's
// in lane i (the 8×8 transpose of unpack 32/64 and 128-bit lane permutes).
[[gnu::always_inline]] inline void transpose_words8(__m256i* v) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);      // words 0,1 | 4,5 of rows 2i, 2i+1
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);  // words 2,3 | 6,7
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);      // word 0 | 4 of rows 4i .. 4i+3
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);      // word 1 | 5
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);  // word 2 | 6
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);  // word 3 | 7
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    v[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

// acc + the dot products of unsigned u and signed s, each four bytes to an int32 lane.
[[gnu::always_inline]] inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
#ifdef PROCTOR_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
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

// A Q6_K block times activation row r's block b, in 8 int32 lanes: Σ scale·code·a less 32·Σ scale·Σa
// (its codes' offset).
[[gnu::always_inline]] inline __m256i q6_k_lanes(const KVectors& kv, const ActivationView& x, int64_t r, int64_t b) {
  const int8_t* p = x.codes + r * x.k + 256 * b;
  __m256i two[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // as k_scaled
  for (int c = 0; c < 8; ++c) {
    const __m256i pc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
#ifdef PROCTOR_VNNI
    two[c % 2] = _mm256_dpwssd_epi32(two[c % 2], _mm256_maddubs_epi16(kv.codes[c], pc), kv.scales[c]);
#else
    two[c % 2] = _mm256_add_epi32(two[c % 2], _mm256_madd_epi16(_mm256_maddubs_epi16(kv.codes[c], pc), kv.scales[c]));
#endif
  }
  const __m256i sums = _mm256_add_epi32(two[0], two[1]);
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums + (r * x.per_row_blocks + b) * 16));
  return _mm256_sub_epi32(sums, _mm256_slli_epi32(_mm256_madd_epi16(bsums, kv.scales16), 5));
}

// Eight int32 vectors' lane sums, v[i]'s total in lane i (exact: integers in any order).
[[gnu::always_inline]] inline __m256i sum_lanes8(const __m256i* v) {
  const __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i ce = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  // ab: v0..v3's low 128-bit halves summed, then their high halves; ce the same for v4..v7
  return _mm256_add_epi32(_mm256_permute2x128_si256(ab, ce, 0x20), _mm256_permute2x128_si256(ab, ce, 0x31));
}

// A Q4_K/Q5_K block times activation row r's block b: Σ scale·code·a in 8 int32 lanes (k_scaled), and
// Σ minimum·Σa over its 16-input sums (k_minimums). Exact integers: at most 8·32·31·128·63 in all.
// (Two accumulators: eight dependent vpdpwssd in a row cost their latency each.)
[[gnu::always_inline]] inline __m256i k_scaled(const KVectors& kv, const int8_t* p) {
  __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int c = 0; c < 8; ++c) {
    const __m256i pairs = _mm256_maddubs_epi16(kv.codes[c], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c)));
#ifdef PROCTOR_VNNI
    sums[c % 2] = _mm256_dpwssd_epi32(sums[c % 2], pairs, kv.scales[c]);
#else
    sums[c % 2] = _mm256_add_epi32(sums[c % 2], _mm256_madd_epi16(pairs, kv.scales[c]));
#endif
  }
  return _mm256_add_epi32(sums[0], sums[1]);
}

[[gnu::always_inline]] inline __m256i k_minimums(const KVectors& kv, const int16_t* bsums) {
  return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)), kv.minimums);
}

// A Q4_K block's S and M lanes (as k_scaled and k_minimums) against activation rows 0 .. R − 1, straight
// from its bytes: the nibbles split in place and each 32 inputs' scale shuffled out of one register, as
// llama.cpp's vec_dot does, instead of unpacked into KVectors first (the row loop at one activation row is
// bound by these operations, not by memory). In the VNNI copy two 32-input chunks a 512-bit vector.
template <int R>
[[gnu::always_inline]] inline void q4_k_lanes(const uint8_t* block, const ActivationView& x, int64_t b, __m256i* s,
                                              __m256i* m) {
  const __m128i bytes = k_scale_bytes(block);
  const __m256i minimums = _mm256_cvtepu8_epi16(
      _mm_shuffle_epi8(bytes, _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8)));
  const uint8_t* qs = block + 16;
#ifdef PROCTOR_VNNI
  const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(bytes));  // int16 lanes 0-7: the scales
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i acc[R][2];
  for (int t = 0; t < R; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_si512();
  for (int n = 0; n < 2; ++n) {  // chunks 4n .. 4n + 3: nibbles of 64 bytes
    const __m512i q = _mm512_loadu_si512(qs + 64 * n);
    const __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    // lo holds chunks 4n | 4n + 2, hi 4n + 1 | 4n + 3: regrouped as the activations lie, 4n | 4n + 1, 4n + 2 | 4n + 3
    const __m512i first = _mm512_shuffle_i64x2(lo, hi, 0x44), second = _mm512_shuffle_i64x2(lo, hi, 0xEE);
    const __m512i first_scales = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(4 * n)), _mm256_set1_epi16(static_cast<int16_t>(4 * n + 1)), 1), scales);
    const __m512i second_scales = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(4 * n + 2)), _mm256_set1_epi16(static_cast<int16_t>(4 * n + 3)), 1), scales);
    for (int t = 0; t < R; ++t) {
      const int8_t* p = x.codes + t * x.k + 256 * b + 128 * n;
      acc[t][0] = _mm512_dpwssd_epi32(acc[t][0], _mm512_maddubs_epi16(first, _mm512_loadu_si512(p)), first_scales);
      acc[t][1] = _mm512_dpwssd_epi32(acc[t][1], _mm512_maddubs_epi16(second, _mm512_loadu_si512(p + 64)), second_scales);
    }
  }
  for (int t = 0; t < R; ++t) {
    const __m512i sum = _mm512_add_epi32(acc[t][0], acc[t][1]);
    s[t] = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
  }
#else
  const __m128i eight = _mm256_castsi256_si128(_mm256_cvtepu8_epi16(bytes));
  const __m256i scales = _mm256_set_m128i(eight, eight);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i acc[R][2];
  for (int t = 0; t < R; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {  // chunks 2j (low nibbles) and 2j + 1 (high) of 32 bytes
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
    const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    const __m256i lo_scale = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * j + 1) << 8 | 4 * j)));
    const __m256i hi_scale = _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>((4 * j + 3) << 8 | (4 * j + 2))));
    for (int t = 0; t < R; ++t) {
      const int8_t* p = x.codes + t * x.k + 256 * b + 64 * j;
      const __m256i first = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      const __m256i second = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      acc[t][0] = _mm256_add_epi32(acc[t][0], _mm256_madd_epi16(first, lo_scale));
      acc[t][1] = _mm256_add_epi32(acc[t][1], _mm256_madd_epi16(second, hi_scale));
    }
  }
  for (int t = 0; t < R; ++t) s[t] = _mm256_add_epi32(acc[t][0], acc[t][1]);
#endif
  for (int t = 0; t < R; ++t) {
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums + (t * x.per_row_blocks + b) * 16));
    m[t] = _mm256_madd_epi16(bsums, minimums);
  }
}

// Op<count>::run(args...) for count 1..8: a runtime count of activation rows to the template the loops
// unroll on.
template <template <int> class Op, typename... Args>
inline void with_count(int64_t count, const Args&... args) {
  switch (count) {
    case 8: Op<8>::run(args...); break;
    case 7: Op<7>::run(args...); break;
    case 6: Op<6>::run(args...); break;
    case 5: Op<5>::run(args...); break;
    case 4: Op<4>::run(args...); break;
    case 3: Op<3>::run(args...); break;
    case 2: Op<2>::run(args...); break;
    default: Op<1>::run(args...); break;
  }
}

// Up to this many activation rows, a K-quant group goes by few_rows() (its weight rows as they are
// stored, no transposes); past it, by its Blocks.
constexpr int64_t kRowMost = 4;

// ---- Eight weight rows at a time: every block type ------------------------------------------------------
// Per block, the eight rows' codes are unpacked and transposed once (vector j: inputs 4j .. 4j + 3 of every
// row, row i in lane i: a Block); per activation row, each vector meets those four activations broadcast,
// so the eight rows' exact integer sums build up in one vector with no horizontal sums, are scaled in float
// once a block (by d·a; Q4_1/Q5_1 plus m·s) and summed in block order. Each output is one lane's fixed
// sequence of float operations, whichever group, tile or batch it is in. For more activation rows than one
// tile, a group's Blocks are made once into a per-thread scratch and every tile reads them there.

struct SmallBlock {  // a 32-input type's block of eight rows
  __m256i codes[8];  // unsigned (u − offset is the code), transposed
#ifndef PROCTOR_VNNI
  __m256i signs[8];  // Q8_0: its signed codes (codes then hold their magnitudes)
#endif
  __m256 d, m;       // the eight rows' scales and (Q4_1/Q5_1) minimums
};

struct Q6Block {         // a Q6_K block of eight rows
  __m256i codes[8][8];   // [32 inputs][transposed vector]
  __m256i scales[16];    // per 16 inputs, the eight rows' scales (VNNI: as int32; AVX2: as an int16 pair)
  __m256i pairs[8];      // per pair of those, the eight rows' two scales as int16 (as the bsums pair up)
  __m256 d;
};

struct KBlock {          // a Q4_K/Q5_K block of eight rows
  __m256i codes[8][8];  // [32 inputs][transposed vector]
  __m256i scales[8];    // per 32 inputs, the eight rows' scales (VNNI: as int32; AVX2: as an int16 pair)
  __m256i minimums[8];  // per 32 inputs, the eight rows' minimum twice as int16 (as the 16-input bsums pair up)
  __m256 d, ndmin;      // d and −dmin
};

template <int64_t TYPE>
using BlockOf = std::conditional_t<TYPE == Q6_K, Q6Block, std::conditional_t<TYPE == Q4_K || TYPE == Q5_K, KBlock, SmallBlock>>;

template <int64_t TYPE>
constexpr int64_t block_bytes_of() {
  return TYPE == Q8_0 ? 34 : TYPE == Q4_0 ? 18 : TYPE == Q4_1 ? 20 : TYPE == Q5_0 ? 22 : TYPE == Q5_1 ? 24 : 210;
}

// A group's rows are more streams than the hardware prefetcher follows: the next group's bytes (the next
// rows·row_bytes, as a thread takes consecutive groups) are asked for, a share a block, while this one runs.
[[gnu::always_inline]] inline void prefetch_share(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t blocks,
                                                  int64_t b) {
  const char* next = reinterpret_cast<const char*>(w + rows * row_bytes);
  const int64_t lines = (rows * row_bytes / 64 + blocks - 1) / blocks;
  for (int64_t l = 0; l < lines; ++l) _mm_prefetch(next + (b * lines + l) * 64, _MM_HINT_T0);
}

// Block b of weight rows w .. w + (g − 1)·row_bytes (the rest zero).
template <int64_t TYPE>
[[gnu::always_inline]] inline void load_block(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b,
                                              SmallBlock& out) {
  constexpr bool has_min = TYPE == Q4_1 || TYPE == Q5_1;
  alignas(16) uint16_t dh[8] = {}, mh[8] = {};
  for (int64_t i = 0; i < 8; ++i) {
    if (i < g) {
      const uint8_t* block = w + i * row_bytes + b * block_bytes_of<TYPE>();
      out.codes[i] = unpack_small_unsigned(TYPE, block);
      std::memcpy(dh + i, block, 2);
      if (has_min) std::memcpy(mh + i, block + 2, 2);
    } else {
      out.codes[i] = _mm256_setzero_si256();
    }
  }
  transpose_words8(out.codes);
#ifndef PROCTOR_VNNI
  if (TYPE == Q8_0) {  // maddubs would saturate on its codes + 128: |w| times x with w's sign instead
    for (int j = 0; j < 8; ++j) {
      out.signs[j] = _mm256_xor_si256(out.codes[j], _mm256_set1_epi8(-128));
      out.codes[j] = _mm256_abs_epi8(out.signs[j]);  // −128 stays 0x80: 128 unsigned
    }
  }
#endif
  out.d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
  out.m = has_min ? _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh))) : _mm256_setzero_ps();
}

template <int64_t TYPE>
[[gnu::always_inline]] inline void load_block(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b,
                                              Q6Block& out) {
  __m256i codes[8][8];                     // [weight row][32 inputs]
  alignas(32) int32_t scales[16][8] = {};  // [scale][weight row]
  alignas(32) int32_t pairs[8][8] = {};    // [scale pair][weight row]
  alignas(16) uint16_t dh[8] = {};
  for (int64_t i = 0; i < 8; ++i) {
    if (i >= g) {
      for (int c = 0; c < 8; ++c) codes[i][c] = _mm256_setzero_si256();
      continue;
    }
    const uint8_t* block = w + i * row_bytes + b * 210;
    KVectors kv;
    unpack_k_vectors(Q6_K, block, kv);
    for (int c = 0; c < 8; ++c) codes[i][c] = kv.codes[c];
    std::memcpy(dh + i, block + 208, 2);
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
#ifdef PROCTOR_VNNI
    for (int j = 0; j < 16; ++j) scales[j][i] = sc[j];
#else
    for (int j = 0; j < 16; ++j) {
      const uint32_t half = static_cast<uint16_t>(sc[j]);
      scales[j][i] = static_cast<int32_t>(half | (half << 16));
    }
#endif
    for (int m = 0; m < 8; ++m) {
      pairs[m][i] = static_cast<int32_t>(static_cast<uint16_t>(sc[2 * m]) |
                                         (static_cast<uint32_t>(static_cast<uint16_t>(sc[2 * m + 1])) << 16));
    }
  }
  for (int c = 0; c < 8; ++c) {
    for (int i = 0; i < 8; ++i) out.codes[c][i] = codes[i][c];
    transpose_words8(out.codes[c]);
  }
  for (int j = 0; j < 16; ++j) out.scales[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(scales[j]));
  for (int m = 0; m < 8; ++m) out.pairs[m] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pairs[m]));
  out.d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
}

template <int64_t TYPE>
[[gnu::always_inline]] inline void load_block(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b, KBlock& out) {
  constexpr int64_t block_bytes = TYPE == Q4_K ? 144 : 176;
  alignas(32) int32_t scales[8][8] = {}, minimums[8][8] = {};  // [32 inputs][weight row]
  alignas(16) uint16_t dh[8] = {}, mh[8] = {};
  KVectors kv;
  for (int64_t i = 0; i < 8; ++i) {
    if (i >= g) {
      for (int c = 0; c < 8; ++c) out.codes[c][i] = _mm256_setzero_si256();
      continue;
    }
    const uint8_t* block = w + i * row_bytes + b * block_bytes;
    unpack_k_vectors(TYPE, block, kv);
    for (int c = 0; c < 8; ++c) out.codes[c][i] = kv.codes[c];
    std::memcpy(dh + i, block, 2);
    std::memcpy(mh + i, block + 2, 2);
    alignas(16) uint8_t bytes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(bytes), k_scale_bytes(block));
    for (int c = 0; c < 8; ++c) {
#ifdef PROCTOR_VNNI
      scales[c][i] = bytes[c];
#else
      scales[c][i] = static_cast<int32_t>(bytes[c] | (static_cast<uint32_t>(bytes[c]) << 16));
#endif
      minimums[c][i] = static_cast<int32_t>(bytes[8 + c] | (static_cast<uint32_t>(bytes[8 + c]) << 16));
    }
  }
  for (int c = 0; c < 8; ++c) {
    transpose_words8(out.codes[c]);
    out.scales[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(scales[c]));
    out.minimums[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(minimums[c]));
  }
  out.d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh)));
  // −dmin as k_quant_row negates it (the sign bit flipped: −0 stays −0)
  out.ndmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh))), _mm256_set1_ps(-0.f));
}

[[gnu::always_inline]] inline __m256i broadcast_word(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm256_set1_epi32(word);
}

// acc[t] += block b of the Block's eight rows times activation row r0 + t, for t < R.
template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void block_rows(const SmallBlock& blk, const ActivationView& x, int64_t r0, int64_t b,
                                              __m256* acc) {
  constexpr bool has_min = TYPE == Q4_1 || TYPE == Q5_1;
  constexpr int offset = small_offset(TYPE);
  for (int t = 0; t < R; ++t) {
    const int64_t r = r0 + t, at = r * x.per_row_blocks + b;
    const int8_t* p = x.codes + r * x.k + 32 * b;
    __m256i sums = _mm256_setzero_si256();
#ifdef PROCTOR_VNNI
    for (int j = 0; j < 8; ++j) sums = _mm256_dpbusd_epi32(sums, blk.codes[j], broadcast_word(p + 4 * j));
    if (offset != 0) sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(offset * x.sums[at]));
#else
    for (int j = 0; j < 8; ++j) {
      const __m256i a = broadcast_word(p + 4 * j);
      sums = dot_add(sums, blk.codes[j], TYPE == Q8_0 ? _mm256_sign_epi8(a, blk.signs[j]) : a);
    }
    if (offset != 0 && TYPE != Q8_0) sums = _mm256_sub_epi32(sums, _mm256_set1_epi32(offset * x.sums[at]));
#endif
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(blk.d, _mm256_set1_ps(x.d[at])), acc[t]);
    if (has_min) acc[t] = _mm256_fmadd_ps(blk.m, _mm256_set1_ps(x.s[at]), acc[t]);
  }
}

// Q6_K: each 16 inputs' exact integer sum times the eight rows' scales for them, the block's total less
// 32·Σ scale·Σa (its codes' offset), scaled by d·a.
template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void block_rows(const Q6Block& blk, const ActivationView& x, int64_t r0, int64_t b,
                                              __m256* acc) {
  for (int t = 0; t < R; ++t) {
    const int64_t r = r0 + t, at = r * x.per_row_blocks + b;
    const int8_t* p = x.codes + r * x.k + 256 * b;
    __m256i sums = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
#ifdef PROCTOR_VNNI
      __m256i first = _mm256_setzero_si256(), second = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) first = dot_add(first, blk.codes[c][j], broadcast_word(p + 32 * c + 4 * j));
      for (int j = 4; j < 8; ++j) second = dot_add(second, blk.codes[c][j], broadcast_word(p + 32 * c + 4 * j));
      sums = _mm256_add_epi32(sums, _mm256_add_epi32(_mm256_mullo_epi32(first, blk.scales[2 * c]),
                                                     _mm256_mullo_epi32(second, blk.scales[2 * c + 1])));
#else
      // Two pairs' int16 sums added in int16 (|pair| <= 2·63·127: two fit), then times the 16 inputs' scale in
      // one multiply-add: the same integers as Σ codes·a times the scale, with 12 multiplies a chunk instead of 20.
      __m256i halves[2];
      for (int h = 0; h < 2; ++h) {
        __m256i total = _mm256_setzero_si256();
        for (int j = 4 * h; j < 4 * h + 4; j += 2) {
          const __m256i pairs = _mm256_add_epi16(
              _mm256_maddubs_epi16(blk.codes[c][j], broadcast_word(p + 32 * c + 4 * j)),
              _mm256_maddubs_epi16(blk.codes[c][j + 1], broadcast_word(p + 32 * c + 4 * j + 4)));
          total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs, blk.scales[2 * c + h]));
        }
        halves[h] = total;
      }
      sums = _mm256_add_epi32(sums, _mm256_add_epi32(halves[0], halves[1]));
#endif
    }
    const int16_t* bsums = x.bsums + at * 16;
    __m256i offsets = _mm256_setzero_si256();  // Σ scale·bsum over the 16
    for (int m = 0; m < 8; ++m) {
      int32_t pair;
      std::memcpy(&pair, bsums + 2 * m, 4);
      offsets = _mm256_add_epi32(offsets, _mm256_madd_epi16(blk.pairs[m], _mm256_set1_epi32(pair)));
    }
    const __m256i total = _mm256_sub_epi32(sums, _mm256_slli_epi32(offsets, 5));
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(blk.d, _mm256_set1_ps(x.d[at])), acc[t]);
  }
}

// Q4_K/Q5_K: per 32 inputs, the eight rows' exact integer sums (codes' lanes against four activations
// broadcast) times their scales; M = Σ minimum·Σa from the activations' 16-input sums; then as k_quant_row,
// acc = fma(S, d·a, acc), acc = fma(M, −dmin·a, acc). Chunk by chunk over the tile's rows, so a chunk's
// code vectors are loaded once for all of them.
template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void block_rows(const KBlock& blk, const ActivationView& x, int64_t r0, int64_t b,
                                              __m256* acc) {
  __m256i sums[R];
  for (int t = 0; t < R; ++t) sums[t] = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    for (int t = 0; t < R; ++t) {
      const int8_t* p = x.codes + (r0 + t) * x.k + 256 * b + 32 * c;
#ifdef PROCTOR_VNNI
      __m256i part = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) part = _mm256_dpbusd_epi32(part, blk.codes[c][j], broadcast_word(p + 4 * j));
      sums[t] = _mm256_add_epi32(sums[t], _mm256_mullo_epi32(part, blk.scales[c]));
#else
      // The pairs' int16 sums added in int16 before one multiply by the scales (half the multiplies): exact, as
      // |pair| <= 2·15·128 and eight of them fit (Q4_K), and for Q5_K's 0..31 codes four do (two runs).
      constexpr int kRun = TYPE == Q4_K ? 8 : 4;
      for (int j0 = 0; j0 < 8; j0 += kRun) {
        __m256i pairs = _mm256_maddubs_epi16(blk.codes[c][j0], broadcast_word(p + 4 * j0));
        for (int j = j0 + 1; j < j0 + kRun; ++j) {
          pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(blk.codes[c][j], broadcast_word(p + 4 * j)));
        }
        sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(pairs, blk.scales[c]));
      }
#endif
    }
  }
  for (int t = 0; t < R; ++t) {
    const int64_t at = (r0 + t) * x.per_row_blocks + b;
    const int16_t* bsums = x.bsums + at * 16;
    __m256i offsets = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      int32_t pair;
      std::memcpy(&pair, bsums + 2 * c, 4);
      offsets = _mm256_add_epi32(offsets, _mm256_madd_epi16(blk.minimums[c], _mm256_set1_epi32(pair)));
    }
    const __m256 xd = _mm256_set1_ps(x.d[at]);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), _mm256_mul_ps(blk.d, xd), acc[t]);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offsets), _mm256_mul_ps(blk.ndmin, xd), acc[t]);
  }
}

// The group loops' width: eight weight rows, one 256-bit vector of lanes (ggml_wide.h's Wide: sixteen in 512
// bits, in the VNNI copy). The drivers below take either; only the Blocks and their block_rows differ.
struct Narrow {
  static constexpr int64_t kRows = kGroupRows;
  static constexpr bool kFileRows = true;  // w is the file's rows (ggml_r8_blocks.h's groups are not)
  using Acc = __m256;
  template <int64_t TYPE>
  using Block = BlockOf<TYPE>;
  static Acc zero() { return _mm256_setzero_ps(); }
  static void store(float* lanes, Acc v) { _mm256_storeu_ps(lanes, v); }
  template <int64_t TYPE>
  static void load(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b, Block<TYPE>& out) {
    load_block<TYPE>(w, row_bytes, g, b, out);
  }
  template <int R, int64_t TYPE>
  static void rows(const Block<TYPE>& blk, const ActivationView& x, int64_t r0, int64_t b, Acc* acc) {
    block_rows<R, TYPE>(blk, x, r0, b, acc);
  }
};

// Lanes i < g of acc[t] into y's row r0 + t (width apart).
template <class W, int R>
[[gnu::always_inline]] inline void store_tile(const typename W::Acc* acc, int64_t g, float* y, int64_t width,
                                              int64_t r0) {
  for (int t = 0; t < R; ++t) {
    float lanes[W::kRows];
    W::store(lanes, acc[t]);
    for (int64_t i = 0; i < g; ++i) y[(r0 + t) * width + i] = lanes[i];
  }
}

// One tile (R ≤ 8 activation rows), each Block made as it is used.
template <class W, int R, int64_t TYPE>
inline void fused_tile(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t blocks, const ActivationView& x,
                       float* y, int64_t width) {
  typename W::Acc acc[R];
  for (int t = 0; t < R; ++t) acc[t] = W::zero();
  for (int64_t b = 0; b < blocks; ++b) {
    prefetch_share(w, W::kRows, row_bytes, blocks, b);
    typename W::template Block<TYPE> blk;
    W::template load<TYPE>(w, row_bytes, g, b, blk);
    W::template rows<R, TYPE>(blk, x, 0, b, acc);
  }
  store_tile<W, R>(acc, g, y, width, 0);
}

// Tile r0 .. r0 + R − 1 from Blocks made already.
template <class W, int R, int64_t TYPE>
inline void scratch_tile(const typename W::template Block<TYPE>* made, int64_t g, int64_t blocks,
                         const ActivationView& x, int64_t r0, float* y, int64_t width) {
  typename W::Acc acc[R];
  for (int t = 0; t < R; ++t) acc[t] = W::zero();
  for (int64_t b = 0; b < blocks; ++b) W::template rows<R, TYPE>(made[b], x, r0, b, acc);
  store_tile<W, R>(acc, g, y, width, r0);
}

template <class W, int64_t TYPE>
struct Tiles {  // fused_tile and scratch_tile of one width and type, for with_count
  template <int R>
  struct Fused {
    template <typename... Args>
    static void run(const Args&... args) { fused_tile<W, R, TYPE>(args...); }
  };
  template <int R>
  struct Scratch {
    template <typename... Args>
    static void run(const Args&... args) { scratch_tile<W, R, TYPE>(args...); }
  };
};

// A thread's scratch for `count` T, 64-byte aligned as T's vectors need: std::vector's allocation is not
// (its storage is only 16-byte aligned here), so this takes raw lines and aligns the start itself.
struct ScratchLine {
  unsigned char bytes[64];
};

template <class T>
inline T* thread_scratch(int64_t count) {
  thread_local std::vector<ScratchLine> lines;
  const size_t wanted = (sizeof(T) * static_cast<size_t>(count) + 63) / 64 + 1;
  if (lines.size() < wanted) lines.resize(wanted);
  const uintptr_t start = reinterpret_cast<uintptr_t>(lines.data());
  return reinterpret_cast<T*>((start + 63) & ~uintptr_t{63});
}

// few_rows reads one sequential stream a thread, and the hardware prefetchers alone keep too few of its lines
// in flight for a core to draw its share of the memory bandwidth, least of all on long rows (measured on the Zen 4:
// 14,336-input rows read 30% slower than 4,096-input ones of the same bytes). So each block asks for the bytes
// this far ahead, a distance measured flat from 1.5 to 6 KB (bench/README.md, "One row at a time, prefetched").
constexpr int64_t kAheadBytes = 3072;

template <int64_t BYTES>
[[gnu::always_inline]] inline void prefetch_ahead(const uint8_t* block) {
  const char* ahead = reinterpret_cast<const char*>(block) + kAheadBytes;  // a prefetch never faults
  for (int64_t l = 0; l < BYTES; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
}

// A K-quant group of eight weight rows (g of them real) times activation rows 0 .. R − 1, R ≤ kRowMost, the
// rows read one after another as they are stored (one sequential stream, no transposes): per block, the
// row's integer sums in 8 lanes against each activation row (k_scaled, k_minimums; q6_k_lanes), totalled
// eight blocks at a time (sum_lanes8: block 8c + q's exact total in lane q). Then the eight rows' totals
// are transposed (lane i: weight row i) and scaled by the very float operations of the group's block_rows,
// lane by lane, in block order. So the same bits as the transposed Blocks, for less work at few rows.
template <int R, int64_t TYPE>
inline void few_rows(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t blocks, const ActivationView& x, float* y,
                     int64_t width) {
  constexpr int64_t block_bytes = TYPE == Q4_K ? 144 : TYPE == Q5_K ? 176 : 210;
  constexpr int parts = TYPE == Q6_K ? 1 : 2;  // Σ scale·code·a (Q6_K less its offset), and Σ minimum·Σa
  const int64_t chunks = (blocks + 7) / 8;
  // totals[((i·chunks + c)·R + t)·parts + p]: weight row i, blocks 8c .. 8c + 7, activation row t, part p
  __m256i* totals = thread_scratch<__m256i>(8 * chunks * R * parts);
  float* scales = thread_scratch<float>(16 * blocks);  // [block][d, −dmin][weight row]
  KVectors kv;
  __m256i lanes[R][parts][8];
  for (int64_t i = 0; i < 8; ++i) {
    const uint8_t* row = w + i * row_bytes;
    for (int64_t c = 0; c < chunks; ++c) {
      const int count = i < g ? static_cast<int>(blocks - 8 * c < 8 ? blocks - 8 * c : 8) : 0;
      for (int q = 0; q < count; ++q) {
        const int64_t b = 8 * c + q;
        const uint8_t* block = row + b * block_bytes;
        prefetch_ahead<block_bytes>(block);
        if (TYPE == Q4_K) {
          scales[16 * b + i] = half_at(block), scales[16 * b + 8 + i] = -half_at(block + 2);
          __m256i s[R], m[R];
          q4_k_lanes<R>(block, x, b, s, m);
          for (int t = 0; t < R; ++t) lanes[t][0][q] = s[t], lanes[t][parts - 1][q] = m[t];
          continue;
        }
        unpack_k_vectors(TYPE, block, kv);
        scales[16 * b + i] = kv.d, scales[16 * b + 8 + i] = -kv.dmin;
        for (int t = 0; t < R; ++t) {
          if (TYPE == Q6_K) {
            lanes[t][0][q] = q6_k_lanes(kv, x, t, b);
          } else {
            lanes[t][0][q] = k_scaled(kv, x.codes + t * x.k + 256 * b);
            lanes[t][parts - 1][q] = k_minimums(kv, x.bsums + (t * x.per_row_blocks + b) * 16);
          }
        }
      }
      for (int t = 0; t < R; ++t) {
        for (int part = 0; part < parts; ++part) {
          for (int q = count; q < 8; ++q) lanes[t][part][q] = _mm256_setzero_si256();
          totals[((i * chunks + c) * R + t) * parts + part] = sum_lanes8(lanes[t][part]);
        }
      }
    }
    if (i >= g) {
      for (int64_t b = 0; b < blocks; ++b) scales[16 * b + i] = scales[16 * b + 8 + i] = 0.f;
    }
  }
  __m256 acc[R];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m256i by_block[R][parts][8];  // [t][part][q]: lane i is weight row i's total for block 8c + q
    for (int t = 0; t < R; ++t) {
      for (int part = 0; part < parts; ++part) {
        for (int i = 0; i < 8; ++i) by_block[t][part][i] = totals[((i * chunks + c) * R + t) * parts + part];
        transpose_words8(by_block[t][part]);
      }
    }
    const int count = static_cast<int>(blocks - 8 * c < 8 ? blocks - 8 * c : 8);
    for (int q = 0; q < count; ++q) {
      const int64_t b = 8 * c + q;
      const __m256 d = _mm256_loadu_ps(scales + 16 * b), ndmin = _mm256_loadu_ps(scales + 16 * b + 8);
      for (int t = 0; t < R; ++t) {
        const __m256 xd = _mm256_set1_ps(x.d[t * x.per_row_blocks + b]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(by_block[t][0][q]), _mm256_mul_ps(d, xd), acc[t]);
        if (parts == 2) {
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(by_block[t][parts - 1][q]), _mm256_mul_ps(ndmin, xd), acc[t]);
        }
      }
    }
  }
  store_tile<Narrow, R>(acc, g, y, width, 0);
}

template <int64_t TYPE>
struct FewRows {
  template <int R>
  struct Op {
    template <typename... Args>
    static void run(const Args&... args) { few_rows<R, TYPE>(args...); }
  };
};

// Every activation row (rows of them) times weight rows w .. w + (g − 1)·row_bytes of one type: y[r·width + i].
template <class W, int64_t TYPE>
inline void type_group(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t blocks, const ActivationView& x,
                       int64_t rows, float* y, int64_t width) {
  if constexpr ((TYPE == Q4_K || TYPE == Q5_K || TYPE == Q6_K) && W::kFileRows) {
    if (rows <= kRowMost) {  // W::kRows weight rows as groups of eight
      for (int64_t h = 0; h < g; h += kGroupRows) {
        with_count<FewRows<TYPE>::template Op>(rows, w + h * row_bytes, row_bytes, g - h < kGroupRows ? g - h : kGroupRows,
                                               blocks, x, y + h, width);
      }
      return;
    }
  }
  if (rows <= 8) {
    with_count<Tiles<W, TYPE>::template Fused>(rows, w, row_bytes, g, blocks, x, y, width);
    return;
  }
  using Block = typename W::template Block<TYPE>;
  Block* made = thread_scratch<Block>(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    prefetch_share(w, W::kRows, row_bytes, blocks, b);
    W::template load<TYPE>(w, row_bytes, g, b, made[b]);
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    with_count<Tiles<W, TYPE>::template Scratch>(rows - r0 < 8 ? rows - r0 : 8, made, g, blocks, x, r0, y, width);
  }
}

// Every activation row times W::kRows weight rows (g of them real, row_bytes apart) of a 32-input type or
// Q6_K with k inputs: y[r·width + i] for activation row r and weight row i.
template <class W = Narrow>
inline void group(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x,
                  int64_t rows, float* y, int64_t width) {
  switch (type) {
    case Q4_0: type_group<W, Q4_0>(w, row_bytes, g, k / 32, x, rows, y, width); break;
    case Q4_1: type_group<W, Q4_1>(w, row_bytes, g, k / 32, x, rows, y, width); break;
    case Q5_0: type_group<W, Q5_0>(w, row_bytes, g, k / 32, x, rows, y, width); break;
    case Q5_1: type_group<W, Q5_1>(w, row_bytes, g, k / 32, x, rows, y, width); break;
    case Q8_0: type_group<W, Q8_0>(w, row_bytes, g, k / 32, x, rows, y, width); break;
    case Q4_K: type_group<W, Q4_K>(w, row_bytes, g, k / 256, x, rows, y, width); break;
    case Q5_K: type_group<W, Q5_K>(w, row_bytes, g, k / 256, x, rows, y, width); break;
    default: type_group<W, Q6_K>(w, row_bytes, g, k / 256, x, rows, y, width); break;
  }
}

template <int R>
struct FloatRows {
  static void run(int64_t type, const uint8_t* w, int64_t k, const ActivationView& x, int64_t r0, float* out) {
    float_rows<R>(type, w, k, x, r0, out);
  }
};

// Weight row `w` of a float type times activation rows r0 .. r0 + count − 1 (count ≤ 8): out[0 .. count).
inline void rows(int64_t count, int64_t type, const uint8_t* w, int64_t k, const ActivationView& x, int64_t r0,
                 float* out) {
  with_count<FloatRows>(count, type, w, k, x, r0, out);
}

}  // namespace PROCTOR_GGML_NAMESPACE
