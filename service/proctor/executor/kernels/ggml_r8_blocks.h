// Q4_K weights grouped eight rows to a group (ggml_r8.h's layout) read straight as the many-row loops' KBlocks
// (ggml_dot.h), and two groups as the VNNI copy's sixteen-row WideKBlocks (ggml_wide.h). A group already holds row r
// in lane r, 4 bytes of it a 32-bit lane, so a KBlock's transposed vectors are its bytes masked (low nibbles) and
// shifted (high nibbles), and its scales and minimums r8_scale_lanes' vectors: no transposes, and no copy of the
// file's layout. The Blocks hold the very integers load_block makes from the file's rows, so every product keeps its
// bits (tests/unit/test_q4k_repack.py). Compiled in both copies after ggml_dot.h (and ggml_wide.h in the VNNI one).
#pragma once

namespace PROCTOR_GGML_NAMESPACE {

// Eight rows' scales (sc[j], lane r: row r's scale of sub-block j) and minimums (mn[j]) as 32-bit lanes 0 .. 63, from
// the group's three scale words: ggml's get_scale_min_k4 for the eight rows at once.
[[gnu::always_inline]] inline void r8_scale_lanes(const uint8_t* group, __m256i* sc, __m256i* mn) {
  const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32));
  const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 64));
  const __m256i w2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 96));
  const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f);
  const __m256i low2 = _mm256_set1_epi32(0x03030303);
  // bytes 0-3: scales 0-3; 4-7: scales 4-7; then minimums 0-3 and 4-7 (llama.cpp's utmp words)
  const __m256i words[4] = {
      _mm256_and_si256(w0, low6),
      _mm256_or_si256(_mm256_and_si256(w2, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), low2), 4)),
      _mm256_and_si256(w1, low6),
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                      _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), low2), 4))};
  const __m256i byte = _mm256_set1_epi32(0xFF);
  for (int j = 0; j < 8; ++j) {
    const int shift = 8 * (j % 4);
    sc[j] = _mm256_and_si256(_mm256_srli_epi32(words[j / 4], shift), byte);
    mn[j] = _mm256_and_si256(_mm256_srli_epi32(words[2 + j / 4], shift), byte);
  }
}

[[gnu::always_inline]] inline __m256i int16_pair(__m256i v) { return _mm256_or_si256(v, _mm256_slli_epi32(v, 16)); }

// Block b of the group at `group` as the KBlock load_block<Q4_K> makes of the same eight rows in the file's layout.
[[gnu::always_inline]] inline void load_r8_block(const uint8_t* group, int64_t b, KBlock& out) {
  const uint8_t* block = group + b * kR8Bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {  // 64 inputs: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    for (int l = 0; l < 8; ++l) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * (8 * c + l)));
      out.codes[2 * c][l] = _mm256_and_si256(v, low4);
      out.codes[2 * c + 1][l] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    }
  }
  __m256i sc[8], mn[8];
  r8_scale_lanes(block, sc, mn);
  for (int j = 0; j < 8; ++j) {
#ifdef PROCTOR_VNNI
    out.scales[j] = sc[j];
#else
    out.scales[j] = int16_pair(sc[j]);
#endif
    out.minimums[j] = int16_pair(mn[j]);
  }
  out.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  out.ndmin = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16))),
                            _mm256_set1_ps(-0.f));
}

// The group drivers' Narrow width over groups: w is an item's first group, row_bytes the file's row (a group is
// 8·row_bytes), g = 8. The few-row loop reads the file's rows, so it is not taken (kFileRows).
struct NarrowGroups : Narrow {
  static constexpr bool kFileRows = false;
  template <int64_t TYPE>
  static void load(const uint8_t* w, int64_t, int64_t, int64_t b, Block<TYPE>& out) {
    static_assert(TYPE == Q4_K, "only Q4_K weights are grouped");
    load_r8_block(w, b, out);
  }
};

#ifdef PROCTOR_VNNI
// Sixteen rows: two groups side by side (the second all zero where the item has only g = 8 rows, as load_wide does).
struct WideGroups : Wide {
  static constexpr bool kFileRows = false;
  template <int64_t TYPE>
  static void load(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t b, Block<TYPE>& out) {
    static_assert(TYPE == Q4_K, "only Q4_K weights are grouped");
    KBlock low, high;
    load_r8_block(w, b, low);
    if (g > 8) {
      load_r8_block(w + 8 * row_bytes, b, high);
    } else {
      high = KBlock{};
    }
    join_into(low, high, out);
  }
};
#endif

// Every activation row (rows of them, more than the grouped few-row loop takes) times the W::kRows rows of the groups
// at w (g of those rows real): y[r·width + i], as group(Q4_K, …) gives for the same rows in the file's layout.
template <class W>
inline void groups_q4_k(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x,
                        int64_t rows, float* y, int64_t width) {
  type_group<W, Q4_K>(w, row_bytes, g, k / 256, x, rows, y, width);
}

}  // namespace PROCTOR_GGML_NAMESPACE
