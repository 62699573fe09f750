// The q4 weights mode: matrix products on GGUF blocks (executor/weights.py says why), and one decode
// step of a Llama layer around them (layer_step.h).
//
// Weights are llama.cpp's blocks: Q4_1 for the layers (per 32 inputs of an output row: float16 scale
// d, float16 minimum m, 4-bit codes q; w = d·q + m) and Q8_0 for the LM head (float16 d, int8 codes q;
// w = d·q), with the same bytes a block, laid out for the products by groups of 8 output rows
// (q4_dot.h, q4_types.h). Quantizing the GGUF's own dequantized weights with ggml's reference rounding
// gives back the file's blocks (tests/integration/test_q4_weights_real.py), so the weights are exactly
// the file's. Activations are quantized per row and per 32 inputs to int8 (llama.cpp's Q8_1: scale a,
// codes p, and a·Σp for the minimum term); each block's product is an exact integer sum, scaled in
// float. Every output of every row is computed by the same operations in the same order whatever the
// batch or the thread, so a row's result is the same bits alone or in a batch.
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <string>

#include "layer_step.h"
#define PROCTOR_DOT_NAMESPACE proctor_q4_avx2
#include "q4_dot.h"

namespace {

using namespace proctor_kernels;

using proctor_q4::kBlock;
using proctor_q4::kGroup;
using proctor_q4::kQ4GroupBytes;
using proctor_q4::kQ8GroupBytes;

inline void store_half_bits(float value, uint8_t* p) {
  const uint16_t bits = _cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT);
  std::memcpy(p, &bits, 2);
}

// Activations of `rows` rows of k inputs as int8 blocks: codes, scale a and a·Σcodes per block.
struct ActivationBlocks {
  std::vector<int8_t> codes;
  std::vector<float> scale, scaled_sum;
  int64_t blocks = 0;  // per row

  proctor_q4::Activations view() const { return {codes.data(), scale.data(), scaled_sum.data(), blocks}; }

  void quantize(const float* x, int64_t rows, int64_t k) {
    blocks = k / kBlock;
    codes.resize(rows * k);
    scale.resize(rows * blocks);
    scaled_sum.resize(rows * blocks);
    for (int64_t b = 0; b < rows * blocks; ++b) {  // row r's block j is block r·blocks + j
      const float* v = x + b * kBlock;
      int8_t* q = codes.data() + b * kBlock;
      float peak = 0.f;
      for (int64_t i = 0; i < kBlock; ++i) peak = std::max(peak, std::fabs(v[i]));
      const float a = peak / 127.f, inverse = a != 0.f ? 1.f / a : 0.f;
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int32_t p = static_cast<int32_t>(std::nearbyint(v[i] * inverse));  // to nearest, ties to even
        q[i] = static_cast<int8_t>(p);
        sum += p;
      }
      scale[b] = a;
      scaled_sum[b] = a * static_cast<float>(sum);
    }
  }
};

// Which inner loops run: VNNI where the CPU has it, unless set to "avx2" (the same bits either way; the
// tests compare them). Returns the loops now in use.
std::atomic<bool> vnni_allowed{true};

bool use_vnni() {
  static const bool present = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return present && vnni_allowed.load(std::memory_order_relaxed);
}

std::string q4_loops(const std::string& wanted) {
  TORCH_CHECK(wanted == "auto" || wanted == "avx2" || wanted.empty(), "q4 loops: auto or avx2, got ", wanted);
  if (!wanted.empty()) vnni_allowed.store(wanted == "auto");
  return use_vnni() ? "avx512-vnni" : "avx2";
}

// blocks: [out / 8, blocks a row · group_bytes] (q4_types.h); k inputs.
void check_blocks(const at::Tensor& blocks, int64_t k, int64_t group_bytes) {
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                  blocks.dim() == 2,
              "weight blocks must be a contiguous 2-D uint8 CPU tensor");
  TORCH_CHECK(k % kBlock == 0 && blocks.size(1) == k / kBlock * group_bytes, "weight blocks of ", blocks.size(1),
              " bytes a group do not match ", k, " inputs");
}

// y [rows, n] = x [rows, k] · Wᵀ; groups of 8 outputs are split among threads, each computed whole by one.
at::Tensor block_product(const ActivationBlocks& x, int64_t rows, const at::Tensor& blocks, int64_t group_bytes,
                         const at::TensorOptions& options) {
  const int64_t groups = blocks.size(0), per_group = blocks.size(1), n = groups * kGroup;
  at::Tensor y = at::empty({rows, n}, options);
  float* yp = y.data_ptr<float>();
  const uint8_t* wp = blocks.const_data_ptr<uint8_t>();
  const int64_t grain = std::max<int64_t>(2, 512 / std::max<int64_t>(1, rows * x.blocks));
  const proctor_q4::Activations view = x.view();
  const bool q4 = group_bytes == kQ4GroupBytes, vnni = use_vnni();
  at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      if (vnni) {
        proctor_q4::group_rows_vnni(q4, wp + g * per_group, view, rows, yp, n, g);
      } else {
        proctor_q4_avx2::group_rows_any(q4, wp + g * per_group, view, rows, yp, n, g);
      }
    }
  });
  return y;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& blocks, int64_t group_bytes) {
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, inputs]");
  check_blocks(blocks, x.size(1), group_bytes);
  ActivationBlocks activations;
  activations.quantize(x.const_data_ptr<float>(), x.size(0), x.size(1));
  return block_product(activations, x.size(0), blocks, group_bytes, x.options());
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& blocks) { return linear(x, blocks, kQ4GroupBytes); }
at::Tensor q8_0_linear(const at::Tensor& x, const at::Tensor& blocks) { return linear(x, blocks, kQ8GroupBytes); }

// ggml's reference quantizers (quantize_row_q4_1_ref / quantize_row_q8_0_ref) for each row and block,
// written into the grouped layout: in group g = j / 8, lane l = j % 8, block b, input i = 4c + e,
//   scales at 2·(8b + l), minimums (Q4_1) at 16·nb + 2·(8b + l);
//   Q4_1 codes at 32·nb + 128·b + 32·(c % 4) + 4·l + e, the low nibble for c < 4, the high for c ≥ 4;
//   Q8_0 codes at 16·nb + 256·b + 32·c + 4·l + e.
at::Tensor quantize(const at::Tensor& weight, int64_t group_bytes) {
  check_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) % kBlock == 0 && weight.size(0) % kGroup == 0,
              "weight must be [out, in] with out a multiple of 8 and in a multiple of 32");
  const int64_t n = weight.size(0), nb = weight.size(1) / kBlock, per_group = nb * group_bytes;
  at::Tensor blocks = at::zeros({n / kGroup, per_group}, weight.options().dtype(at::kByte));
  const float* src = weight.const_data_ptr<float>();
  uint8_t* dst = blocks.data_ptr<uint8_t>();
  const bool q4 = group_bytes == kQ4GroupBytes;
  at::parallel_for(0, n / kGroup, 16, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      uint8_t* group = dst + g * per_group;
      for (int64_t l = 0; l < kGroup; ++l) {
        for (int64_t b = 0; b < nb; ++b) {
          const float* v = src + ((g * kGroup + l) * nb + b) * kBlock;
          uint8_t* scale = group + 2 * (kGroup * b + l);
          if (q4) {
            float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
            for (int64_t i = 0; i < kBlock; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
            const float d = (hi - lo) / 15.f, inverse = d != 0.f ? 1.f / d : 0.f;
            store_half_bits(d, scale);
            store_half_bits(lo, scale + 16 * nb);
            uint8_t* codes = group + 32 * nb + 128 * b + 4 * l;
            for (int64_t i = 0; i < kBlock; ++i) {
              const int q = std::min(15, static_cast<int>(static_cast<int8_t>((v[i] - lo) * inverse + 0.5f)));
              const int64_t c = i / 4, e = i % 4;
              codes[32 * (c % 4) + e] |= static_cast<uint8_t>(c < 4 ? q : q << 4);
            }
          } else {
            float peak = 0.f;
            for (int64_t i = 0; i < kBlock; ++i) peak = std::max(peak, std::fabs(v[i]));
            const float d = peak / 127.f, inverse = d != 0.f ? 1.f / d : 0.f;
            store_half_bits(d, scale);
            uint8_t* codes = group + 16 * nb + 256 * b + 4 * l;
            for (int64_t i = 0; i < kBlock; ++i) {
              codes[32 * (i / 4) + i % 4] = static_cast<uint8_t>(static_cast<int8_t>(std::round(v[i] * inverse)));
            }
          }
        }
      }
    }
  });
  return blocks;
}

at::Tensor quantize_q4_1(const at::Tensor& weight) { return quantize(weight, kQ4GroupBytes); }
at::Tensor quantize_q8_0(const at::Tensor& weight) { return quantize(weight, kQ8GroupBytes); }

// Rows `ids` of a Q8_0 weight (the LM head) as float32: d·q, the token embeddings when the head is tied.
at::Tensor q8_0_rows(const at::Tensor& blocks, const at::Tensor& ids) {
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                  blocks.dim() == 2 && blocks.size(1) % kQ8GroupBytes == 0,
              "blocks must be a contiguous [out / 8, bytes] uint8 CPU tensor of Q8_0 groups");
  TORCH_CHECK(ids.device().is_cpu() && ids.scalar_type() == at::kLong && ids.dim() == 1, "ids must be a 1-D int64 tensor");
  const int64_t groups = blocks.size(0), nb = blocks.size(1) / kQ8GroupBytes, k = nb * kBlock;
  at::Tensor out = at::empty({ids.size(0), k}, blocks.options().dtype(at::kFloat));
  const int64_t* ip = ids.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < ids.size(0); ++r) {
    const int64_t j = ip[r];
    TORCH_CHECK(j >= 0 && j < groups * kGroup, "row ", j, " out of range");
    const uint8_t* group = blocks.const_data_ptr<uint8_t>() + (j / kGroup) * blocks.size(1);
    const int64_t lane = j % kGroup;
    float* o = out.data_ptr<float>() + r * k;
    for (int64_t b = 0; b < nb; ++b) {
      uint16_t bits;
      std::memcpy(&bits, group + 2 * (kGroup * b + lane), 2);
      const float d = _cvtsh_ss(bits);
      const int8_t* codes = reinterpret_cast<const int8_t*>(group + 16 * nb + 256 * b + 4 * lane);
      for (int64_t i = 0; i < kBlock; ++i) o[b * kBlock + i] = d * static_cast<float>(codes[32 * (i / 4) + i % 4]);
    }
  }
  return out;
}

// RMSNorm of each row of h (as the layer step computes it): q4's final norm before the LM head.
at::Tensor rms_norm(const at::Tensor& h, const at::Tensor& weight, double eps) {
  check_float(h, "h");
  check_float(weight, "weight");
  TORCH_CHECK(h.dim() == 2 && weight.dim() == 1 && weight.size(0) == h.size(1), "h [rows, hidden], weight [hidden]");
  std::vector<float> normed;
  rms_norm_rows(h, weight, eps, normed);
  at::Tensor out = at::empty_like(h);
  std::copy(normed.begin(), normed.end(), out.data_ptr<float>());
  return out;
}

void decode_layer_q4(at::Tensor& h, const at::Tensor& in_norm, const at::Tensor& qkv, const at::Tensor& o,
                     const at::Tensor& post_norm, const at::Tensor& gate_up, const at::Tensor& down, at::Tensor& keys,
                     at::Tensor& values, at::IntArrayRef positions, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t heads, int64_t kv_heads, double eps, const std::optional<at::Tensor>& qkv_bias,
                     const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm, int64_t window,
                     double scale, double softcap, const std::optional<at::Tensor>& attn_out_norm,
                     const std::optional<at::Tensor>& mlp_out_norm, bool gelu,
                     const std::optional<at::Tensor>& o_bias, const std::optional<at::Tensor>& gate_up_bias,
                     const std::optional<at::Tensor>& down_bias, at::IntArrayRef slots) {
  const at::TensorOptions options = h.options();
  const LayerExtras extras = layer_extras(qkv_bias, q_norm, k_norm, window, scale, softcap, attn_out_norm, mlp_out_norm,
                                          gelu, o_bias, gate_up_bias, down_bias, slots, heads, kv_heads, keys.size(3),
                                          h.size(1));
  ActivationBlocks activations;
  auto project = [&](Product which, const float* x, int64_t rows, int64_t k, std::vector<float>& scales) {
    const at::Tensor& blocks = which == Product::qkv ? qkv : which == Product::o ? o : which == Product::gate_up ? gate_up : down;
    check_blocks(blocks, k, kQ4GroupBytes);
    std::fill(scales.begin(), scales.end(), 1.f);
    activations.quantize(x, rows, k);
    return block_product(activations, rows, blocks, kQ4GroupBytes, options);
  };
  decode_layer_with(h, in_norm, post_norm, keys, values, positions, cos, sin, heads, kv_heads, eps, project, extras);
}

}  // namespace

namespace proctor_q4 {

bool vnni_loops() { return use_vnni(); }

}  // namespace proctor_q4

TORCH_LIBRARY_FRAGMENT(proctor, m) {
  m.def("q4_linear(Tensor x, Tensor blocks) -> Tensor");
  m.def("q8_0_linear(Tensor x, Tensor blocks) -> Tensor");
  m.def("quantize_q4_1(Tensor weight) -> Tensor");
  m.def("q4_loops(str wanted) -> str", &q4_loops);
  m.def("q8_0_rows(Tensor blocks, Tensor ids) -> Tensor");
  m.def("rms_norm(Tensor h, Tensor weight, float eps) -> Tensor");
  m.def("quantize_q8_0(Tensor weight) -> Tensor");
  m.def(
      "decode_layer_q4(Tensor(a!) h, Tensor in_norm, Tensor qkv, Tensor o, Tensor post_norm, Tensor gate_up, "
      "Tensor down, " PROCTOR_LAYER_CACHE_ARGS ", " PROCTOR_LAYER_EXTRAS_ARGS ") -> ()");
}

TORCH_LIBRARY_IMPL(proctor, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_0_linear", &q8_0_linear);
  m.impl("quantize_q4_1", &quantize_q4_1);
  m.impl("quantize_q8_0", &quantize_q8_0);
  m.impl("decode_layer_q4", &decode_layer_q4);
  m.impl("q8_0_rows", &q8_0_rows);
  m.impl("rms_norm", &rms_norm);
}
