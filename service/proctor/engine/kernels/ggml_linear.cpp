// The gguf weights mode: matrix products straight on a GGUF file's own blocks, whatever their type
// (ggml_blocks.h: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32), and one decode
// step of a layer around them (layer_step.h), its q, k, v (and gate, up) products each of its own type
// as a Q4_K_M file mixes them.
//
// A weight is [out, row bytes] uint8, the file's rows unchanged. Each output is computed whole by one
// thread: per block, the weight's codes are unpacked once and multiplied by a tile of up to 4 activation
// rows; every block's integer sum is exact and scaled in float in block order. So a row's result is the
// same bits alone or in any batch, at any thread count (tests/unit/test_ggml_blocks.py).
#include <torch/library.h>

#include <array>
#include <vector>

#include "ggml_blocks.h"
#include "layer_step.h"

namespace {

using namespace proctor_ggml;
using proctor_kernels::check_float;
using proctor_kernels::horizontal_sum;

constexpr int64_t kTile = 8;  // activation rows per pass over a weight row's blocks (each block unpacked once)

inline int32_t horizontal_sum_i32(__m256i v) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(x);
}

// Activations of `rows` rows of k inputs in the form one weight type takes (ggml_blocks.h).
struct Activations {
  Activation kind = Activation::f32;
  int64_t rows = 0, k = 0, per_row_blocks = 0;
  std::vector<int8_t> codes;
  std::vector<float> d, s, values;
  std::vector<int16_t> bsums;

  ActivationRow row(int64_t r) {
    return {codes.data() + r * k, d.data() + r * per_row_blocks, s.data() + r * per_row_blocks,
            bsums.data() + r * per_row_blocks * 16, values.data() + r * k};
  }

  void quantize(Activation wanted, const float* x, int64_t count, int64_t inputs) {
    kind = wanted, rows = count, k = inputs;
    const bool blocked = wanted == Activation::q8_0 || wanted == Activation::q8_1 || wanted == Activation::q8_k;
    per_row_blocks = wanted == Activation::q8_k ? k / 256 : k / 32;
    codes.resize(blocked ? rows * k : 0);
    d.resize(blocked ? rows * per_row_blocks : 0);
    s.resize(wanted == Activation::q8_1 ? rows * per_row_blocks : 0);
    bsums.resize(wanted == Activation::q8_k ? rows * per_row_blocks * 16 : 0);
    values.resize(blocked ? 0 : rows * k);
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        ActivationRow out = row(r);
        const float* v = x + r * k;
        switch (wanted) {
          case Activation::q8_0: quantize_q8_0(v, k, out, false); break;
          case Activation::q8_1: quantize_q8_0(v, k, out, true); break;
          case Activation::q8_k: quantize_q8_k(v, k, out); break;
          case Activation::f16:
            for (int64_t i = 0; i < k; ++i) out.values[i] = _cvtsh_ss(half_bits(v[i]));
            break;
          case Activation::bf16:
            for (int64_t i = 0; i < k; ++i) out.values[i] = bf16_value(bf16_bits(v[i]));
            break;
          case Activation::f32: std::copy(v, v + k, out.values); break;
        }
      }
    });
  }
};

// A K-quant block's codes as 8 vectors of 32 unsigned bytes (Q4_K 0..15, Q5_K 0..31, Q6_K q + 32)
// and its scales as int16 lanes per vector (the low 128 bits the first 16 inputs' scale, the high the
// next 16's); minimums per 16 inputs (Q4_K/Q5_K): the same as unpack_k, in vector registers.
struct KVectors {
  __m256i codes[8], scales[8], minimums;  // minimums: 16 int16, min of inputs 16i..16i+15
  __m256i scales16;                       // Q6_K: its 16 scales as int16
  float d, dmin;
};

__attribute__((always_inline)) inline void unpack_k_vectors(int64_t type, const uint8_t* block, KVectors& out) {
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
  // The 8 six-bit scales and minimums (scale_min_k4) unpacked in four 32-bit words, as llama.cpp does:
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
__attribute__((always_inline)) inline void k_rows(int64_t type, const uint8_t* w, int64_t blocks, int64_t block_bytes, Activations& x, int64_t r0,
            float* out) {
  KVectors kv;
  __m256 acc[R];
  for (int t = 0; t < R; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    unpack_k_vectors(type, w + b * block_bytes, kv);
    for (int t = 0; t < R; ++t) {
      const int64_t r = r0 + t;
      const int8_t* p = x.codes.data() + r * x.k + 256 * b;
      const __m256i bsums =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums.data() + (r * x.per_row_blocks + b) * 16));
      __m256i sums = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i pc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * c));
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(kv.codes[c], pc), kv.scales[c]));
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
  for (int t = 0; t < R; ++t) out[t] = horizontal_sum(acc[t]);
}

// A 32-input block's codes as one vector of int8 (the same values as unpack_small), its d and m.
__attribute__((always_inline)) inline __m256i unpack_small_vector(int64_t type, const uint8_t* block, float& d, float& m) {
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
__attribute__((always_inline)) inline void small_rows(int64_t type, const uint8_t* w, int64_t blocks, int64_t block_bytes, Activations& x, int64_t r0,
                float* out) {
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
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.codes.data() + r * x.k + 32 * b));
      const __m256i pairs = unsigned_codes ? _mm256_maddubs_epi16(codes, p)
                                           : _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(p, codes));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), _mm256_set1_ps(d * x.d[at]), acc[t]);
      if (unsigned_codes) minimums[t] += m * x.s[at];
    }
  }
  for (int t = 0; t < R; ++t) out[t] = horizontal_sum(acc[t]) + minimums[t];
}

template <int R>
__attribute__((always_inline)) inline void float_rows(int64_t type, const uint8_t* w, int64_t k, Activations& x, int64_t r0, float* out) {
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
    for (int t = 0; t < R; ++t) acc[t] = _mm256_fmadd_ps(weights, _mm256_loadu_ps(x.row(r0 + t).values + i), acc[t]);
  }
  for (int t = 0; t < R; ++t) out[t] = horizontal_sum(acc[t]);
}

template <int R>
void tile(int64_t type, const Layout& layout, const uint8_t* w, int64_t k, Activations& x, int64_t r0, float* out) {
  if (layout.elements == 256) {
    k_rows<R>(type, w, k / 256, layout.bytes, x, r0, out);
  } else if (layout.elements == 32) {
    small_rows<R>(type, w, k / 32, layout.bytes, x, r0, out);
  } else {
    float_rows<R>(type, w, k, x, r0, out);
  }
}

Layout checked_layout(const at::Tensor& blocks, int64_t type, int64_t k) {
  Layout layout;
  TORCH_CHECK(layout_of(type, layout), "ggml type ", type, " has no product here");
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                  blocks.dim() == 2,
              "weight blocks must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(k % std::max<int64_t>(layout.elements, 8) == 0 && blocks.size(1) == k / layout.elements * layout.bytes,
              "weight rows of ", blocks.size(1), " bytes do not match ", k, " inputs of ggml type ", type);
  return layout;
}

// y[:, column .. column + out) of a [rows, width] result = x · Wᵀ, with x already in W's activation form.
void product_into(Activations& x, const at::Tensor& blocks, int64_t type, float* y, int64_t width, int64_t column) {
  const Layout layout = checked_layout(blocks, type, x.k);
  const int64_t n = blocks.size(0), row_bytes = blocks.size(1), rows = x.rows;
  const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(4, 65536 / std::max<int64_t>(1, row_bytes * std::min(rows, kTile)));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    float out[kTile];
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t count = std::min(kTile, rows - r0);
      for (int64_t j = begin; j < end; ++j) {
        const uint8_t* w = wp + j * row_bytes;
        switch (count) {
          case 8: tile<8>(type, layout, w, x.k, x, r0, out); break;
          case 7: tile<7>(type, layout, w, x.k, x, r0, out); break;
          case 6: tile<6>(type, layout, w, x.k, x, r0, out); break;
          case 5: tile<5>(type, layout, w, x.k, x, r0, out); break;
          case 4: tile<4>(type, layout, w, x.k, x, r0, out); break;
          case 3: tile<3>(type, layout, w, x.k, x, r0, out); break;
          case 2: tile<2>(type, layout, w, x.k, x, r0, out); break;
          default: tile<1>(type, layout, w, x.k, x, r0, out); break;
        }
        for (int64_t t = 0; t < count; ++t) y[(r0 + t) * width + column + j] = out[t];
      }
    }
  });
}

Activation activation_for(int64_t type) {
  Layout layout;
  TORCH_CHECK(layout_of(type, layout), "ggml type ", type, " has no product here");
  return layout.activation;
}

// x [rows, k] · Wᵀ for several weights of any types sharing the input (q, k, v; gate, up): [rows, Σ out].
at::Tensor products(const float* x, int64_t rows, int64_t k, at::TensorList weights, at::IntArrayRef types,
                    const at::TensorOptions& options) {
  TORCH_CHECK(weights.size() == types.size() && !weights.empty(), "one ggml type per weight");
  int64_t width = 0;
  for (const at::Tensor& w : weights) width += w.size(0);
  at::Tensor y = at::empty({rows, width}, options);
  std::array<Activations, 6> forms;  // each activation form quantized at most once
  std::array<bool, 6> ready{};
  int64_t column = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto form = static_cast<size_t>(activation_for(types[i]));
    if (!ready[form]) forms[form].quantize(static_cast<Activation>(form), x, rows, k), ready[form] = true;
    product_into(forms[form], weights[i], types[i], y.data_ptr<float>(), width, column);
    column += weights[i].size(0);
  }
  return y;
}

at::Tensor ggml_linear(const at::Tensor& x, const at::Tensor& blocks, int64_t type) {
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, inputs]");
  return products(x.const_data_ptr<float>(), x.size(0), x.size(1), {blocks}, {type}, x.options());
}

// Rows `ids` of a weight as float32, each value as ggml dequantizes it: token embeddings.
at::Tensor ggml_rows(const at::Tensor& blocks, int64_t type, int64_t k, const at::Tensor& ids) {
  const Layout layout = checked_layout(blocks, type, k);
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1, "ids must be a 1-D int64 tensor");
  at::Tensor out = at::empty({ids.size(0), k}, blocks.options().dtype(at::kFloat));
  const int64_t* ip = ids.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.size(0); ++r) {
    TORCH_CHECK(ip[r] >= 0 && ip[r] < blocks.size(0), "row ", ip[r], " out of range");
    const uint8_t* w = blocks.const_data_ptr<uint8_t>() + ip[r] * blocks.size(1);
    float* o = out.data_ptr<float>() + r * k;
    if (layout.elements == 256) {
      KBlock kb;
      for (int64_t b = 0; b < k / 256; ++b, w += layout.bytes) {
        unpack_k(type, w, kb);
        for (int i = 0; i < 256; ++i) {
          const float scale = kb.d * static_cast<float>(kb.scales[i / 16]);
          o[256 * b + i] = type == Q6_K ? scale * static_cast<float>(kb.codes[i] - 32)
                                        : scale * static_cast<float>(kb.codes[i]) - kb.dmin * static_cast<float>(kb.mins[i / 32]);
        }
      }
    } else if (layout.elements == 32) {
      SmallBlock sb;
      for (int64_t b = 0; b < k / 32; ++b, w += layout.bytes) {
        unpack_small(type, w, sb);
        for (int i = 0; i < 32; ++i) o[32 * b + i] = sb.d * static_cast<float>(sb.codes[i]) + sb.m;
      }
    } else {
      for (int64_t i = 0; i < k; ++i) {
        uint16_t bits;
        std::memcpy(&bits, w + 2 * i, 2);
        o[i] = type == F16 ? _cvtsh_ss(bits) : type == BF16 ? bf16_value(bits) : reinterpret_cast<const float*>(w)[i];
      }
    }
  }
  return out;
}

void decode_layer_ggml(at::Tensor& h, const at::Tensor& in_norm, at::TensorList qkv, at::IntArrayRef qkv_types,
                       const at::Tensor& o, int64_t o_type, const at::Tensor& post_norm, at::TensorList gate_up,
                       at::IntArrayRef gate_up_types, const at::Tensor& down, int64_t down_type, at::Tensor& keys,
                       at::Tensor& values, at::IntArrayRef positions, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t heads, int64_t kv_heads, double eps, const std::optional<at::Tensor>& qkv_bias,
                       const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, int64_t window,
                       double scale, double softcap, const std::optional<at::Tensor>& attn_out_norm,
                       const std::optional<at::Tensor>& mlp_out_norm, bool gelu,
                       const std::optional<at::Tensor>& o_bias, const std::optional<at::Tensor>& gate_up_bias,
                       const std::optional<at::Tensor>& down_bias) {
  using proctor_kernels::Product;
  const at::TensorOptions options = h.options();
  const proctor_kernels::LayerExtras extras = proctor_kernels::layer_extras(
      qkv_bias, q_norm, k_norm, window, scale, softcap, attn_out_norm, mlp_out_norm, gelu, o_bias, gate_up_bias,
      down_bias, heads, kv_heads, keys.size(3), h.size(1));
  auto project = [&](Product which, const float* x, int64_t rows, int64_t k, std::vector<float>& scales) {
    std::fill(scales.begin(), scales.end(), 1.f);
    switch (which) {
      case Product::qkv: return products(x, rows, k, qkv, qkv_types, options);
      case Product::gate_up: return products(x, rows, k, gate_up, gate_up_types, options);
      case Product::o: return products(x, rows, k, {o}, {o_type}, options);
      default: return products(x, rows, k, {down}, {down_type}, options);
    }
  };
  proctor_kernels::decode_layer_with(h, in_norm, post_norm, keys, values, positions, cos, sin, heads, kv_heads, eps,
                                     project, extras);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(proctor, m) {
  m.def("ggml_linear(Tensor x, Tensor blocks, int type) -> Tensor");
  m.def("ggml_rows(Tensor blocks, int type, int k, Tensor ids) -> Tensor");
  m.def(
      "decode_layer_ggml(Tensor(a!) h, Tensor in_norm, Tensor[] qkv, int[] qkv_types, Tensor o, int o_type, "
      "Tensor post_norm, Tensor[] gate_up, int[] gate_up_types, Tensor down, int down_type, Tensor(b!) keys, "
      "Tensor(c!) values, int[] positions, Tensor cos, Tensor sin, int heads, int kv_heads, float eps, "
      "Tensor? qkv_bias=None, Tensor? q_norm=None, Tensor? k_norm=None, int window=0, float scale=0., "
      "float softcap=0., Tensor? attn_out_norm=None, Tensor? mlp_out_norm=None, bool gelu=False, "
      "Tensor? o_bias=None, Tensor? gate_up_bias=None, Tensor? down_bias=None) -> ()");
}

TORCH_LIBRARY_IMPL(proctor, CPU, m) {
  m.impl("ggml_linear", &ggml_linear);
  m.impl("ggml_rows", &ggml_rows);
  m.impl("decode_layer_ggml", &decode_layer_ggml);
}
