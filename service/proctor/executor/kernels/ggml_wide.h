// The VNNI copy's groups on 512-bit vectors: sixteen weight rows a vector, two of ggml_dot.h's eight-row
// groups side by side (rows 0-7 in lanes 0-7, rows 8-15 in lanes 8-15). Every lane runs the integer and
// float operations of its row in the 256-bit group, in the same order, so each output keeps its bits
// (tests/unit/test_gguf_linear.py: the VNNI loops give the AVX2 loops' bits). Half the instructions a
// weight row: the broadcast activation word and the vpdpbusd each serve sixteen rows instead of eight.
// Included by ggml_vnni.cpp only, after ggml_dot.h, under its target pragma.

namespace PROCTOR_GGML_NAMESPACE {

struct WideSmallBlock {
  __m512i codes[8];
  __m512 d, m;
};

struct WideQ6Block {
  __m512i codes[8][8];
  __m512i scales[16];
  __m512i pairs[8];
  __m512 d;
};

struct WideKBlock {
  __m512i codes[8][8];
  __m512i scales[8];
  __m512i minimums[8];
  __m512 d, ndmin;
};

template <int64_t TYPE>
using WideBlockOf =
    std::conditional_t<TYPE == Q6_K, WideQ6Block, std::conditional_t<TYPE == Q4_K || TYPE == Q5_K, WideKBlock, WideSmallBlock>>;

[[gnu::always_inline]] inline __m512i join(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

[[gnu::always_inline]] inline __m512 join(__m256 low, __m256 high) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(low)), _mm256_castps_pd(high), 1));
}

[[gnu::always_inline]] inline void join_into(const SmallBlock& low, const SmallBlock& high, WideSmallBlock& out) {
  for (int j = 0; j < 8; ++j) out.codes[j] = join(low.codes[j], high.codes[j]);
  out.d = join(low.d, high.d);
  out.m = join(low.m, high.m);
}

[[gnu::always_inline]] inline void join_into(const Q6Block& low, const Q6Block& high, WideQ6Block& out) {
  for (int c = 0; c < 8; ++c) {
    for (int j = 0; j < 8; ++j) out.codes[c][j] = join(low.codes[c][j], high.codes[c][j]);
  }
  for (int j = 0; j < 16; ++j) out.scales[j] = join(low.scales[j], high.scales[j]);
  for (int m = 0; m < 8; ++m) out.pairs[m] = join(low.pairs[m], high.pairs[m]);
  out.d = join(low.d, high.d);
}

[[gnu::always_inline]] inline void join_into(const KBlock& low, const KBlock& high, WideKBlock& out) {
  for (int c = 0; c < 8; ++c) {
    for (int j = 0; j < 8; ++j) out.codes[c][j] = join(low.codes[c][j], high.codes[c][j]);
    out.scales[c] = join(low.scales[c], high.scales[c]);
    out.minimums[c] = join(low.minimums[c], high.minimums[c]);
  }
  out.d = join(low.d, high.d);
  out.ndmin = join(low.ndmin, high.ndmin);
}

// Block b of weight rows w .. w + (g − 1)·row_bytes, g ≤ 16 (the rest zero): two eight-row Blocks joined.
template <int64_t TYPE>
[[gnu::always_inline]] inline void load_wide(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b,
                                             WideBlockOf<TYPE>& out) {
  BlockOf<TYPE> low, high;
  load_block<TYPE>(w, row_bytes, g < 8 ? g : 8, b, low);
  load_block<TYPE>(w + 8 * row_bytes, row_bytes, g > 8 ? g - 8 : 0, b, high);
  join_into(low, high, out);
}

[[gnu::always_inline]] inline __m512i broadcast_wide(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

// block_rows (ggml_dot.h) for sixteen weight rows.
template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void wide_rows(const WideSmallBlock& blk, const ActivationView& x, int64_t r0, int64_t b,
                                             __m512* acc) {
  constexpr bool has_min = TYPE == Q4_1 || TYPE == Q5_1;
  constexpr int offset = small_offset(TYPE);
  for (int t = 0; t < R; ++t) {
    const int64_t r = r0 + t, at = r * x.per_row_blocks + b;
    const int8_t* p = x.codes + r * x.k + 32 * b;
    __m512i sums = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) sums = _mm512_dpbusd_epi32(sums, blk.codes[j], broadcast_wide(p + 4 * j));
    if (offset != 0) sums = _mm512_sub_epi32(sums, _mm512_set1_epi32(offset * x.sums[at]));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(blk.d, _mm512_set1_ps(x.d[at])), acc[t]);
    if (has_min) acc[t] = _mm512_fmadd_ps(blk.m, _mm512_set1_ps(x.s[at]), acc[t]);
  }
}

template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void wide_rows(const WideQ6Block& blk, const ActivationView& x, int64_t r0, int64_t b,
                                             __m512* acc) {
  for (int t = 0; t < R; ++t) {
    const int64_t r = r0 + t, at = r * x.per_row_blocks + b;
    const int8_t* p = x.codes + r * x.k + 256 * b;
    __m512i sums = _mm512_setzero_si512();
    for (int c = 0; c < 8; ++c) {
      __m512i first = _mm512_setzero_si512(), second = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) first = _mm512_dpbusd_epi32(first, blk.codes[c][j], broadcast_wide(p + 32 * c + 4 * j));
      for (int j = 4; j < 8; ++j) {
        second = _mm512_dpbusd_epi32(second, blk.codes[c][j], broadcast_wide(p + 32 * c + 4 * j));
      }
      sums = _mm512_add_epi32(sums, _mm512_add_epi32(_mm512_mullo_epi32(first, blk.scales[2 * c]),
                                                     _mm512_mullo_epi32(second, blk.scales[2 * c + 1])));
    }
    const int16_t* bsums = x.bsums + at * 16;
    __m512i offsets = _mm512_setzero_si512();
    for (int m = 0; m < 8; ++m) {
      int32_t pair;
      std::memcpy(&pair, bsums + 2 * m, 4);
      offsets = _mm512_add_epi32(offsets, _mm512_madd_epi16(blk.pairs[m], _mm512_set1_epi32(pair)));
    }
    const __m512i total = _mm512_sub_epi32(sums, _mm512_slli_epi32(offsets, 5));
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(blk.d, _mm512_set1_ps(x.d[at])), acc[t]);
  }
}

template <int R, int64_t TYPE>
[[gnu::always_inline]] inline void wide_rows(const WideKBlock& blk, const ActivationView& x, int64_t r0, int64_t b,
                                             __m512* acc) {
  __m512i sums[R];
  for (int t = 0; t < R; ++t) sums[t] = _mm512_setzero_si512();
  for (int c = 0; c < 8; ++c) {
    for (int t = 0; t < R; ++t) {
      const int8_t* p = x.codes + (r0 + t) * x.k + 256 * b + 32 * c;
      __m512i part = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) part = _mm512_dpbusd_epi32(part, blk.codes[c][j], broadcast_wide(p + 4 * j));
      sums[t] = _mm512_add_epi32(sums[t], _mm512_mullo_epi32(part, blk.scales[c]));
    }
  }
  for (int t = 0; t < R; ++t) {
    const int64_t at = (r0 + t) * x.per_row_blocks + b;
    const int16_t* bsums = x.bsums + at * 16;
    __m512i offsets = _mm512_setzero_si512();
    for (int c = 0; c < 8; ++c) {
      int32_t pair;
      std::memcpy(&pair, bsums + 2 * c, 4);
      offsets = _mm512_add_epi32(offsets, _mm512_madd_epi16(blk.minimums[c], _mm512_set1_epi32(pair)));
    }
    const __m512 xd = _mm512_set1_ps(x.d[at]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t]), _mm512_mul_ps(blk.d, xd), acc[t]);
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(offsets), _mm512_mul_ps(blk.ndmin, xd), acc[t]);
  }
}

// The group drivers' 512-bit width (ggml_dot.h: Narrow, fused_tile, type_group).
struct Wide {
  static constexpr int64_t kRows = kWideRows;
  static constexpr bool kFileRows = true;
  using Acc = __m512;
  template <int64_t TYPE>
  using Block = WideBlockOf<TYPE>;
  static Acc zero() { return _mm512_setzero_ps(); }
  static void store(float* lanes, Acc v) { _mm512_storeu_ps(lanes, v); }
  template <int64_t TYPE>
  static void load(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b, Block<TYPE>& out) {
    load_wide<TYPE>(w, row_bytes, g, b, out);
  }
  template <int R, int64_t TYPE>
  static void rows(const Block<TYPE>& blk, const ActivationView& x, int64_t r0, int64_t b, Acc* acc) {
    wide_rows<R, TYPE>(blk, x, r0, b, acc);
  }
};

// group() for sixteen weight rows (g ≤ 16 of them real).
inline void wide_group(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x,
                       int64_t rows, float* y, int64_t width) {
  group<Wide>(type, w, row_bytes, g, k, x, rows, y, width);
}

}  // namespace PROCTOR_GGML_NAMESPACE
