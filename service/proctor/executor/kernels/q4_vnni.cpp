// The q4 products' inner loops with AVX-512 VNNI (q4_dot.h says why they give the AVX2 loops' bits).
// Only this file is compiled for those instructions, under a target pragma, and it includes nothing that
// other files also compile: no inline function built here can be picked for a machine without them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "q4_types.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define PROCTOR_VNNI 1
#define PROCTOR_DOT_NAMESPACE proctor_q4_vnni
#include "q4_dot.h"

namespace proctor_q4 {

void group_rows_vnni(bool q4, const uint8_t* group, const Activations& x, int64_t rows, float* y, int64_t n, int64_t g) {
  proctor_q4_vnni::group_rows_any(q4, group, x, rows, y, n, g);
}

}  // namespace proctor_q4
#pragma GCC pop_options
