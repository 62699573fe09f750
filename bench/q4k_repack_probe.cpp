// A probe, not part of the build: what a Q4_K one-row product gains when eight weight rows are interleaved at load
// (issue 57's lever for one stream: llama.cpp's --repack), on this machine, with the same integers as Proctor's
// loops (each block's S = Σ scale·Σ q·a and M = Σ minimum·Σ a, per weight row, checked here against a scalar
// reference on the ggml layout) and the same float epilogue (acc = fma(S, d·x_d, acc); acc = fma(M, −dmin·x_d, acc)).
// The 8 rows' codes lie so that one 32-byte load holds 4 bytes of each row (lane r: row r), the activations are
// broadcast 4 bytes at a time, the pairs' int16 sums of a 32-input sub-block are added before one madd by the
// scales (at most 16·15·128 = 30,720: no overflow), so no horizontal sums and no per-block scale unpacking.
// Data: 24 matrices of 8192 × 2048 random Q4_K blocks (the 1.7B rung's ffn_gate shape, past the caches).
//
//   g++ -O3 -mavx2 -mfma -mf16c -fopenmp bench/q4k_repack_probe.cpp -o /tmp/q4k_repack_probe && /tmp/q4k_repack_probe
//
// Compare with Proctor's loops on the real file: bench/kernel_ab.py FILE --matrices 'blk.*.ffn_gate.weight' --rows 1
// (bench/README.md, "One stream against llama-server").
// Microbenchmark: a Q4_K one-row product on an 8-row interleaved layout (repacked at load), AVX2.
// Checks S/M integers against a scalar reference on the ggml layout; times GB/s of the original bytes.
#include <immintrin.h>
#include <omp.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <chrono>
#include <random>
#include <algorithm>

struct BlockQ4K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };  // 144 bytes
static void scale_min(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {  // ggml get_scale_min_k4
  if (j < 4) { d = q[j] & 63; m = q[j + 4] & 63; }
  else { d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}
// repacked 8-row block: d[8], dmin[8] (fp16), scales[8 sub][8 rows] u8, mins[8 sub][8 rows] u8 -> as int16 for madd,
// qs[4 g][8 l4][8 rows][4 bytes]
struct Rep { uint16_t d[8], dmin[8]; int16_t sc[8][8]; int16_t mn[8][8]; uint8_t qs[4][8][8][4]; };
// sizes: 32 + 128 + 128 + 1024 = 1312 bytes per 8 rows (vs 1152): int16 scales for speed in this test
static void repack(const BlockQ4K* rows[8], Rep& o) {
  for (int r = 0; r < 8; ++r) {
    o.d[r] = rows[r]->d; o.dmin[r] = rows[r]->dmin;
    for (int j = 0; j < 8; ++j) { uint8_t s, m; scale_min(j, rows[r]->scales, s, m); o.sc[j][r] = s; o.mn[j][r] = m; }
    for (int g = 0; g < 4; ++g) for (int l = 0; l < 8; ++l) std::memcpy(o.qs[g][l][r], rows[r]->qs + 32 * g + 4 * l, 4);
  }
}
// ggml Q4_K qs layout: for g in 0..3 (64 inputs each): qs[32g + l] low nibble -> input 64g + l, high -> 64g + 32 + l
// activations: int8 a[256], bsums[16] (sums of 16)
static void reference(const BlockQ4K& b, const int8_t* a, int32_t& S, int32_t& M) {
  S = 0; M = 0;
  for (int g = 0; g < 4; ++g) {
    uint8_t s0, m0, s1, m1; scale_min(2 * g, b.scales, s0, m0); scale_min(2 * g + 1, b.scales, s1, m1);
    int32_t lo = 0, hi = 0, alo = 0, ahi = 0;
    for (int l = 0; l < 32; ++l) {
      lo += (b.qs[32 * g + l] & 15) * a[64 * g + l]; hi += (b.qs[32 * g + l] >> 4) * a[64 * g + 32 + l];
      alo += a[64 * g + l]; ahi += a[64 * g + 32 + l];
    }
    S += s0 * lo + s1 * hi; M += m0 * alo + m1 * ahi;
  }
}
// one activation row: S and M lanes (lane r = row r) for one repacked block
static inline void rep_lanes(const Rep& o, const int8_t* a, const int16_t* bsums, __m256i& S, __m256i& M) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i s32 = _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {
    __m256i lo16 = _mm256_setzero_si256(), hi16 = _mm256_setzero_si256();
    for (int l = 0; l < 8; ++l) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(o.qs[g][l]));
      const __m256i alo = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(a + 64 * g + 4 * l));
      const __m256i ahi = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(a + 64 * g + 32 + 4 * l));
      lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(_mm256_and_si256(v, low4), alo));
      hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), ahi));
    }
    // lane r: two int16 of row r; scale as (s, s) int16 pair: widen the int16 scales of 8 rows to 32-bit lanes
    const __m256i s0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o.sc[2 * g])));
    const __m256i s1 = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o.sc[2 * g + 1])));
    const __m256i p0 = _mm256_or_si256(s0, _mm256_slli_epi32(s0, 16)), p1 = _mm256_or_si256(s1, _mm256_slli_epi32(s1, 16));
    s32 = _mm256_add_epi32(s32, _mm256_add_epi32(_mm256_madd_epi16(lo16, p0), _mm256_madd_epi16(hi16, p1)));
  }
  S = s32;
  // M lane r = sum_j mn[j][r] * (bsums[2j] + bsums[2j+1])
  __m256i m32 = _mm256_setzero_si256();
  for (int j = 0; j < 8; ++j) {
    const int32_t pair = bsums[2 * j] + bsums[2 * j + 1];
    const __m256i mins = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o.mn[j])));
    m32 = _mm256_add_epi32(m32, _mm256_mullo_epi32(mins, _mm256_set1_epi32(pair)));
  }
  M = m32;
}

int main(int argc, char** argv) {
  const int rows = 8192, k = 2048, nb = k / 256, mats = 24;
  std::mt19937 rng(1);
  std::vector<BlockQ4K> w(size_t(rows) * nb * mats);
  for (auto& b : w) { b.d = 0x3c00; b.dmin = 0x3800; for (auto& s : b.scales) s = rng(); for (auto& q : b.qs) q = rng(); }
  std::vector<Rep> rep(size_t(rows / 8) * nb * mats);
  for (int m = 0; m < mats; ++m) for (int g = 0; g < rows / 8; ++g) for (int b = 0; b < nb; ++b) {
    const BlockQ4K* r8[8]; for (int r = 0; r < 8; ++r) r8[r] = &w[(size_t(m) * rows + g * 8 + r) * nb + b];
    repack(r8, rep[(size_t(m) * (rows / 8) + g) * nb + b]);
  }
  std::vector<int8_t> a(k); std::vector<int16_t> bs(k / 16);
  for (auto& x : a) x = int8_t(rng() % 255 - 127);
  for (int i = 0; i < k / 16; ++i) { int s = 0; for (int j = 0; j < 16; ++j) s += a[16 * i + j]; bs[i] = s; }
  // check
  for (int t = 0; t < 1000; ++t) {
    int m = rng() % mats, g = rng() % (rows / 8), b = rng() % nb;
    __m256i S, M; rep_lanes(rep[(size_t(m) * (rows / 8) + g) * nb + b], a.data() + 256 * b, bs.data() + 16 * b, S, M);
    alignas(32) int32_t s[8], mm[8]; _mm256_store_si256((__m256i*)s, S); _mm256_store_si256((__m256i*)mm, M);
    for (int r = 0; r < 8; ++r) { int32_t rs, rm; reference(w[(size_t(m) * rows + g * 8 + r) * nb + b], a.data() + 256 * b, rs, rm);
      if (rs != s[r] || rm != mm[r]) { printf("MISMATCH\n"); return 1; } }
  }
  printf("integers match the reference\n");
  std::vector<float> y(rows);
  const float xd = 0.01f;
  for (int threads : {1, 2, 1, 2}) {
    omp_set_num_threads(threads);
    std::vector<double> times;
    for (int rep_i = 0; rep_i < 9; ++rep_i) {
      auto t0 = std::chrono::steady_clock::now();
      for (int m = 0; m < mats; ++m) {
        #pragma omp parallel for schedule(static)
        for (int g = 0; g < rows / 8; ++g) {
          __m256 acc = _mm256_setzero_ps();
          for (int b = 0; b < nb; ++b) {
            const Rep& o = rep[(size_t(m) * (rows / 8) + g) * nb + b];
            _mm_prefetch(reinterpret_cast<const char*>(&o) + 4096, _MM_HINT_T0);
            __m256i S, M; rep_lanes(o, a.data() + 256 * b, bs.data() + 16 * b, S, M);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)o.d));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)o.dmin));
            const __m256 vx = _mm256_set1_ps(xd);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(d, vx), acc);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(_mm256_sub_ps(_mm256_setzero_ps(), dm), vx), acc);
          }
          _mm256_storeu_ps(y.data() + 8 * g, acc);
        }
      }
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double bytes = double(w.size()) * 144;
    printf("threads %d: %.2f ms, %.1f GB/s of ggml bytes (%.1f GB/s of repacked)\n", threads, times[4] * 1e3,
           bytes / times[4] / 1e9, double(rep.size()) * sizeof(Rep) / times[4] / 1e9);
  }
  return int(y[0] == 12345.f);
}
