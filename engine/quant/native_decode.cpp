// A decode-only step of the decoder (engine/models/decoder.py) in one call from Python: every
// layer's RMSNorms, projections, rotary embedding, cache write, paged attention, SwiGLU and
// residual adds, then the final norm. The projections and the attention are this library's own
// kernels, the ones the eager step calls (the calibration's choice per projection); what the
// eager step spends around them, ~40 Python module and torch operator calls a layer, and what
// the torch.compile'd step spends in its generated Python wrapper (~2 ms a one-row step,
// docs/benchmarks.md), is here a few loops over a few rows, on the calling thread.
//
// The numbers are the eager step's: the same kernels on the same inputs; the rotary embedding
// computes x * cos + swapped(x) * sin_signed as torch does (two products and a sum, no fused
// multiply-add); RMSNorm and SiLU differ only in float32 summation order and the exponential's
// last bits.
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NATIVE_AVX2 1
#endif

#include "cpu_vec.h"

// q4_linear.cpp and engine/attention/cpu_attention.cpp, built into this library.
torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                        const torch::Tensor& mins);
torch::Tensor q4_linear_i16(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                            const torch::Tensor& mins);
torch::Tensor q4_dequantize(const torch::Tensor& qweight, const torch::Tensor& scales, const torch::Tensor& mins);
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale);
void store_kv(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor k_cache, torch::Tensor v_cache,
              const torch::Tensor& slot_mapping);

namespace {

// How a projection computes y = x W^T (+ bias): the kernel classes of engine/quant/linear.py
// and q4_fused.py. A Q4 weight is (codes, scales, mins); a dense one is its weight tensor.
enum Form : int64_t { kDense = 0, kQ4 = 1, kQ4Int16 = 2, kQ4Dequant = 3 };

struct Kernel {
  int64_t form;
  torch::Tensor w, scales, mins;

  torch::Tensor operator()(const torch::Tensor& x) const {
    switch (form) {
      case kQ4: return q4_linear(x, w, scales, mins);
      case kQ4Int16: return q4_linear_i16(x, w, scales, mins);
      case kQ4Dequant: return at::linear(x, q4_dequantize(w, scales, mins));
      default: return at::linear(x.to(w.scalar_type()), w).to(x.scalar_type());
    }
  }
};

// A projection: its decode kernel up to max_decode_rows rows, its prefill kernel above
// (linear.SplitKernel; one kernel: both the same), then the bias if it has one.
struct Projection {
  Kernel decode, prefill;
  int64_t max_decode_rows;
  torch::Tensor bias;

  torch::Tensor operator()(const torch::Tensor& x) const {
    torch::Tensor y = x.size(0) <= max_decode_rows ? decode(x) : prefill(x);
    if (bias.defined()) y.add_(bias);
    return y;
  }
};

struct Layer {
  torch::Tensor input_norm, post_norm, k_cache, v_cache;
  Projection qkv, o, gate_up, down;
};

float sum_of_squares(const float* x, int64_t n) {
#ifdef NATIVE_AVX2
  return dot(x, x, n);
#else
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
#endif
}

// out = weight * (x / sqrt(mean(x^2) + eps)) per row, as RMSNorm's float32 path.
void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float inv = 1.0f / std::sqrt(sum_of_squares(xr, n) / static_cast<float>(n) + eps);
    float* o = out + r * n;
    for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

// Heads [heads, d] of one row rotated at position p in place: x * cos + [x2, x1] * sin_signed
// (engine/layers/rotary.py), cos and sin_signed the rows of the model's tables at p.
void rotate(float* x, int64_t heads, int64_t d, const float* cos, const float* sin_signed) {
  const int64_t half = d / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * d;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] + b * sin_signed[i];
      v[i + half] = b * cos[i + half] + a * sin_signed[i + half];
    }
  }
}

// out[r] = silu(gate_up[r, :n]) * gate_up[r, n:], silu(g) = g / (1 + e^-g), for each row r.
void silu_and_mul(const float* gate_up, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * n;
    const float* u = g + n;
    float* o = out + r * n;
    int64_t i = 0;
#ifdef NATIVE_AVX2
    // e^-|g| never overflows: g >= 0 gives 1 / (1 + e^-g), g < 0 gives e^g / (1 + e^g)
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
      const __m256 x = _mm256_loadu_ps(g + i);
      const __m256 e = exp_nonpositive(_mm256_or_ps(x, sign));                      // e^-|x|
      const __m256 sigmoid = _mm256_div_ps(_mm256_blendv_ps(one, e, x), _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid), _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

Kernel kernel_of(const std::vector<torch::Tensor>& t, size_t at, int64_t form) {
  TORCH_CHECK(form >= kDense && form <= kQ4Dequant, "unknown kernel form ", form);
  return Kernel{form, t[at], t[at + 1], t[at + 2]};
}

}  // namespace

// The decoder's tensors, held for the engine's life (no copies: the model's own weights and the
// KV pool's caches). Per layer, `tensors` holds 4 + 4 x 7 tensors:
//   input_norm, post_norm, k_cache, v_cache, then for qkv, o, gate_up, down each: the decode
//   kernel's three (a dense weight and two empty tensors, or a Q4 weight's codes, scales,
//   mins), the prefill kernel's three, the bias (empty: none);
// `forms` holds 3 per projection: decode form, prefill form, max decode rows.
class NativeDecoder {
 public:
  NativeDecoder(const std::vector<std::vector<torch::Tensor>>& tensors, const std::vector<std::vector<int64_t>>& forms,
                torch::Tensor final_norm, torch::Tensor cos, torch::Tensor sin_signed, int64_t num_heads,
                int64_t num_kv_heads, int64_t head_dim, double eps, double scale)
      : final_norm_(std::move(final_norm)), cos_(std::move(cos)), sin_(std::move(sin_signed)), num_heads_(num_heads),
        num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(static_cast<float>(eps)), scale_(scale) {
    TORCH_CHECK(tensors.size() == forms.size() && !tensors.empty(), "one tensor list and one form list per layer");
    TORCH_CHECK(cos_.dim() == 2 && cos_.sizes() == sin_.sizes() && cos_.size(1) == head_dim_ &&
                    cos_.scalar_type() == torch::kFloat32 && cos_.is_contiguous() && sin_.is_contiguous() &&
                    sin_.scalar_type() == torch::kFloat32, "cos, sin_signed: float32 [positions, head_dim]");
    TORCH_CHECK(head_dim_ % 2 == 0 && num_heads_ % num_kv_heads_ == 0, "head_dim even, heads a multiple of KV heads");
    for (size_t l = 0; l < tensors.size(); ++l) {
      const auto& t = tensors[l];
      const auto& f = forms[l];
      TORCH_CHECK(t.size() == 4 + 4 * 7 && f.size() == 4 * 3, "layer ", l, ": 32 tensors and 12 forms expected");
      Layer layer{t[0], t[1], t[2], t[3], {}, {}, {}, {}};
      Projection* projections[4] = {&layer.qkv, &layer.o, &layer.gate_up, &layer.down};
      for (size_t p = 0; p < 4; ++p) {
        const size_t at = 4 + 7 * p;
        projections[p]->decode = kernel_of(t, at, f[3 * p]);
        projections[p]->prefill = kernel_of(t, at + 3, f[3 * p + 1]);
        projections[p]->max_decode_rows = f[3 * p + 2];
        if (t[at + 6].numel() > 0) projections[p]->bias = t[at + 6];
      }
      layers_.push_back(std::move(layer));
    }
  }

  // hidden: the step's embeddings [rows, hidden] float32 (overwritten: the residual stream);
  // positions, slot_mapping int64 [rows]; seq_lens [rows] and block_tables [rows, width] of
  // any integer type. Returns the final norm of the last layer's output, [rows, hidden].
  torch::Tensor step(torch::Tensor hidden, const torch::Tensor& positions, const torch::Tensor& slot_mapping,
                     const torch::Tensor& seq_lens, const torch::Tensor& block_tables) {
    TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == torch::kFloat32 && hidden.is_contiguous(),
                "hidden: float32 [rows, hidden], contiguous");
    const int64_t rows = hidden.size(0), width = hidden.size(1), d = head_dim_;
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == rows && positions.scalar_type() == torch::kLong,
                "positions: int64 [rows]");
    const auto pos = positions.contiguous();
    const int64_t* pp = pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r)
      TORCH_CHECK(pp[r] >= 0 && pp[r] < cos_.size(0), "positions[", r, "] = ", pp[r], " outside the rotary table's ",
                  cos_.size(0), " positions");
    const auto lens = seq_lens.to(torch::kLong).contiguous();
    const auto tables = block_tables.to(torch::kLong).contiguous();
    const int64_t q_size = num_heads_ * d, kv_size = num_kv_heads_ * d;
    float* x = hidden.data_ptr<float>();
    auto h = torch::empty_like(hidden);
    for (const Layer& layer : layers_) {
      rms_norm(x, layer.input_norm.data_ptr<float>(), eps_, rows, width, h.data_ptr<float>());
      torch::Tensor qkv = layer.qkv(h).contiguous();
      TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "qkv projection of ", qkv.size(1), " outputs");
      float* qkvp = qkv.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r) {
        const float *c = cos_.data_ptr<float>() + pp[r] * d, *s = sin_.data_ptr<float>() + pp[r] * d;
        rotate(qkvp + r * qkv.size(1), num_heads_ + num_kv_heads_, d, c, s);   // q's heads, then k's
      }
      const auto k = qkv.narrow(1, q_size, kv_size).view({rows, num_kv_heads_, d});
      const auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({rows, num_kv_heads_, d});
      store_kv(k, v, layer.k_cache, layer.v_cache, slot_mapping);
      const auto q = qkv.narrow(1, 0, q_size).contiguous().view({rows, num_heads_, d});
      const auto attn = decode_attention(q, layer.k_cache, layer.v_cache, tables, lens, scale_);
      add_into(x, layer.o(attn.view({rows, q_size})).data_ptr<float>(), rows * width);
      rms_norm(x, layer.post_norm.data_ptr<float>(), eps_, rows, width, h.data_ptr<float>());
      const torch::Tensor gate_up = layer.gate_up(h).contiguous();
      const int64_t inter = gate_up.size(1) / 2;
      auto act = torch::empty({rows, inter}, hidden.options());
      silu_and_mul(gate_up.data_ptr<float>(), rows, inter, act.data_ptr<float>());
      add_into(x, layer.down(act).data_ptr<float>(), rows * width);
    }
    rms_norm(x, final_norm_.data_ptr<float>(), eps_, rows, width, h.data_ptr<float>());
    return h;
  }

 private:
  std::vector<Layer> layers_;
  torch::Tensor final_norm_, cos_, sin_;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  float eps_;
  double scale_;
};

void bind_native_decoder(pybind11::module_& m) {
  pybind11::class_<NativeDecoder>(m, "NativeDecoder")
      .def(pybind11::init<const std::vector<std::vector<torch::Tensor>>&, const std::vector<std::vector<int64_t>>&,
                          torch::Tensor, torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, double, double>())
      .def("step", &NativeDecoder::step, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "one decode-only step: embeddings in, the final norm's output out");
}
