// The gguf weights mode: matrix products straight on a GGUF file's own blocks, whatever their type
// (ggml_blocks.h: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32), and one decode
// step of a layer around them (layer_step.h), its q, k, v (and gate, up) products each of its own type
// as a Q4_K_M file mixes them.
//
// A weight is [out, row bytes] uint8, the file's rows unchanged (a layer's Q4_K matrix: [out / 8, 8 · row bytes],
// eight rows to a group, ggml_r8.h). Each output is computed whole by one
// thread: per block, the weight's codes are unpacked once and multiplied by a tile of up to 8 activation
// rows (ggml_dot.h); every block's integer sum is exact and scaled in float in block order, the same
// operations whichever group of weight rows or tile of activation rows it falls in. So a row's result is
// the same bits alone or in any batch, at any thread count (tests/unit/test_gguf_linear.py).
#include <torch/library.h>

#include <array>
#include <vector>

#include "ggml_blocks.h"
#include "layer_step.h"
#include "q4_types.h"
#define PROCTOR_GGML_NAMESPACE proctor_ggml_avx2
#include "ggml_dot.h"
#include "ggml_r8_blocks.h"
#include "ggml_r8.h"

namespace {

using namespace proctor_ggml;
using proctor_kernels::check_float;

constexpr int64_t kTile = 8;   // activation rows per pass over a weight row's blocks (each block unpacked once)

// Activations of `rows` rows of k inputs in the form one weight type takes (ggml_blocks.h).
struct Activations {
  Activation kind = Activation::f32;
  int64_t rows = 0, k = 0, per_row_blocks = 0;
  std::vector<int8_t> codes;
  std::vector<float> d, s, values;
  std::vector<int16_t> sums, bsums;

  ActivationView view() const {
    return {codes.data(), d.data(), s.data(), sums.data(), bsums.data(), values.data(), k, per_row_blocks};
  }

  ActivationRow row(int64_t r) {
    return {codes.data() + r * k,         d.data() + r * per_row_blocks,         s.data() + r * per_row_blocks,
            sums.data() + r * per_row_blocks, bsums.data() + r * per_row_blocks * 16, values.data() + r * k};
  }

  void quantize(Activation wanted, const float* x, int64_t count, int64_t inputs) {
    kind = wanted, rows = count, k = inputs;
    const bool blocked = wanted == Activation::q8_0 || wanted == Activation::q8_1 || wanted == Activation::q8_k;
    per_row_blocks = wanted == Activation::q8_k ? k / 256 : k / 32;
    codes.resize(blocked ? rows * k : 0);
    d.resize(blocked ? rows * per_row_blocks : 0);
    s.resize(wanted == Activation::q8_1 ? rows * per_row_blocks : 0);
    sums.resize(wanted == Activation::q8_0 || wanted == Activation::q8_1 ? rows * per_row_blocks : 0);
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

Layout checked_layout(const at::Tensor& blocks, int64_t type, int64_t k) {
  Layout layout;
  if (type == Q4_K_R8) {  // a row of the tensor is a group of eight weight rows
    layout = {256, kR8Bytes, Activation::q8_k};
  } else {
    TORCH_CHECK(layout_of(type, layout), "ggml type ", type, " has no product here");
  }
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                  blocks.dim() == 2,
              "weight blocks must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(k % std::max<int64_t>(layout.elements, 8) == 0 && blocks.size(1) == k / layout.elements * layout.bytes,
              "weight rows of ", blocks.size(1), " bytes do not match ", k, " inputs of ggml type ", type);
  return layout;
}

// Activation rows the grouped loop takes, each group's bytes read once: past four, the Blocks read from the groups
// measured as fast or faster (bench/README.md, "Many rows straight from the groups").
constexpr int64_t kR8RowMost = 4;

// Q4_K_R8 (ggml_r8.h): up to kR8RowMost activation rows take the grouped loop; more, the many-row loops with their
// Blocks read from the groups (ggml_r8_blocks.h): the file layout's bits either way.
void product_r8(Activations& x, const at::Tensor& blocks, float* y, int64_t width, int64_t column) {
  checked_layout(blocks, Q4_K_R8, x.k);
  const int64_t groups = blocks.size(0), group_bytes = blocks.size(1), nb = x.k / 256, rows = x.rows;
  const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
  const ActivationView view = x.view();
  if (rows <= kR8RowMost) {
    const int64_t grain = std::max<int64_t>(1, 65536 / group_bytes);
    at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        const uint8_t* group = wp + g * group_bytes;
        switch (rows) {
          case 1: r8_rows<1>(group, nb, view, y + column + 8 * g, width); break;
          case 2: r8_rows<2>(group, nb, view, y + column + 8 * g, width); break;
          case 3: r8_rows<3>(group, nb, view, y + column + 8 * g, width); break;
          default: r8_rows<4>(group, nb, view, y + column + 8 * g, width); break;
        }
      }
    });
    return;
  }
  const bool vnni = proctor_q4::vnni_loops();
  const int64_t per_item = vnni ? kWideRows : kGroupRows, row_bytes = nb * 144, n = 8 * groups;
  const int64_t items = (n + per_item - 1) / per_item;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t j0 = item * per_item, g = std::min(per_item, n - j0);
      const uint8_t* w = wp + j0 / 8 * group_bytes;
      if (vnni) {
        wide_groups_vnni(w, row_bytes, g, x.k, view, rows, y + column + j0, width);
      } else {
        proctor_ggml_avx2::groups_q4_k<proctor_ggml_avx2::NarrowGroups>(w, row_bytes, g, x.k, view, rows,
                                                                        y + column + j0, width);
      }
    }
  });
}

// y[:, column .. column + out) of a [rows, width] result = x · Wᵀ, with x already in W's activation form.
// The block types go eight weight rows at a time (ggml_dot.h's group(); sixteen in the VNNI loops,
// ggml_wide.h, with each row's bits unchanged); float types a row at a time.
// Each thread takes whole items (a group, or a weight row).
void product_into(Activations& x, const at::Tensor& blocks, int64_t type, float* y, int64_t width, int64_t column) {
  if (type == Q4_K_R8) {
    product_r8(x, blocks, y, width, column);
    return;
  }
  const Layout layout = checked_layout(blocks, type, x.k);
  const int64_t n = blocks.size(0), row_bytes = blocks.size(1), rows = x.rows;
  const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
  const ActivationView view = x.view();
  const bool vnni = proctor_q4::vnni_loops();
  const bool grouped = layout.elements > 1;
  // the K-quants' few-row loop reads eight weight rows a group: items of eight (sixteen measured 4-10% slower)
  const bool few = layout.elements == 256 && rows <= proctor_ggml_avx2::kRowMost;
  const int64_t per_item = grouped ? (vnni && !few ? kWideRows : kGroupRows) : 1, items = (n + per_item - 1) / per_item;
  const int64_t grain =
      std::max<int64_t>(1, 65536 / std::max<int64_t>(1, per_item * row_bytes * std::min(rows, kTile)));
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    if (grouped) {  // a group's blocks unpacked once for all its activation rows
      for (int64_t item = begin; item < end; ++item) {
        const int64_t j0 = item * per_item, g = std::min(per_item, n - j0);
        if (vnni) {
          wide_group_vnni(type, wp + j0 * row_bytes, row_bytes, g, x.k, view, rows, y + column + j0, width);
        } else {
          proctor_ggml_avx2::group(type, wp + j0 * row_bytes, row_bytes, g, x.k, view, rows, y + column + j0, width);
        }
      }
      return;
    }
    float out[kTile];
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {  // a tile of activation rows stays in cache over the weight rows
      const int64_t count = std::min(kTile, rows - r0);
      for (int64_t j0 = begin; j0 < end; ++j0) {
        const uint8_t* w = wp + j0 * row_bytes;
        if (vnni) {
          rows_vnni(count, type, w, x.k, view, r0, out);
        } else {
          proctor_ggml_avx2::rows(count, type, w, x.k, view, r0, out);
        }
        for (int64_t t = 0; t < count; ++t) y[(r0 + t) * width + column + j0] = out[t];
      }
    }
  });
}

Activation activation_for(int64_t type) {
  if (type == Q4_K_R8) return Activation::q8_k;
  Layout layout;
  TORCH_CHECK(layout_of(type, layout), "ggml type ", type, " has no product here");
  return layout.activation;
}

// x [rows, k] · Wᵀ for several weights of any types sharing the input (q, k, v; gate, up): [rows, Σ out].
at::Tensor products(const float* x, int64_t rows, int64_t k, at::TensorList weights, at::IntArrayRef types,
                    const at::TensorOptions& options) {
  TORCH_CHECK(weights.size() == types.size() && !weights.empty(), "one ggml type per weight");
  int64_t width = 0;
  for (size_t i = 0; i < weights.size(); ++i) width += weights[i].size(0) * (types[i] == Q4_K_R8 ? 8 : 1);
  at::Tensor y = at::empty({rows, width}, options);
  std::array<Activations, 6> forms;  // each activation form quantized at most once
  std::array<bool, 6> ready{};
  int64_t column = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto form = static_cast<size_t>(activation_for(types[i]));
    if (!ready[form]) forms[form].quantize(static_cast<Activation>(form), x, rows, k), ready[form] = true;
    product_into(forms[form], weights[i], types[i], y.data_ptr<float>(), width, column);
    column += weights[i].size(0) * (types[i] == Q4_K_R8 ? 8 : 1);
  }
  return y;
}

// x [rows, k] times one or more weights sharing it (a stack's parts), side by side; x quantized once a form.
at::Tensor ggml_linear(const at::Tensor& x, at::TensorList blocks, at::IntArrayRef types) {
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, inputs]");
  return products(x.const_data_ptr<float>(), x.size(0), x.size(1), blocks, types, x.options());
}

// A Q4_K weight [rows, row bytes] (rows a multiple of 8) as Q4_K_R8 groups [rows / 8, 8 · row bytes] (ggml_r8.h).
at::Tensor repack_q4_k(const at::Tensor& blocks, int64_t k) {
  const Layout layout = checked_layout(blocks, Q4_K, k);
  TORCH_CHECK(blocks.size(0) % 8 == 0, "Q4_K_R8 groups eight rows: ", blocks.size(0), " rows");
  at::Tensor out = at::empty({blocks.size(0) / 8, 8 * blocks.size(1)}, blocks.options());
  const int64_t row_bytes = blocks.size(1);
  const uint8_t* in = blocks.const_data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, out.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      pack_r8(in + 8 * g * row_bytes, row_bytes, k / layout.elements, o + g * 8 * row_bytes);
    }
  });
  return out;
}

// Rows `ids` of a weight as float32, each value as ggml dequantizes it: token embeddings.
at::Tensor ggml_rows(const at::Tensor& blocks, int64_t type, int64_t k, const at::Tensor& ids) {
  TORCH_CHECK(type != Q4_K_R8, "rows of a grouped Q4_K weight are not read back: keep the file's layout for lookups");
  const Layout layout = checked_layout(blocks, type, k);
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1, "ids must be a 1-D int64 tensor");
  at::Tensor out = at::empty({ids.size(0), k}, blocks.options().dtype(at::kFloat));
  const int64_t* ip = ids.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.size(0); ++r) {
    TORCH_CHECK(ip[r] >= 0 && ip[r] < blocks.size(0), "row ", ip[r], " out of range");
    const uint8_t* w = blocks.const_data_ptr<uint8_t>() + ip[r] * blocks.size(1);
    float* o = out.data_ptr<float>() + r * k;
    if (layout.elements == 256) {  // ggml's dequantize_row: d·scale·q − dmin·min (Q6_K: d·scale·(q − 32))
      proctor_ggml_avx2::KVectors kv;
      alignas(32) uint8_t codes[256];
      alignas(32) int16_t scales[16], minimums[16];
      for (int64_t b = 0; b < k / 256; ++b, w += layout.bytes) {
        proctor_ggml_avx2::unpack_k_vectors(type, w, kv);
        for (int c = 0; c < 8; ++c) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(codes + 32 * c), kv.codes[c]);
          alignas(32) int16_t lanes[16];
          _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), kv.scales[c]);
          scales[2 * c] = lanes[0], scales[2 * c + 1] = lanes[8];
        }
        if (type != Q6_K) _mm256_store_si256(reinterpret_cast<__m256i*>(minimums), kv.minimums);
        for (int i = 0; i < 256; ++i) {
          const float scale = kv.d * static_cast<float>(scales[i / 16]);
          o[256 * b + i] = type == Q6_K ? scale * static_cast<float>(codes[i] - 32)
                                        : scale * static_cast<float>(codes[i]) - kv.dmin * static_cast<float>(minimums[i / 16]);
        }
      }
    } else if (layout.elements == 32) {  // d·q + m
      alignas(32) int8_t codes[32];
      for (int64_t b = 0; b < k / 32; ++b, w += layout.bytes) {
        float d, m;
        _mm256_store_si256(reinterpret_cast<__m256i*>(codes), proctor_ggml_avx2::unpack_small_vector(type, w, d, m));
        for (int i = 0; i < 32; ++i) o[32 * b + i] = d * static_cast<float>(codes[i]) + m;
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
                       const std::optional<at::Tensor>& down_bias, at::IntArrayRef slots) {
  using proctor_kernels::Product;
  const at::TensorOptions options = h.options();
  const proctor_kernels::LayerExtras extras = proctor_kernels::layer_extras(
      qkv_bias, q_norm, k_norm, window, scale, softcap, attn_out_norm, mlp_out_norm, gelu, o_bias, gate_up_bias,
      down_bias, slots, heads, kv_heads, keys.size(3), h.size(1));
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
  m.def("ggml_linear(Tensor x, Tensor[] blocks, int[] types) -> Tensor");
  m.def("ggml_rows(Tensor blocks, int type, int k, Tensor ids) -> Tensor");
  m.def("repack_q4_k(Tensor blocks, int k) -> Tensor");
  m.def(
      "decode_layer_ggml(Tensor(a!) h, Tensor in_norm, Tensor[] qkv, int[] qkv_types, Tensor o, int o_type, "
      "Tensor post_norm, Tensor[] gate_up, int[] gate_up_types, Tensor down, int down_type, "
      PROCTOR_LAYER_CACHE_ARGS ", " PROCTOR_LAYER_EXTRAS_ARGS ") -> ()");
}

TORCH_LIBRARY_IMPL(proctor, CPU, m) {
  m.impl("ggml_linear", &ggml_linear);
  m.impl("ggml_rows", &ggml_rows);
  m.impl("repack_q4_k", &repack_q4_k);
  m.impl("decode_layer_ggml", &decode_layer_ggml);
}
