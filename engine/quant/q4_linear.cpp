// y = x W^T for a 4-bit weight with a float32 scale and min per group of 32 inputs
// (engine/quant/formats.py Int4Weight: W[n, k] = q[n, k] * scale[n, k / 32] + min[n, k / 32],
// two q per byte, low nibble first), computed in float32 from the file's exact values.
// Built at first use by engine/quant/q4_fused.py (torch's extension builder).
//
// Per output n and group g of 32 inputs: scale * (codes . x) + min * sum(x), the codes
// converted to float in registers once for up to eight rows of x, everything in float32: the
// reference's numbers (dequantize() then a float32 matmul) up to float32 summation order. torch's packed int4 kernel instead takes bf16 activations, scales and
// zeros and returns bf16, each a 2^-9 rounding (docs/benchmarks.md "Fidelity").
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define Q4_AVX2 1
#endif

#include "cpu_vec.h"

namespace {

constexpr int64_t kGroup = 32;

#ifdef Q4_AVX2
// The 32 codes of one group (16 bytes) as floats, w[0..4) of 8 each. Codes k..k+8 are the eight
// nibbles of one little-endian 32-bit word (low nibble first): broadcast it, shift lane j right
// by 4j, mask. No byte shuffles: those all go to one port on most x86 cores, and the unpack and
// widen form of this took up to 1.26x longer per one-row call (docs/benchmarks.md).
inline void codes(const uint8_t* q, __m256 w[4]) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(0x0F);
  for (int i = 0; i < 4; ++i) {
    int32_t word;
    std::memcpy(&word, q + 4 * i, sizeof(word));
    w[i] = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), shifts), mask));
  }
}

// Q8_0's 32 signed codes of one group (32 bytes) as floats.
inline void codes8(const int8_t* q, __m256 w[4]) {
  for (int i = 0; i < 4; ++i)
    w[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * i))));
}

// Software prefetch of a decode call's weight streams, kPrefetchBytes of codes ahead (and as
// many groups ahead in the scales and mins). A decode call reads each weight byte once, from
// memory; with the hardware prefetcher alone the one-row kernels streamed ~11-13 GB/s inside a
// decode step on a machine that reads ~22 GB/s, and the Q8_0 lm_head took 2.8 ms instead of
// 1.4 (docs/benchmarks.md "Prefetching the weights"). A prefetch never faults, so reaching past
// the end of a weight is harmless. CB: code bytes per group.
constexpr int64_t kPrefetchBytes = 4096;

template <int64_t CB>
inline void prefetch_group(const uint8_t* q, const float* scales, const float* mins, int64_t g) {
  constexpr int64_t ahead = kPrefetchBytes / CB;              // groups
  if ((g * CB) % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(q + g * CB + kPrefetchBytes), _MM_HINT_T0);
  if (g % 16 == 0) {                                          // 16 floats a line
    _mm_prefetch(reinterpret_cast<const char*>(scales + g + ahead), _MM_HINT_T0);
    if (mins != nullptr) _mm_prefetch(reinterpret_cast<const char*>(mins + g + ahead), _MM_HINT_T0);
  }
}

// sum_k W[n, k] x[i, k] = sum_g scale_g (sum_{k in g} q_k x_ik) + sum_g min_g xsum_ig, for rows
// i in [0, R) of x: each group's codes are converted once per R rows. Q8: int8 codes, no min.
template <int R, bool Q8>
inline void row_tile(const uint8_t* q, const float* scales, const float* mins, const float* x,
                     const float* xsum, int64_t k, int64_t groups, float* y, int64_t y_stride) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t g = 0; g < groups; ++g) {
    prefetch_group<Q8 ? kGroup : kGroup / 2>(q, scales, Q8 ? nullptr : mins, g);
    if constexpr (Q8)
      codes8(reinterpret_cast<const int8_t*>(q) + g * kGroup, w);
    else
      codes(q + g * (kGroup / 2), w);
    const __m256 scale = _mm256_set1_ps(scales[g]);
    for (int r = 0; r < R; ++r) {
      const float* xg = x + r * k + g * kGroup;
      __m256 a = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
      __m256 b = _mm256_mul_ps(w[1], _mm256_loadu_ps(xg + 8));
      a = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), a);
      b = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), b);
      acc[r] = _mm256_fmadd_ps(_mm256_add_ps(a, b), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    if constexpr (Q8)
      y[r * y_stride] = hsum(acc[r]);
    else
      y[r * y_stride] = hsum(acc[r]) + dot(mins, xsum + r * groups, groups);
  }
}

// The same sum with x rounded to 16 bits: per group of 32, x ~= xscale * xi, xi int16
// (quantize_rows_i16), so each group's codes . x is xscale times an integer dot product that
// vpmaddwd computes exactly, two codes a lane. That takes about half row_tile's vector work per
// group (no float conversion of every code); the price is x's rounding, at most 2^-16 of the
// group's largest |x| per element, ~1/40 of the error bf16 activations make (docs/benchmarks.md
// "Int16 activations"). xi's group holds the x of the even codes, then the odd ones: the low and
// high nibbles of the group's 16 bytes.
template <int R>
inline void row_tile_i16(const uint8_t* q, const float* scales, const float* mins, const int16_t* xi,
                         const float* xscale, const float* xsum, int64_t k, int64_t groups, float* y,
                         int64_t y_stride) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    prefetch_group<kGroup / 2>(q, scales, mins, g);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * (kGroup / 2)));
    const __m256i even = _mm256_cvtepu8_epi16(_mm_and_si128(b, low4));
    const __m256i odd = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), low4));
    const __m256 scale = _mm256_set1_ps(scales[g]);
    for (int r = 0; r < R; ++r) {
      const int16_t* xg = xi + r * k + g * kGroup;
      const __m256i dot32 = _mm256_add_epi32(
          _mm256_madd_epi16(even, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg))),
          _mm256_madd_epi16(odd, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xg + 16))));
      const __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(dot32), _mm256_set1_ps(xscale[r * groups + g]));
      acc[r] = _mm256_fmadd_ps(part, scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r * y_stride] = hsum(acc[r]) + dot(mins, xsum + r * groups, groups);
}

// Many rows: a GEMM. A tile of kTileN outputs is dequantized into a buffer (q * scale + min,
// rounded as formats.dequantize rounds, so these are the reference's weights; Q8: q * scale)
// and multiplied with x held transposed in blocks of kRowBlock rows (xt[k][16], zero past the
// last row), an outer product per input k: kTileN broadcast weights times two vectors of 8 rows
// into 12 accumulators. Each weight is decoded once per call, not once per 8 rows as in
// row_tile, and no float32 copy of the whole weight is written, as dequantize-then-matmul
// (q4deq) writes: at 32 rows 0.51x row_tile's time and 0.78x q4deq's (docs/benchmarks.md).
constexpr int kTileN = 6;
constexpr int64_t kRowBlock = 16;
// From this many rows on, gemm: below, row_tile is as fast or faster (its Q8 form, with no
// mins to add, is the cheaper; the crossings measured in docs/benchmarks.md).
template <bool Q8>
constexpr int64_t gemm_rows() { return Q8 ? 16 : 12; }

// x [M, K] as ceil(M / 16) blocks of [K][16] rows, zero-padded past row M.
void pack_rows(const float* x, int64_t m_rows, int64_t k, float* xt) {
  const int64_t blocks = (m_rows + kRowBlock - 1) / kRowBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* out = xt + b * k * kRowBlock;
      const int64_t rows = std::min(kRowBlock, m_rows - b * kRowBlock);
      if (rows < kRowBlock) std::memset(out, 0, sizeof(float) * k * kRowBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + (b * kRowBlock + r) * k;
        for (int64_t kk = 0; kk < k; ++kk) out[kk * kRowBlock + r] = xr[kk];
      }
    }
  });
}

// Bytes of codes per output row: two Q4 codes a byte, one Q8 code.
template <bool Q8>
constexpr int64_t row_bytes(int64_t k) { return Q8 ? k : k / 2; }

// Outputs [n0, n0 + J) of W dequantized into w[J][K] (Q8: q * scale, exact in float32).
template <int J, bool Q8>
inline void dequant_tile(const uint8_t* q, const float* scales, const float* mins, int64_t k, float* w) {
  const int64_t groups = k / kGroup;
  for (int j = 0; j < J; ++j) {
    for (int64_t g = 0; g < groups; ++g) {
      __m256 c[4];
      if constexpr (Q8)
        codes8(reinterpret_cast<const int8_t*>(q) + j * k + g * kGroup, c);
      else
        codes(q + j * (k / 2) + g * (kGroup / 2), c);
      const __m256 scale = _mm256_set1_ps(scales[j * groups + g]);
      float* out = w + j * k + g * kGroup;
      if constexpr (Q8) {
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(c[i], scale));
      } else {
        const __m256 min = _mm256_set1_ps(mins[j * groups + g]);
        for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(_mm256_mul_ps(c[i], scale), min));
      }
    }
  }
}

// y[r, j] = sum_k w[j][k] xt[k][r] for J outputs and V vectors of 8 rows, into out[J][16]. The
// accumulators are one flat array with unrolled loops: as acc[J][V], g++ kept them in memory
// and stored every one of them on each k; inlined into its caller, one of them still went to the
// stack (the caller's constants hold registers), hence noinline.
template <int J, int V>
__attribute__((noinline)) void micro(const float* w, const float* xt, int64_t k, float* out) {
  __m256 acc[J * V];
#pragma GCC unroll 16
  for (int i = 0; i < J * V; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    __m256 xv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) xv[v] = _mm256_loadu_ps(xt + kk * kRowBlock + 8 * v);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      const __m256 b = _mm256_broadcast_ss(w + j * k + kk);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[j * V + v] = _mm256_fmadd_ps(b, xv[v], acc[j * V + v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < J * V; ++i) _mm256_storeu_ps(out + (i / V) * kRowBlock + 8 * (i % V), acc[i]);
}

// One tile of J outputs for every row of x: dequantized once, then each row block.
template <int J, bool Q8>
void gemm_tile(const uint8_t* q, const float* scales, const float* mins, const float* xt, int64_t m_rows, int64_t k,
               float* w, float* y, int64_t n_rows) {
  dequant_tile<J, Q8>(q, scales, mins, k, w);
  alignas(32) float out[kTileN * kRowBlock];
  for (int64_t r0 = 0; r0 < m_rows; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m_rows - r0);
    if (rows > 8)
      micro<J, 2>(w, xt + r0 * k, k, out);
    else
      micro<J, 1>(w, xt + r0 * k, k, out);
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < J; ++j) y[(r0 + r) * n_rows + j] = out[j * kRowBlock + r];
  }
}

template <bool Q8>
void gemm(const float* x, const uint8_t* q, const float* scales, const float* mins, int64_t m_rows, int64_t k,
          int64_t n_rows, float* y) {
  const int64_t groups = k / kGroup, blocks = (m_rows + kRowBlock - 1) / kRowBlock;
  std::vector<float> xt(static_cast<size_t>(blocks * kRowBlock * k));
  pack_rows(x, m_rows, k, xt.data());
  const int64_t tiles = (n_rows + kTileN - 1) / kTileN;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(kTileN * k));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t * kTileN;
      const uint8_t* qn = q + n * row_bytes<Q8>(k);
      const float *sn = scales + n * groups, *mn = Q8 ? nullptr : mins + n * groups;
      switch (std::min<int64_t>(kTileN, n_rows - n)) {
        case 6: gemm_tile<6, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
        case 5: gemm_tile<5, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
        case 4: gemm_tile<4, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
        case 3: gemm_tile<3, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
        case 2: gemm_tile<2, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
        default: gemm_tile<1, Q8>(qn, sn, mn, xt.data(), m_rows, k, w.data(), y + n, n_rows); break;
      }
    }
  });
}
#endif

// The sum of one group of 32 floats.
inline float group_sum(const float* x) {
#ifdef Q4_AVX2
  return hsum(_mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                            _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24))));
#else
  float sum = 0;
  for (int j = 0; j < kGroup; ++j) sum += x[j];
  return sum;
#endif
}

// Output column n of y for every row of x (xsum: x's sums per group, [M, K / 32]; Q8: unused).
template <bool Q8>
inline void one_output(const uint8_t* q, const float* scales, const float* mins, const float* x, const float* xsum,
                       int64_t m_rows, int64_t k, float* y, int64_t y_stride) {
  const int64_t groups = k / kGroup;
#ifdef Q4_AVX2
  int64_t i = 0;
  for (; i + 8 <= m_rows; i += 8)
    row_tile<8, Q8>(q, scales, mins, x + i * k, xsum + i * groups, k, groups, y + i * y_stride, y_stride);
  for (; i + 4 <= m_rows; i += 4)
    row_tile<4, Q8>(q, scales, mins, x + i * k, xsum + i * groups, k, groups, y + i * y_stride, y_stride);
  for (; i < m_rows; ++i)
    row_tile<1, Q8>(q, scales, mins, x + i * k, xsum + i * groups, k, groups, y + i * y_stride, y_stride);
#else
  for (int64_t i = 0; i < m_rows; ++i) {
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) {
      float dot = 0;
      for (int j = 0; j < kGroup; ++j) {
        const float code = Q8 ? float(reinterpret_cast<const int8_t*>(q)[g * kGroup + j])
                              : float(j % 2 ? q[g * kGroup / 2 + j / 2] >> 4 : q[g * kGroup / 2 + j / 2] & 0x0F);
        dot += code * x[i * k + g * kGroup + j];
      }
      acc += scales[g] * dot + (Q8 ? 0.0f : mins[g] * xsum[i * groups + g]);
    }
    y[i * y_stride] = acc;
  }
#endif
}

// Rows of x as int16 per group of 32 (xi, in row_tile_i16's order: the group's even inputs, then
// its odd ones), their scales (the group's largest |x| / 32767; xi = round(x / scale)) and x's
// own float32 group sums (xsum, for the mins' term, exact as in q4_linear).
void quantize_rows_i16(const float* x, int64_t m_rows, int64_t k, int16_t* xi, float* xscale, float* xsum) {
  const int64_t groups = m_rows * (k / kGroup);
  for (int64_t i = 0; i < groups; ++i) {
    const float* xg = x + i * kGroup;
    float largest = 0;
    for (int j = 0; j < kGroup; ++j) largest = std::max(largest, std::abs(xg[j]));
    const float scale = largest / 32767.0f, inverse = largest > 0 ? 32767.0f / largest : 0.0f;
    int16_t* out = xi + i * kGroup;
    for (int j = 0; j < kGroup / 2; ++j) {
      out[j] = static_cast<int16_t>(std::nearbyint(xg[2 * j] * inverse));
      out[kGroup / 2 + j] = static_cast<int16_t>(std::nearbyint(xg[2 * j + 1] * inverse));
    }
    xscale[i] = scale;
    xsum[i] = group_sum(xg);
  }
}

// Output column n of y for every row of x, from int16 x (quantize_rows_i16).
inline void one_output_i16(const uint8_t* q, const float* scales, const float* mins, const int16_t* xi,
                           const float* xscale, const float* xsum, int64_t m_rows, int64_t k, float* y,
                           int64_t y_stride) {
  const int64_t groups = k / kGroup;
#ifdef Q4_AVX2
  int64_t i = 0;
  for (; i + 4 <= m_rows; i += 4)
    row_tile_i16<4>(q, scales, mins, xi + i * k, xscale + i * groups, xsum + i * groups, k, groups,
                    y + i * y_stride, y_stride);
  for (; i < m_rows; ++i)
    row_tile_i16<1>(q, scales, mins, xi + i * k, xscale + i * groups, xsum + i * groups, k, groups,
                    y + i * y_stride, y_stride);
#else
  for (int64_t i = 0; i < m_rows; ++i) {
    float acc = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const int16_t* xg = xi + i * k + g * kGroup;
      int32_t dot = 0;
      for (int j = 0; j < kGroup / 2; ++j)
        dot += int32_t(q[g * kGroup / 2 + j] & 0x0F) * xg[j] + int32_t(q[g * kGroup / 2 + j] >> 4) * xg[kGroup / 2 + j];
      acc += scales[g] * (float(dot) * xscale[i * groups + g]) + mins[g] * xsum[i * groups + g];
    }
    y[i * y_stride] = acc;
  }
#endif
}

// The Q4 operators' arguments: x float32 [M, K], qweight uint8 [N, K / 2], scales and mins
// float32 [N, K / 32], all contiguous.
void check_q4_args(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                   const torch::Tensor& mins) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: float32 [M, K]");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == torch::kUInt8 && qweight.is_contiguous(),
              "qweight: uint8 [N, K / 2]");
  const int64_t k = x.size(1), n_rows = qweight.size(0), groups = k / kGroup;
  TORCH_CHECK(k % kGroup == 0 && qweight.size(1) * 2 == k, "K must be a multiple of 32 matching qweight");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() && scales.size(0) == n_rows &&
                  scales.size(1) == groups && mins.sizes() == scales.sizes() && mins.is_contiguous() &&
                  mins.scalar_type() == torch::kFloat32, "scales, mins: float32 [N, K / 32]");
}

}  // namespace

torch::Tensor q4_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                        const torch::Tensor& mins) {
  check_q4_args(x, qweight, scales, mins);
  const int64_t m_rows = x.size(0), k = x.size(1), n_rows = qweight.size(0), groups = k / kGroup;
  auto y = torch::empty({m_rows, n_rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* qp = qweight.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* mp = mins.data_ptr<float>();
  float* yp = y.data_ptr<float>();
#ifdef Q4_AVX2
  if (m_rows >= gemm_rows<false>()) {
    gemm<false>(xp, qp, sp, mp, m_rows, k, n_rows, yp);
    return y;
  }
#endif
  // x's sums per group, here rather than with torch's sum: an operator call costs more than the
  // sums (120 calls a decode step on the default model).
  std::vector<float> xsum(static_cast<size_t>(m_rows * groups));
  for (int64_t i = 0; i < m_rows * groups; ++i) xsum[i] = group_sum(xp + i * kGroup);
  const float* xs = xsum.data();
  at::parallel_for(0, n_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      one_output<false>(qp + n * (k / 2), sp + n * groups, mp + n * groups, xp, xs, m_rows, k, yp + n, n_rows);
  });
  return y;
}

// q4_linear with x rounded to int16 per group of 32 (row_tile_i16): for decode-sized batches.
// From gemm_rows on, q4_linear's exact GEMM, which decodes each weight once for all the rows.
torch::Tensor q4_linear_i16(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales,
                            const torch::Tensor& mins) {
#ifdef Q4_AVX2
  if (x.dim() == 2 && x.size(0) >= gemm_rows<false>()) return q4_linear(x, qweight, scales, mins);
#endif
  check_q4_args(x, qweight, scales, mins);
  const int64_t m_rows = x.size(0), k = x.size(1), n_rows = qweight.size(0), groups = k / kGroup;
  auto y = torch::empty({m_rows, n_rows}, x.options());
  std::vector<int16_t> xi(static_cast<size_t>(m_rows * k));
  std::vector<float> xscale(static_cast<size_t>(m_rows * groups)), xsum(xscale.size());
  quantize_rows_i16(x.data_ptr<float>(), m_rows, k, xi.data(), xscale.data(), xsum.data());
  const uint8_t* qp = qweight.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* mp = mins.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      one_output_i16(qp + n * (k / 2), sp + n * groups, mp + n * groups, xi.data(), xscale.data(), xsum.data(),
                     m_rows, k, yp + n, n_rows);
  });
  return y;
}

// y = x W^T for a GGUF Q8_0 weight: W[n, k] = q[n, k] * scale[n, k / 32], q int8 [N, K].
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& qweight, const torch::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: float32 [M, K]");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == torch::kInt8 && qweight.is_contiguous(),
              "qweight: int8 [N, K]");
  const int64_t m_rows = x.size(0), k = x.size(1), n_rows = qweight.size(0), groups = k / kGroup;
  TORCH_CHECK(k % kGroup == 0 && qweight.size(1) == k, "K must be a multiple of 32 matching qweight");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() && scales.size(0) == n_rows &&
                  scales.size(1) == groups, "scales: float32 [N, K / 32]");
  auto y = torch::empty({m_rows, n_rows}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint8_t* qp = reinterpret_cast<const uint8_t*>(qweight.data_ptr<int8_t>());
  const float* sp = scales.data_ptr<float>();
  float* yp = y.data_ptr<float>();
#ifdef Q4_AVX2
  if (m_rows >= gemm_rows<true>()) {
    gemm<true>(xp, qp, sp, nullptr, m_rows, k, n_rows, yp);
    return y;
  }
#endif
  at::parallel_for(0, n_rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      one_output<true>(qp + n * k, sp + n * groups, nullptr, xp, nullptr, m_rows, k, yp + n, n_rows);
  });
  return y;
}

// W as float32 [N, K], the numbers formats.dequantize() gives (q * scale, then + min).
torch::Tensor q4_dequantize(const torch::Tensor& qweight, const torch::Tensor& scales, const torch::Tensor& mins) {
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == torch::kUInt8 && qweight.is_contiguous(),
              "qweight: uint8 [N, K / 2]");
  const int64_t n_rows = qweight.size(0), k = qweight.size(1) * 2, groups = k / kGroup;
  TORCH_CHECK(k % kGroup == 0 && scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() &&
                  scales.size(0) == n_rows && scales.size(1) == groups && mins.sizes() == scales.sizes() &&
                  mins.is_contiguous() && mins.scalar_type() == torch::kFloat32,
              "scales, mins: float32 [N, K / 32]");
  auto w = torch::empty({n_rows, k}, scales.options());
  const uint8_t* qp = qweight.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* mp = mins.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, n_rows * groups, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* q = qp + i * (kGroup / 2);
      float* out = wp + i * kGroup;
#ifdef Q4_AVX2
      __m256 c[4];
      codes(q, c);
      const __m256 scale = _mm256_set1_ps(sp[i]), min = _mm256_set1_ps(mp[i]);
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(_mm256_mul_ps(c[j], scale), min));
#else
      for (int j = 0; j < kGroup / 2; ++j) {
        out[2 * j] = float(q[j] & 0x0F) * sp[i] + mp[i];
        out[2 * j + 1] = float(q[j] >> 4) * sp[i] + mp[i];
      }
#endif
    }
  });
  return w;
}

// engine/attention/cpu_attention.cpp, built into this library.
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale);
bool decode_attention_supported();
void store_kv(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor k_cache, torch::Tensor v_cache,
              const torch::Tensor& slot_mapping);

// The kernels as torch operators pagedkube::q4_linear, q4_linear_i16, q4_dequantize, q8_linear, decode_attention and store_kv, for
// torch.compile's captured step (engine/decode_capture.py), registered when Python asks
// (q4_fused._register: once a process, from the first library loaded). Registered here, a
// call from the compiled step goes through the dispatcher straight to the kernel; as Python
// custom operators each call ran a stack of Python wrappers, ~10% of a captured decode step.
// The shape functions (fake kernels) are Python's.
namespace {
std::unique_ptr<torch::Library> ops_def, ops_cpu;
}

bool register_ops() {
  if (c10::Dispatcher::singleton().findSchema({"pagedkube::q4_linear", ""}).has_value()) return false;
  ops_def = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "pagedkube", std::nullopt, __FILE__, __LINE__);
  ops_def->def("q4_linear(Tensor x, Tensor qweight, Tensor scales, Tensor mins) -> Tensor");
  ops_def->def("q4_linear_i16(Tensor x, Tensor qweight, Tensor scales, Tensor mins) -> Tensor");
  ops_def->def("q4_dequantize(Tensor qweight, Tensor scales, Tensor mins) -> Tensor");
  ops_def->def("q8_linear(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  ops_def->def("decode_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
               "float scale) -> Tensor");
  ops_def->def("store_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  ops_cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "pagedkube", c10::DispatchKey::CPU, __FILE__,
                                             __LINE__);
  ops_cpu->impl("q4_linear", TORCH_FN(q4_linear));
  ops_cpu->impl("q4_linear_i16", TORCH_FN(q4_linear_i16));
  ops_cpu->impl("q4_dequantize", TORCH_FN(q4_dequantize));
  ops_cpu->impl("q8_linear", TORCH_FN(q8_linear));
  ops_cpu->impl("decode_attention", TORCH_FN(decode_attention));
  ops_cpu->impl("store_kv", TORCH_FN(store_kv));
  return true;
}

// native_decode.cpp: the whole decode step in one call (engine/native_decode.py).
void bind_native_decoder(pybind11::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  bind_native_decoder(m);
  m.def("register_ops", &register_ops, "register the torch operators (False: registered already)");
  m.def("q8_linear", &q8_linear, "y = x W^T, W GGUF Q8_0 (int8 codes, float32 scale per 32 inputs), float32");
  m.def("q4_dequantize", &q4_dequantize, "W as float32, as formats.dequantize computes it");
  m.def("decode_attention", &decode_attention, "paged decode attention, float32 (engine/attention/cpu_attention.cpp)");
  m.def("store_kv", &store_kv, "K/V rows into the paged caches at their slots (engine/attention/cpu_attention.cpp)");
  m.def("decode_attention_supported", &decode_attention_supported, "built with AVX2/FMA/F16C");
  m.def("q4_linear", &q4_linear, "y = x W^T, W 4-bit with float32 scale and min per 32 inputs (float32)");
  m.def("q4_linear_i16", &q4_linear_i16, "q4_linear with x rounded to int16 per 32 inputs, for few rows");
}
