// What the q4 kernel's files share: the block formats and a plain view of quantized activations.
#pragma once

#include <cstdint>

namespace proctor_q4 {

constexpr int64_t kBlock = 32;  // inputs per block
constexpr int64_t kGroup = 8;   // output rows interleaved together
// Bytes per block of a group of 8 rows: float16 scales and minimums, then 4-bit codes (Q4_1: 8 · 20);
// float16 scales, then 8-bit codes (Q8_0: 8 · 34). A group stores all its blocks' scales, then all
// minimums, then all codes (q4_dot.h: the codes' order).
constexpr int64_t kQ4GroupBytes = 8 * 20;
constexpr int64_t kQ8GroupBytes = 8 * 34;

// Activations as int8 blocks: row r's codes at codes + r·blocks·32, its scales and scaled sums at
// scale + r·blocks.
struct Activations {
  const int8_t* codes;
  const float* scale;
  const float* scaled_sum;
  int64_t blocks;  // per row
};

// One group of 8 weight rows times `rows` activation rows with AVX-512 VNNI (q4_vnni.cpp), into
// y[r·n + 8g ..]; the same bits as the AVX2 loops.
void group_rows_vnni(bool q4, const uint8_t* group, const Activations& x, int64_t rows, float* y, int64_t n, int64_t g);

// Whether the VNNI copies of the inner loops run (q4_decode.cpp: present, and not turned off with
// q4_loops("avx2")); the gguf products follow the same switch.
bool vnni_loops();

}  // namespace proctor_q4
