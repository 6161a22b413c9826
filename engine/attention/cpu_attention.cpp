// Decode attention on the CPU straight from the paged KV cache: one query token per sequence,
// its context read block by block through the block table, in float32 (a float16 or bfloat16
// cache converted in registers). torch's path gathers every layer's context into a float32
// copy first, then runs scaled_dot_product_attention on it with a mask: two more passes over
// the context, which at a 1,024-token context was most of a decode step's attention.
//
// Per sequence b and KV head h, for the G query heads that share it (grouped-query attention):
//   s[g, t] = scale * q[g] . k[t]    for t < seq_len[b]
//   out[g]  = sum_t e^(s[g, t] - max_t s[g, t]) v[t] / sum_t e^(s[g, t] - max_t s[g, t])
// torch's numbers up to float32 summation order and the exponential's last bits. With fewer
// (b, h) pairs than twice the threads, each pair's context is split into parts whose sums are
// merged by their largest scores (context_parts).
//
// Built into the same library as the Q4 kernels (engine/quant/q4_fused.py builds both sources;
// q4_linear.cpp registers the operator pagedkube::decode_attention and binds it for eager calls).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTN_AVX2 1
#endif

#include "../quant/cpu_vec.h"

namespace {

#ifdef ATTN_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// s[g][t - t0] = scale * q[g] . k[t] for NG heads (q: [NG][D]) and positions [t0, t1), the
// context's rows through the table.
template <int NG, typename T>
void scores(const float* q, const T* cache, const int64_t* table, int64_t t0, int64_t t1, int64_t block_size,
            int64_t token_stride, int64_t d, float scale, float* s, int64_t s_stride) {
  for (int64_t t = t0; t < t1; ++t) {
    const T* k = cache + (table[t / block_size] * block_size + t % block_size) * token_stride;
    __m256 acc[NG];
    for (int g = 0; g < NG; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
      const __m256 kv = load8(k + i);
      for (int g = 0; g < NG; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), kv, acc[g]);
    }
    for (int g = 0; g < NG; ++g) s[g * s_stride + t - t0] = scale * hsum(acc[g]);
  }
}

// p[t] = e^(s[t] - max s) in place; returns sum_t p[t], and max s in *top_out.
float softmax_terms(float* s, int64_t len, float* top_out) {
  float top = -INFINITY;
  for (int64_t t = 0; t < len; ++t) top = std::max(top, s[t]);
  *top_out = top;
  const __m256 m = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), m));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = hsum(sum);
  for (; t < len; ++t) {
    s[t] = std::exp(s[t] - top);
    total += s[t];
  }
  return total;
}

// out[g][i0 .. i0 + 8C) = sum_t p[g][t - t0] v[t][i0 ..] over [t0, t1) for NG heads: NG x C
// accumulators in registers.
template <int NG, int C, typename T>
void weighted_sum(const float* p, int64_t p_stride, const T* cache, const int64_t* table, int64_t t0, int64_t t1,
                  int64_t block_size, int64_t token_stride, int64_t i0, float* out, int64_t d) {
  __m256 acc[NG * C];
  for (int j = 0; j < NG * C; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t t = t0; t < t1; ++t) {
    const T* v = cache + (table[t / block_size] * block_size + t % block_size) * token_stride + i0;
    __m256 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load8(v + 8 * c);
    for (int g = 0; g < NG; ++g) {
      const __m256 w = _mm256_set1_ps(p[g * p_stride + t - t0]);
      for (int c = 0; c < C; ++c) acc[g * C + c] = _mm256_fmadd_ps(w, vv[c], acc[g * C + c]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + g * d + i0 + 8 * c, acc[g * C + c]);
}

template <int NG, typename T>
void weighted_sums(const float* p, int64_t p_stride, const T* cache, const int64_t* table, int64_t t0, int64_t t1,
                   int64_t block_size, int64_t token_stride, float* out, int64_t d) {
  for (int64_t i0 = 0; i0 < d; i0 += 32) {
    switch (std::min<int64_t>(4, (d - i0) / 8)) {
      case 4: weighted_sum<NG, 4>(p, p_stride, cache, table, t0, t1, block_size, token_stride, i0, out, d); break;
      case 3: weighted_sum<NG, 3>(p, p_stride, cache, table, t0, t1, block_size, token_stride, i0, out, d); break;
      case 2: weighted_sum<NG, 2>(p, p_stride, cache, table, t0, t1, block_size, token_stride, i0, out, d); break;
      default: weighted_sum<NG, 1>(p, p_stride, cache, table, t0, t1, block_size, token_stride, i0, out, d); break;
    }
  }
}

inline void scale_row(float* out, int64_t d, float factor) {
  const __m256 f = _mm256_set1_ps(factor);
  for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), f));
}

// Heads [g0, g0 + NG) of one (sequence, KV head) over positions [t0, t1) (t1 > t0): scores,
// softmax terms, their weighted sum of V left unnormalized in out; each head's largest score
// and sum of terms in tops[g] and totals[g].
template <int NG, typename T>
void attend(const float* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t t0, int64_t t1,
            int64_t block_size, int64_t token_stride, int64_t d, float scale, float* s, float* out, float* tops,
            float* totals) {
  const int64_t len = t1 - t0;
  scores<NG>(q, k_cache, table, t0, t1, block_size, token_stride, d, scale, s, len);
  for (int g = 0; g < NG; ++g) totals[g] = softmax_terms(s + g * len, len, tops + g);
  weighted_sums<NG>(s, len, v_cache, table, t0, t1, block_size, token_stride, out, d);
}

// How many parts each (sequence, KV head) pair's context is split into: one, unless the pairs
// are too few to keep every thread busy (one sequence on the default model is 3 pairs: on two
// threads, one thread did two and the other one). Parts are merged by their softmax statistics
// (flash-decoding); none shorter than kMinPart positions.
constexpr int64_t kMinPart = 64;
int64_t context_parts(int64_t pairs, int64_t longest) {
  const int64_t threads = at::get_num_threads();
  if (threads <= 1 || pairs >= 2 * threads) return 1;
  const int64_t wanted = (2 * threads + pairs - 1) / pairs;
  return std::max<int64_t>(1, std::min(wanted, longest / kMinPart));
}

template <typename T>
void decode_attention_impl(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& tables, const torch::Tensor& lens, double scale, torch::Tensor& out) {
  const int64_t num_seqs = query.size(0), q_heads = query.size(1), d = query.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), width = tables.size(1);
  const int64_t group = q_heads / kv_heads, token_stride = kv_heads * d;
  const float* qp = query.data_ptr<float>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t longest = num_seqs > 0 ? *std::max_element(lp, lp + num_seqs) : 0;
  const int64_t parts = context_parts(num_seqs * kv_heads, longest);
  // Per item (sequence, KV head, part) and query head of the group: largest score and sum of terms;
  // with parts, each part's unnormalized output too (without, it is written in place).
  const int64_t items = num_seqs * kv_heads * parts;
  std::vector<float> tops(static_cast<size_t>(items * group)), totals(tops.size());
  std::vector<float> partial(parts > 1 ? static_cast<size_t>(items * group * d) : 0);
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t pair = item / parts, part = item % parts, b = pair / kv_heads, h = pair % kv_heads;
      const int64_t chunk = (lp[b] + parts - 1) / parts;
      const int64_t t0 = std::min(lp[b], part * chunk), t1 = std::min(lp[b], t0 + chunk);
      s.resize(static_cast<size_t>(3 * std::max<int64_t>(t1 - t0, 1)));
      for (int64_t g0 = 0; g0 < group; g0 += 3) {
        const int64_t head = h * group + g0, stat = item * group + g0;
        const float* q = qp + (b * q_heads + head) * d;
        float* o = parts > 1 ? partial.data() + stat * d : op + (b * q_heads + head) * d;
        const int64_t ng = std::min<int64_t>(3, group - g0);
        if (t1 <= t0) {                 // a part past a short sequence's end: weighs nothing
          std::fill(o, o + ng * d, 0.0f);
          std::fill(tops.data() + stat, tops.data() + stat + ng, -INFINITY);
          std::fill(totals.data() + stat, totals.data() + stat + ng, 0.0f);
          continue;
        }
        const T* k = kp + h * d;
        const T* v = vp + h * d;
        const int64_t* table = tp + b * width;
        float* top = tops.data() + stat;
        float* total = totals.data() + stat;
        switch (ng) {
          case 3: attend<3>(q, k, v, table, t0, t1, block_size, token_stride, d, float(scale), s.data(), o, top, total); break;
          case 2: attend<2>(q, k, v, table, t0, t1, block_size, token_stride, d, float(scale), s.data(), o, top, total); break;
          default: attend<1>(q, k, v, table, t0, t1, block_size, token_stride, d, float(scale), s.data(), o, top, total); break;
        }
        if (parts == 1)
          for (int64_t g = 0; g < ng; ++g) scale_row(o + g * d, d, 1.0f / total[g]);
      }
    }
  });
  if (parts == 1) return;
  // out = sum_p e^(top_p - top) partial_p / sum_p e^(top_p - top) total_p, top = max_p top_p
  at::parallel_for(0, num_seqs * q_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / q_heads, head = row % q_heads, h = head / group, g = head % group;
      const int64_t first = ((b * kv_heads + h) * parts) * group + g;      // part p: first + p * group
      float top = -INFINITY;
      for (int64_t p = 0; p < parts; ++p) top = std::max(top, tops[first + p * group]);
      float* o = op + row * d;
      std::fill(o, o + d, 0.0f);
      float total = 0;
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t stat = first + p * group;
        if (totals[stat] == 0.0f) continue;
        const float w = std::exp(tops[stat] - top);
        total += w * totals[stat];
        const __m256 wv = _mm256_set1_ps(w);
        const float* src = partial.data() + stat * d;
        for (int64_t i = 0; i < d; i += 8)
          _mm256_storeu_ps(o + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(src + i), _mm256_loadu_ps(o + i)));
      }
      scale_row(o, d, 1.0f / total);
    }
  });
}
#endif

}  // namespace

bool decode_attention_supported() {
#ifdef ATTN_AVX2
  return true;
#else
  return false;
#endif
}

// query [B, Hq, D] float32; caches [blocks, block_size, Hkv, D] float32, float16 or bfloat16;
// block_tables [B, W] int64; seq_lens [B] int64 (each >= 1, <= W * block_size) -> [B, Hq, D].
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale) {
  TORCH_CHECK(decode_attention_supported(), "decode_attention: built without AVX2/FMA/F16C");
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == torch::kFloat32 && query.is_contiguous(),
              "query: float32 [B, Hq, D], contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type()
                  && k_cache.is_contiguous() && v_cache.is_contiguous(), "caches: [blocks, block_size, Hkv, D], contiguous");
  const int64_t d = query.size(2), q_heads = query.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && d % 8 == 0 && q_heads % kv_heads == 0, "head size a multiple of 8, Hq % Hkv == 0");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == query.size(0) && block_tables.scalar_type() == torch::kLong
                  && block_tables.is_contiguous(), "block_tables: int64 [B, W]");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == query.size(0) && seq_lens.scalar_type() == torch::kLong,
              "seq_lens: int64 [B]");
  const auto lens = seq_lens.contiguous();
  // Every block the lengths reach must be in the pool: a bad table is an error, not a stray read.
  const int64_t blocks = k_cache.size(0), block_size = k_cache.size(1), width = block_tables.size(1);
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* tp = block_tables.data_ptr<int64_t>();
  for (int64_t b = 0; b < query.size(0); ++b) {
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= width * block_size, "seq_lens[", b, "] = ", lp[b], " outside [1, ",
                width * block_size, "]");
    for (int64_t j = 0; j < (lp[b] + block_size - 1) / block_size; ++j)
      TORCH_CHECK(tp[b * width + j] >= 0 && tp[b * width + j] < blocks, "block_tables[", b, ", ", j, "] = ",
                  tp[b * width + j], " outside the pool's ", blocks, " blocks");
  }
  auto out = torch::empty_like(query);
#ifdef ATTN_AVX2
  switch (k_cache.scalar_type()) {
    case torch::kFloat32: decode_attention_impl<float>(query, k_cache, v_cache, block_tables, lens, scale, out); break;
    case torch::kFloat16: decode_attention_impl<c10::Half>(query, k_cache, v_cache, block_tables, lens, scale, out); break;
    case torch::kBFloat16: decode_attention_impl<c10::BFloat16>(query, k_cache, v_cache, block_tables, lens, scale, out); break;
    default: TORCH_CHECK(false, "caches: float32, float16 or bfloat16");
  }
#endif
  return out;
}

namespace {

template <typename From, typename To>
void store_rows(const torch::Tensor& rows, const int64_t* slots, torch::Tensor& cache) {
  const int64_t count = rows.size(0), width = rows.size(1) * rows.size(2), stride = rows.stride(0);
  const From* src = rows.data_ptr<From>();
  To* dst = cache.data_ptr<To>();
  at::parallel_for(0, count, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const From* in = src + t * stride;
      To* out = dst + slots[t] * width;
      for (int64_t i = 0; i < width; ++i) out[i] = static_cast<To>(static_cast<float>(in[i]));
    }
  });
}

template <typename From>
void store_into(const torch::Tensor& rows, const int64_t* slots, torch::Tensor& cache) {
  switch (cache.scalar_type()) {
    case torch::kFloat32: store_rows<From, float>(rows, slots, cache); break;
    case torch::kFloat16: store_rows<From, c10::Half>(rows, slots, cache); break;
    case torch::kBFloat16: store_rows<From, c10::BFloat16>(rows, slots, cache); break;
    default: TORCH_CHECK(false, "caches: float32, float16 or bfloat16");
  }
}

void store(const torch::Tensor& rows, const int64_t* slots, torch::Tensor& cache) {
  switch (rows.scalar_type()) {
    case torch::kFloat32: store_into<float>(rows, slots, cache); break;
    case torch::kFloat16: store_into<c10::Half>(rows, slots, cache); break;
    case torch::kBFloat16: store_into<c10::BFloat16>(rows, slots, cache); break;
    default: TORCH_CHECK(false, "key, value: float32, float16 or bfloat16");
  }
}

}  // namespace

// This step's K/V rows into the paged caches: key, value [T, Hkv, D] (float32, float16 or
// bfloat16; rows may be strided) -> k_cache, v_cache [blocks, block_size, Hkv, D] at flat slot slot_mapping[t] (int64,
// each in [0, blocks * block_size)), converted to the cache's dtype as torch's .to() rounds
// (to nearest even). torch_backend's write is two index_copy_ calls behind a Python operator
// under torch.compile (~17 us a layer here against ~2 us for this).
void store_kv(const torch::Tensor& key, const torch::Tensor& value, torch::Tensor k_cache, torch::Tensor v_cache,
              const torch::Tensor& slot_mapping) {
  // Each row's [Hkv, D] contiguous; rows may be strided (v is a view of the fused qkv output).
  const auto rows_ok = [](const torch::Tensor& x) { return x.stride(2) == 1 && x.stride(1) == x.size(2); };
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes() && key.scalar_type() == value.scalar_type() &&
                  rows_ok(key) && rows_ok(value), "key, value: [T, Hkv, D] of one dtype, each row's [Hkv, D] contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type()
                  && k_cache.is_contiguous() && v_cache.is_contiguous(), "caches: [blocks, block_size, Hkv, D], contiguous");
  TORCH_CHECK(key.size(1) == k_cache.size(2) && key.size(2) == k_cache.size(3), "key ", key.sizes(),
              " does not match the caches' [Hkv, D] ", k_cache.sizes());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0) && slot_mapping.scalar_type() == torch::kLong,
              "slot_mapping: int64 [T]");
  const auto slots = slot_mapping.contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < key.size(0); ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "slot_mapping[", t, "] = ", sp[t], " outside the pool's ", num_slots,
                " slots");
  store(key, sp, k_cache);
  store(value, sp, v_cache);
}
