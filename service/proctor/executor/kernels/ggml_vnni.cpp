// The gguf products' inner loops with AVX-512 VNNI (ggml_dot.h says which widths, and why they give the
// AVX2 loops' bits). ggml_blocks.h is included before the target pragma, so its inline functions are
// compiled for AVX2 here as everywhere else: no inline function built for VNNI can be picked for a
// machine without it.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ggml_blocks.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define PROCTOR_VNNI 1
#define PROCTOR_GGML_NAMESPACE proctor_ggml_vnni
#include "ggml_dot.h"
#include "ggml_wide.h"
#include "ggml_r8_blocks.h"

namespace proctor_ggml {

void rows_vnni(int64_t count, int64_t type, const uint8_t* w, int64_t k, const ActivationView& x, int64_t r0,
               float* out) {
  proctor_ggml_vnni::rows(count, type, w, k, x, r0, out);
}

void wide_group_vnni(int64_t type, const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x,
                     int64_t rows, float* y, int64_t width) {
  proctor_ggml_vnni::wide_group(type, w, row_bytes, g, k, x, rows, y, width);
}

void wide_groups_vnni(const uint8_t* w, int64_t row_bytes, int64_t g, int64_t k, const ActivationView& x, int64_t rows,
                      float* y, int64_t width) {
  proctor_ggml_vnni::groups_q4_k<proctor_ggml_vnni::WideGroups>(w, row_bytes, g, k, x, rows, y, width);
}

}  // namespace proctor_ggml
#pragma GCC pop_options
