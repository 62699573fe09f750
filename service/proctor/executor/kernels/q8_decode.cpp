// One decode step of a Llama layer with q8 weights: the step of layer_step.h around fbgemm's int8
// products through the packed weights (executor/fused_decode.py says why).
#include <ATen/native/quantized/PackedParams.h>
#include <torch/library.h>

#include "layer_step.h"

namespace {

using namespace proctor_kernels;
using Packed = c10::intrusive_ptr<LinearPackedParamsBase>;

// Writes row / max|row| into `spanned` with the constant columns +1, -1 after it (weights.py:
// _Int8RowLinear) and returns max|row|: every row then spans exactly [-1, 1], so fbgemm's
// per-tensor quantization parameters are the same whatever the batch.
inline float span_row(const float* row, int64_t k, float* spanned) {
  float peak = 0.f;
  for (int64_t i = 0; i < k; ++i) peak = std::max(peak, std::fabs(row[i]));
  peak = std::max(peak, std::numeric_limits<float>::min());
  for (int64_t i = 0; i < k; ++i) spanned[i] = row[i] / peak;
  spanned[k] = 1.f;
  spanned[k + 1] = -1.f;
  return peak;
}

void decode_layer(at::Tensor& h, const at::Tensor& in_norm, const Packed& qkv, const Packed& o,
                  const at::Tensor& post_norm, const Packed& gate_up, const Packed& down, at::Tensor& keys,
                  at::Tensor& values, at::IntArrayRef positions, const at::Tensor& cos, const at::Tensor& sin,
                  int64_t heads, int64_t kv_heads, double eps, bool reduce_range,
                  const std::optional<at::Tensor>& qkv_bias, const std::optional<at::Tensor>& q_norm,
                  const std::optional<at::Tensor>& k_norm, int64_t window, double scale, double softcap,
                  const std::optional<at::Tensor>& attn_out_norm, const std::optional<at::Tensor>& mlp_out_norm,
                  bool gelu, const std::optional<at::Tensor>& o_bias, const std::optional<at::Tensor>& gate_up_bias,
                  const std::optional<at::Tensor>& down_bias, at::IntArrayRef slots) {
  const at::TensorOptions options = h.options();
  const LayerExtras extras = layer_extras(qkv_bias, q_norm, k_norm, window, scale, softcap, attn_out_norm, mlp_out_norm,
                                          gelu, o_bias, gate_up_bias, down_bias, slots, heads, kv_heads, keys.size(3),
                                          h.size(1));
  auto project = [&](Product which, const float* x, int64_t rows, int64_t k, std::vector<float>& scales) {
    const Packed& packed = which == Product::qkv ? qkv : which == Product::o ? o : which == Product::gate_up ? gate_up : down;
    at::Tensor spanned = at::empty({rows, k + 2}, options);
    float* sp = spanned.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) scales[r] = span_row(x + r * k, k, sp + r * (k + 2));
    return packed->apply_dynamic(spanned, reduce_range);
  };
  decode_layer_with(h, in_norm, post_norm, keys, values, positions, cos, sin, heads, kv_heads, eps, project, extras);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(proctor, m) {
  m.def(
      "decode_layer(Tensor(a!) h, Tensor in_norm, __torch__.torch.classes.quantized.LinearPackedParamsBase qkv, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase o, Tensor post_norm, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase gate_up, "
      "__torch__.torch.classes.quantized.LinearPackedParamsBase down, " PROCTOR_LAYER_CACHE_ARGS
      ", bool reduce_range, " PROCTOR_LAYER_EXTRAS_ARGS ") -> ()");
}

TORCH_LIBRARY_IMPL(proctor, CPU, m) {
  m.impl("decode_layer", &decode_layer);
}
