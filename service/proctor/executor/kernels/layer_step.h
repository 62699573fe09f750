// What a decode step of a Llama layer does around its matrix products, shared by the q8 kernel
// (fbgemm's int8 products, q8_decode.cpp) and the q4 kernel (GGUF blocks, q4_decode.cpp): RMSNorm,
// rotary, the float16 KV writes, attention over each row's exact prefix, SiLU and the residuals.
// Every row is computed by the same code in the same order whatever rows run beside it and whichever
// thread takes it, so a row's result is the same bits alone or in a batch, at any thread count.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace proctor_kernels {

// a·b with eight partial sums combined in a fixed order (the compiler turns the inner loop into one
// vector multiply-add; no reassociation beyond what is written here).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

// e^x for 8 floats (Cephes' polynomial, ~1 ulp; inputs clamped to +-88.38): the scalar expf is the
// largest cost of softmax over long prefixes and of SiLU at many rows.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f)), _mm256_set1_ps(88.3762626647949f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}

// e^x over n floats in place (n rounded up to 8: the buffer has room; the extra values are unused).
inline void exp_in_place(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
}

// Attention of `group` query heads (d a multiple of 8, group <= 8) over the n cached keys/values of
// their kv head: scores for all heads from one pass over the keys, softmax, weighted sum of values.
inline __m256 load_half8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// Eight cached values as float32: from the float16 cache, or from a prompt's copy already widened (float16 to
// float32 is exact, so both give the same floats and every sum below the same bits).
inline __m256 load8(const uint16_t* p) { return load_half8(p); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline void store_half(const float* source, int64_t d, uint16_t* target) {  // d a multiple of 8; rounds to nearest even
  for (int64_t c = 0; c < d; c += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(target + c), _mm256_cvtps_ph(_mm256_loadu_ps(source + c), _MM_FROUND_TO_NEAREST_INT));
  }
}

// o[0 .. 8·CHUNKS) = Σ_t (w[t]·inverse) · values[t] over n positions, each of the 8·CHUNKS sums kept in a register
// across t rather than stored and reloaded every position (the same fused multiply-adds, in the same order).
template <int CHUNKS, typename Cached>
[[gnu::always_inline]] inline void weighted_values(const float* w, float inverse, const Cached* values, int64_t n,
                                                   float* o) {
  __m256 sums[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) sums[c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const __m256 wt = _mm256_set1_ps(w[t] * inverse);
    const Cached* v = values + t * 8 * CHUNKS;
    for (int c = 0; c < CHUNKS; ++c) sums[c] = _mm256_fmadd_ps(wt, load8(v + 8 * c), sums[c]);
  }
  for (int c = 0; c < CHUNKS; ++c) _mm256_storeu_ps(o + 8 * c, sums[c]);
}

// Eight vectors' horizontal_sum at once, lane j the sum of v[j]: the very additions horizontal_sum makes, paired the
// same way (lane i with lane i + 4, then those sums 0 with 2 and 1 with 3, then the two), in three rounds of
// shuffles for eight vectors instead of a scalar tail each. Float addition commutes exactly, so each lane is the bits
// horizontal_sum gives.
inline __m256 horizontal_sums8(const __m256* v) {
  __m256 p[4];  // halves of p[i]: v[i]'s lanes 0-3 plus 4-7 (low), v[i + 4]'s (high)
  for (int i = 0; i < 4; ++i) {
    p[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[i], v[i + 4], 0x20), _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
  }
  const __m256 q01 = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 q23 = _mm256_add_ps(_mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(p[2], p[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_hadd_ps(q01, q23);  // lanes: v[0], v[1], v[2], v[3] | v[4], v[5], v[6], v[7]
}

// The G query heads' products with one key, as 8-lane vectors: two partial sums over alternate 8-input chunks
// (chunk c into sum c mod 2), added. G a template argument so the sums stay in registers; D the head size where it
// is one of the common ones (0: d), so the chunk loop unrolls.
template <int G, int D, typename Cached>
[[gnu::always_inline]] inline void key_lanes(const float* q, const Cached* k, int64_t runtime_d, __m256* out) {
  const int64_t d = D > 0 ? D : runtime_d;
  __m256 even[G], odd[G];
  for (int g = 0; g < G; ++g) even[g] = odd[g] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= d; c += 16) {
    const __m256 first = load8(k + c), second = load8(k + c + 8);
    for (int g = 0; g < G; ++g) {
      even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), first, even[g]);
      odd[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c + 8), second, odd[g]);
    }
  }
  if (c < d) {  // d = 16m + 8: the last chunk is an even one
    const __m256 last = load8(k + c);
    for (int g = 0; g < G; ++g) even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + c), last, even[g]);
  }
  for (int g = 0; g < G; ++g) out[g] = _mm256_add_ps(even[g], odd[g]);
}

// The G query heads' scores against keys 0 .. n − 1: each key_lanes summed across lanes and scaled, eight keys'
// sums at a time by horizontal_sums8, the last n mod 8 one by one. With the chunk loop unrolled, a 1,024-token
// prompt's attention went from 0.23 to 0.15 of its products' time (perf samples, bench/README.md); the same bits.
template <int G, int D, typename Cached>
inline void scores(const float* q, const Cached* keys, int64_t n, int64_t d, float scale, float* weights,
                   int64_t padded) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 lanes[G][8], one[G];
    for (int j = 0; j < 8; ++j) {
      key_lanes<G, D>(q, keys + (t + j) * d, d, one);
      for (int g = 0; g < G; ++g) lanes[g][j] = one[g];
    }
    for (int g = 0; g < G; ++g) {
      _mm256_storeu_ps(weights + g * padded + t, _mm256_mul_ps(horizontal_sums8(lanes[g]), scale8));
    }
  }
  for (; t < n; ++t) {
    __m256 one[G];
    key_lanes<G, D>(q, keys + t * d, d, one);
    for (int g = 0; g < G; ++g) weights[g * padded + t] = horizontal_sum(one[g]) * scale;
  }
}

// The largest of w[0 .. n): std::max_element's value, eight lanes at a time (the maximum does not depend on order;
// a −0 found instead of a +0 subtracts to the same values under exp).
inline float peak_of(const float* w, int64_t n) {
  float peak = -std::numeric_limits<float>::infinity();
  int64_t t = 0;
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(w);
    for (t = 8; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(w + t));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    for (const float lane : lanes) peak = std::max(peak, lane);
  }
  for (; t < n; ++t) peak = std::max(peak, w[t]);
  return peak;
}

template <int D, typename Cached>
inline void scores_of(const float* q, int64_t group, const Cached* keys, int64_t n, int64_t d, float scale, float* w0,
                      int64_t padded) {
  switch (group) {
    case 1: scores<1, D>(q, keys, n, d, scale, w0, padded); break;
    case 2: scores<2, D>(q, keys, n, d, scale, w0, padded); break;
    case 3: scores<3, D>(q, keys, n, d, scale, w0, padded); break;
    case 4: scores<4, D>(q, keys, n, d, scale, w0, padded); break;
    case 5: scores<5, D>(q, keys, n, d, scale, w0, padded); break;
    case 6: scores<6, D>(q, keys, n, d, scale, w0, padded); break;
    case 7: scores<7, D>(q, keys, n, d, scale, w0, padded); break;
    default: scores<8, D>(q, keys, n, d, scale, w0, padded); break;
  }
}

template <typename Cached>
inline void attend_group(const float* q, int64_t group, const Cached* keys, const Cached* values, int64_t n, int64_t d,
                  float scale, float* out, std::vector<float>& weights, float softcap = 0.f) {
  const int64_t padded = (n + 7) / 8 * 8;
  weights.assign(group * padded, 0.f);
  float* w0 = weights.data();
  switch (d) {
    case 64: scores_of<64>(q, group, keys, n, d, scale, w0, padded); break;
    case 128: scores_of<128>(q, group, keys, n, d, scale, w0, padded); break;
    default: scores_of<0>(q, group, keys, n, d, scale, w0, padded); break;
  }
  if (softcap > 0.f) {  // cap * tanh(score / cap) (Gemma 2)
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t t = 0; t < n; ++t) weights[g * padded + t] = std::tanh(weights[g * padded + t] / softcap) * softcap;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* w = weights.data() + g * padded;
    const float peak = peak_of(w, n);
    for (int64_t t = 0; t < n; ++t) w[t] -= peak;
    exp_in_place(w, padded);
    __m256 sum8 = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) sum8 = _mm256_add_ps(sum8, _mm256_loadu_ps(w + t));
    float total = horizontal_sum(sum8);
    for (; t < n; ++t) total += w[t];
    const float inverse = 1.f / total;
    float* o = out + g * d;
    switch (d) {  // the weighted sum in registers where the head size allows (the same operations, in order)
      case 64: weighted_values<8>(w, inverse, values, n, o); break;
      case 128: weighted_values<16>(w, inverse, values, n, o); break;
      default:
        std::fill(o, o + d, 0.f);
        for (t = 0; t < n; ++t) {
          const __m256 wt = _mm256_set1_ps(w[t] * inverse);
          const Cached* v = values + t * d;
          for (int64_t c = 0; c < d; c += 8) {
            _mm256_storeu_ps(o + c, _mm256_fmadd_ps(wt, load8(v + c), _mm256_loadu_ps(o + c)));
          }
        }
    }
  }
}

inline void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
}

// Run body(r) for every row on torch's threads, ROW_GRAIN rows a job. Each row is computed by the same
// operations whichever thread takes it, so this changes no bit; it only matters once a step holds many rows
// (a prompt chunk fed beside the decode rows), where these loops on one thread cost as much as a product.
constexpr int64_t ROW_GRAIN = 8;

template <class Body>
inline void for_rows(int64_t rows, const Body& body) {
  at::parallel_for(0, rows, ROW_GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) body(r);
  });
}

// RMSNorm of each row (weight * h / sqrt(mean(h^2) + eps), as transformers computes it) into `out`.
inline void rms_norm_rows(const at::Tensor& h, const at::Tensor& weight, double eps, std::vector<float>& out) {
  const int64_t rows = h.size(0), k = h.size(1);
  out.resize(rows * k);
  const float* hp = h.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  for_rows(rows, [&](int64_t r) {
    const float* row = hp + r * k;
    const float inv = 1.f / std::sqrt(dot(row, row, k) / static_cast<float>(k) + static_cast<float>(eps));
    float* x = out.data() + r * k;
    for (int64_t i = 0; i < k; ++i) x[i] = wp[i] * (row[i] * inv);
  });
}

enum class Product { qkv, o, gate_up, down };

// h += out (each row times its scale), or h += RMSNorm(out) with `norm` (Gemma's output norms).
inline void add_residual(float* hp, const at::Tensor& out, int64_t rows, int64_t hidden, const std::vector<float>& scales,
                         const float* norm, double eps, const float* bias) {
  float* op = out.data_ptr<float>();
  for_rows(rows, [&](int64_t r) {
    float* row = op + r * hidden;
    for (int64_t i = 0; i < hidden; ++i) row[i] *= scales[r];
    if (bias != nullptr) {
      for (int64_t i = 0; i < hidden; ++i) row[i] += bias[i];
    }
    if (norm != nullptr) {
      const float inv = 1.f / std::sqrt(dot(row, row, hidden) / static_cast<float>(hidden) + static_cast<float>(eps));
      for (int64_t i = 0; i < hidden; ++i) row[i] = norm[i] * (row[i] * inv);
    }
    for (int64_t i = 0; i < hidden; ++i) hp[r * hidden + i] += row[i];
  });
}

// What a family adds to Llama's layer that the step computes (executor/families.py, decodes_fused): the
// biases of every product, RMSNorm over each query and key head before the rotation, a rotation of the
// first dims only (the tables' width; Phi's partial rotary factor), a sliding window (keys at distance
// >= window unseen; 0: none), the attention scale (0: 1/sqrt(head_dim)), soft-capped scores (0: none),
// norms on the attention's and the MLP's outputs (Gemma's sandwich) and GeGLU (tanh) instead of SiLU.
// Gemma's (1 + w) norms arrive as the weights 1 + w.
struct LayerExtras {
  const float* qkv_bias = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  int64_t window = 0;
  float scale = 0.f;
  float softcap = 0.f;
  const float* attn_out_norm = nullptr;
  const float* mlp_out_norm = nullptr;
  bool gelu = false;
  const float* o_bias = nullptr;
  const float* gate_up_bias = nullptr;
  int64_t gate_up_bias_size = 0;
  const float* down_bias = nullptr;
  // The cache slot of each row (empty: row r is slot r). Several rows may name one slot at consecutive
  // positions: a multi-token extend, each position computed as its own decode step would compute it.
  at::IntArrayRef slots;
};

// The decode-layer ops' arguments after their weights, in each op's schema (q8, q4, gguf): the cache,
// positions, rotary tables, head counts and eps; then LayerExtras with their defaults.
#define PROCTOR_LAYER_CACHE_ARGS \
  "Tensor(b!) keys, Tensor(c!) values, int[] positions, Tensor cos, Tensor sin, int heads, int kv_heads, float eps"
#define PROCTOR_LAYER_EXTRAS_ARGS                                                                              \
  "Tensor? qkv_bias=None, Tensor? q_norm=None, Tensor? k_norm=None, int window=0, float scale=0., "         \
  "float softcap=0., Tensor? attn_out_norm=None, Tensor? mlp_out_norm=None, bool gelu=False, "               \
  "Tensor? o_bias=None, Tensor? gate_up_bias=None, Tensor? down_bias=None, int[] slots=[]"

inline const float* optional_floats(const std::optional<at::Tensor>& t, int64_t size, const char* name) {
  if (!t.has_value() || !t->defined()) return nullptr;
  check_float(*t, name);
  TORCH_CHECK(t->numel() == size, name, " has ", t->numel(), " values, expected ", size);
  return t->const_data_ptr<float>();
}

inline LayerExtras layer_extras(const std::optional<at::Tensor>& qkv_bias, const std::optional<at::Tensor>& q_norm,
                                const std::optional<at::Tensor>& k_norm, int64_t window, double scale,
                                double softcap, const std::optional<at::Tensor>& attn_out_norm,
                                const std::optional<at::Tensor>& mlp_out_norm, bool gelu,
                                const std::optional<at::Tensor>& o_bias, const std::optional<at::Tensor>& gate_up_bias,
                                const std::optional<at::Tensor>& down_bias, at::IntArrayRef slots, int64_t heads,
                                int64_t kv_heads, int64_t d, int64_t hidden) {
  LayerExtras extras;
  extras.qkv_bias = optional_floats(qkv_bias, (heads + 2 * kv_heads) * d, "qkv_bias");
  extras.q_norm = optional_floats(q_norm, d, "q_norm");
  extras.k_norm = optional_floats(k_norm, d, "k_norm");
  TORCH_CHECK((extras.q_norm == nullptr) == (extras.k_norm == nullptr), "q_norm and k_norm go together");
  TORCH_CHECK(window >= 0 && scale >= 0 && softcap >= 0, "window, scale and softcap must not be negative");
  extras.window = window;
  extras.scale = static_cast<float>(scale);
  extras.softcap = static_cast<float>(softcap);
  extras.attn_out_norm = optional_floats(attn_out_norm, hidden, "attn_out_norm");
  extras.mlp_out_norm = optional_floats(mlp_out_norm, hidden, "mlp_out_norm");
  extras.gelu = gelu;
  extras.o_bias = optional_floats(o_bias, hidden, "o_bias");
  extras.down_bias = optional_floats(down_bias, hidden, "down_bias");
  extras.slots = slots;
  if (gate_up_bias.has_value() && gate_up_bias->defined()) {  // its size is checked against the product
    check_float(*gate_up_bias, "gate_up_bias");
    extras.gate_up_bias = gate_up_bias->const_data_ptr<float>();
    extras.gate_up_bias_size = gate_up_bias->numel();
  }
  return extras;
}

// RMSNorm of one head's d values in place (weight * x / sqrt(mean(x^2) + eps), as rms_norm_rows).
inline void rms_norm_head(float* x, const float* weight, int64_t d, double eps) {
  const float inv = 1.f / std::sqrt(dot(x, x, d) / static_cast<float>(d) + static_cast<float>(eps));
  for (int64_t i = 0; i < d; ++i) x[i] = weight[i] * (x[i] * inv);
}

// One decode step of a layer. h [B, hidden] is updated in place; keys/values [slots, KVH, capacity, D]
// (float16) get row r's new key and value at positions[r]; cos/sin [L, D] are the rotary tables.
// `project(which, x, rows, k, scales)` returns x [rows, k] times that weight as [rows, n] float32,
// each row still to be multiplied by scales[r] (the q8 products' per-row activation scale; 1 for q4).
template <class Project>
void decode_layer_with(at::Tensor& h, const at::Tensor& in_norm, const at::Tensor& post_norm, at::Tensor& keys,
                       at::Tensor& values, at::IntArrayRef positions, const at::Tensor& cos, const at::Tensor& sin,
                       int64_t heads, int64_t kv_heads, double eps, const Project& project,
                       const LayerExtras& extras = LayerExtras()) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&h, &in_norm, &post_norm, &cos, &sin}) {
    check_float(*t, "h, the norms and the rotary tables");
  }
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&keys, &values}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kHalf && t->is_contiguous(),
                "the key and value caches must be contiguous float16 CPU tensors");
  }
  // d: the head size; the rotary tables may cover only its first `rotated_dims` (a partial rotary factor).
  const int64_t rows = h.size(0), hidden = h.size(1), d = keys.size(3), rotated_dims = cos.size(1);
  const int64_t half = rotated_dims / 2, group = heads / kv_heads, capacity = keys.size(2);
  const bool mapped = !extras.slots.empty();
  TORCH_CHECK(!mapped || static_cast<int64_t>(extras.slots.size()) == rows, "slots must name one slot per row");
  for (int64_t slot : extras.slots) TORCH_CHECK(slot >= 0 && slot < keys.size(0), "slot out of range");
  auto slot_of = [&](int64_t r) { return mapped ? extras.slots[r] : r; };
  TORCH_CHECK(static_cast<int64_t>(positions.size()) == rows && (mapped || keys.size(0) >= rows) && keys.size(1) == kv_heads &&
                  rotated_dims <= d && rotated_dims % 2 == 0 && values.sizes() == keys.sizes(),
              "cache shape does not match the batch");
  for (int64_t p : positions) TORCH_CHECK(p >= 0 && p < capacity && p < cos.size(0), "position out of range");
  TORCH_CHECK(d % 8 == 0 && d <= 512 && group <= 8,
              "head_dim must be a multiple of 8 up to 512, and at most 8 query heads per kv head");
  const float scale = extras.scale > 0.f ? extras.scale : 1.f / std::sqrt(static_cast<float>(d));
  std::vector<float> scales(rows), normed;

  // q, k, v: one product; q and k rotated; k and v written at each row's own position.
  rms_norm_rows(h, in_norm, eps, normed);
  at::Tensor projected = project(Product::qkv, normed.data(), rows, hidden, scales);
  const int64_t width = projected.size(1);
  TORCH_CHECK(width == (heads + 2 * kv_heads) * d, "qkv width does not match the heads");
  float* pp = projected.data_ptr<float>();
  uint16_t* kp = reinterpret_cast<uint16_t*>(keys.data_ptr<at::Half>());
  uint16_t* vp = reinterpret_cast<uint16_t*>(values.data_ptr<at::Half>());
  for_rows(rows, [&](int64_t r) {
    float rotated[512];  // d <= 512 (checked above)
    float* row = pp + r * width;
    for (int64_t i = 0; i < width; ++i) row[i] *= scales[r];
    if (extras.qkv_bias != nullptr) {
      for (int64_t i = 0; i < width; ++i) row[i] += extras.qkv_bias[i];
    }
    if (extras.q_norm != nullptr) {  // per head, before the rotation (Qwen3)
      for (int64_t head = 0; head < heads; ++head) rms_norm_head(row + head * d, extras.q_norm, d, eps);
      for (int64_t head = heads; head < heads + kv_heads; ++head) rms_norm_head(row + head * d, extras.k_norm, d, eps);
    }
    const float* c = cos.const_data_ptr<float>() + positions[r] * rotated_dims;
    const float* s = sin.const_data_ptr<float>() + positions[r] * rotated_dims;
    for (int64_t head = 0; head < heads + kv_heads; ++head) {  // x * cos + rotate_half(x) * sin
      float* x = row + head * d;
      for (int64_t i = 0; i < half; ++i) {
        rotated[i] = x[i] * c[i] + (-x[i + half]) * s[i];
        rotated[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
      }
      std::copy(rotated, rotated + rotated_dims, x);  // the dims past them pass unchanged
    }
    for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
      const int64_t at_position = ((slot_of(r) * kv_heads + kvh) * capacity + positions[r]) * d;
      store_half(row + (heads + kvh) * d, d, kp + at_position);
      store_half(row + (heads + kv_heads + kvh) * d, d, vp + at_position);
    }
  });

  // Attention of each row over exactly its own prefix. Every row's key and value were written above, so a row
  // of a multi-token extend sees the positions before it in this call. A job is one kv head of a span: a row
  // alone (a decode row), or up to kSpanRows consecutive rows of one slot (a prompt's), whose keys and values are
  // widened to float32 once for all its rows instead of once a row (a 1.7B MHA model's 512-row prompt: the step's
  // time outside the products 1.43 -> 1.20 s, bench/prompt.py); each row's sums are the same operations in the
  // same order either way.
  constexpr int64_t kSpanRows = 32;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (first row, rows)
  for (int64_t r = 0; r < rows;) {
    int64_t e = r + 1;
    while (e < rows && e - r < kSpanRows && slot_of(e) == slot_of(r) && positions[e] == positions[e - 1] + 1) ++e;
    spans.emplace_back(r, e - r);
    r = e;
  }
  std::vector<float> attended(rows * heads * d);
  float* ap = attended.data();
  const int64_t span_count = static_cast<int64_t>(spans.size());
  at::parallel_for(0, span_count * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights, wide;
    for (int64_t job = begin; job < end; ++job) {
      const auto [r0, count] = spans[job / kv_heads];
      const int64_t kvh = job % kv_heads;
      auto first_of = [&](int64_t seen) { return extras.window > 0 ? std::max<int64_t>(0, seen - extras.window) : 0; };
      const int64_t base = (slot_of(r0) * kv_heads + kvh) * capacity;
      if (count == 1) {
        const int64_t seen = positions[r0] + 1;  // this row's prefix, or its last `window` positions
        const int64_t first = first_of(seen), cache = (base + first) * d;
        attend_group(pp + r0 * width + kvh * group * d, group, kp + cache, vp + cache, seen - first, d, scale,
                     ap + r0 * heads * d + kvh * group * d, weights, extras.softcap);
        continue;
      }
      const int64_t lowest = first_of(positions[r0] + 1), highest = positions[r0 + count - 1] + 1;
      const int64_t span = (highest - lowest) * d;
      wide.resize(2 * span);
      for (int64_t i = 0; i < span; i += 8) {
        _mm256_storeu_ps(wide.data() + i, load_half8(kp + (base + lowest) * d + i));
        _mm256_storeu_ps(wide.data() + span + i, load_half8(vp + (base + lowest) * d + i));
      }
      for (int64_t r = r0; r < r0 + count; ++r) {
        const int64_t seen = positions[r] + 1, first = first_of(seen), at = (first - lowest) * d;
        attend_group(pp + r * width + kvh * group * d, group, wide.data() + at, wide.data() + span + at, seen - first,
                     d, scale, ap + r * heads * d + kvh * group * d, weights, extras.softcap);
      }
    }
  });

  float* hp = h.data_ptr<float>();
  at::Tensor out = project(Product::o, ap, rows, heads * d, scales);
  add_residual(hp, out, rows, hidden, scales, extras.attn_out_norm, eps, extras.o_bias);

  // MLP: down(silu(gate) * up).
  rms_norm_rows(h, post_norm, eps, normed);
  at::Tensor gu = project(Product::gate_up, normed.data(), rows, hidden, scales);
  const int64_t inner = gu.size(1) / 2;
  std::vector<float> unit(rows, 1.f);
  if (extras.gate_up_bias != nullptr) {  // scaled and biased here, so the activations below take unit scales
    TORCH_CHECK(extras.gate_up_bias_size == 2 * inner, "gate_up_bias does not match the gate/up product");
    float* g = gu.data_ptr<float>();
    for_rows(rows, [&](int64_t r) {
      for (int64_t i = 0; i < 2 * inner; ++i) g[r * 2 * inner + i] = g[r * 2 * inner + i] * scales[r] + extras.gate_up_bias[i];
    });
  }
  const std::vector<float>& gate_scales = extras.gate_up_bias != nullptr ? unit : scales;
  const float* gp = gu.const_data_ptr<float>();
  // Each row's activations padded to a multiple of 8: exp_in_place rounds its count up, and a row's spill must
  // not land in the next row, which another thread may be writing.
  const int64_t stride = (inner + 7) / 8 * 8;
  std::vector<float> act(rows * stride);
  // GeGLU: gelu_tanh(gate) * up, with 0.5 (1 + tanh z) = 1 / (1 + e^-2z) so the vector e^x of SiLU serves it.
  for_rows(extras.gelu ? rows : 0, [&](int64_t r) {
    float* a = act.data() + r * stride;
    for (int64_t i = 0; i < inner; ++i) {
      const float gate = gp[r * 2 * inner + i] * gate_scales[r];
      a[i] = -2.f * 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);  // -2z
    }
    exp_in_place(a, inner);
    for (int64_t i = 0; i < inner; ++i) {
      const float gate = gp[r * 2 * inner + i] * gate_scales[r], up = gp[r * 2 * inner + inner + i] * gate_scales[r];
      a[i] = gate / (1.f + a[i]) * up;
    }
  });
  for_rows(extras.gelu ? 0 : rows, [&](int64_t r) {
    float* a = act.data() + r * stride;
    for (int64_t i = 0; i < inner; ++i) a[i] = -gp[r * 2 * inner + i] * gate_scales[r];  // -gate
    exp_in_place(a, inner);  // e^-gate (rounded up to 8: the spill stays in this row's padding)
    for (int64_t i = 0; i < inner; ++i) {
      const float gate = gp[r * 2 * inner + i] * gate_scales[r], up = gp[r * 2 * inner + inner + i] * gate_scales[r];
      a[i] = gate / (1.f + a[i]) * up;
    }
  });
  if (stride != inner) {  // the product takes rows of `inner` values side by side
    for (int64_t r = 1; r < rows; ++r) std::copy(act.data() + r * stride, act.data() + r * stride + inner, act.data() + r * inner);
  }
  at::Tensor mlp = project(Product::down, act.data(), rows, inner, scales);
  add_residual(hp, mlp, rows, hidden, scales, extras.mlp_out_norm, eps, extras.down_bias);
}

}  // namespace proctor_kernels
