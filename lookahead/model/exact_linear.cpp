// A half-precision linear whose every output is summed in one fixed order, whatever the row count
// (lookahead/exact_linear.py): y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), rounded once to the dtype.
//
// Each output owns one vector accumulator; its lanes run over k in chunks, in order, and are added up by one
// fixed reduction at the end. Tiles of rows x outputs only share loads, never sums, so a row's bits do not
// depend on how many rows the call has or where the row sits in it.
#include <cstdint>
#include <cstring>

#include <omp.h>
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t float_to_bf16(float f) {  // to nearest even; NaN stays NaN (what torch's .to(bfloat16) does)
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

struct Args {
  const void* x; const void* w; const float* bias; void* y;  // x [M, K], w [N, K], bias [N] or null, y [M, N]
  int64_t M, N, K;
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// bf16 with the CPU's bf16 dot products: 32 products per instruction into 16 float lanes.
template <int MB, int NB>
inline void tile_bf16(const Args& a, int64_t m0, int64_t n0) {
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < a.K; k += 32) {
    const __mmask32 live = a.K - k >= 32 ? ~__mmask32(0) : (__mmask32(1) << (a.K - k)) - 1;
    __m512i wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_maskz_loadu_epi16(live, w + (n0 + j) * a.K + k);
    for (int i = 0; i < MB; ++i) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(live, x + (m0 + i) * a.K + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, (__m512bh)wv[j]);
    }
  }
  uint16_t* y = static_cast<uint16_t*>(a.y);
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if (a.bias) s += a.bias[n0 + j];
      y[(m0 + i) * a.N + n0 + j] = float_to_bf16(s);
    }
}
#endif

// Any CPU, bf16 or fp16: widen to float, 16 lanes of fused multiply-adds.
typedef float f16v __attribute__((vector_size(64)));

template <typename T> inline float widen(T v);
template <> inline float widen<uint16_t>(uint16_t v) { return bf16_to_float(v); }
template <> inline float widen<_Float16>(_Float16 v) { return float(v); }
inline void narrow(float s, uint16_t* p) { *p = float_to_bf16(s); }
inline void narrow(float s, _Float16* p) { *p = _Float16(s); }

template <typename T, int MB, int NB>
inline void tile_any(const Args& a, int64_t m0, int64_t n0) {
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  f16v acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = f16v{};
  for (int64_t k = 0; k < a.K; k += 16) {
    const int64_t live = a.K - k < 16 ? a.K - k : 16;
    f16v wv[NB], xv;
    for (int j = 0; j < NB; ++j)
      for (int l = 0; l < 16; ++l) wv[j][l] = l < live ? widen<T>(w[(n0 + j) * a.K + k + l]) : 0.0f;
    for (int i = 0; i < MB; ++i) {
      for (int l = 0; l < 16; ++l) xv[l] = l < live ? widen<T>(x[(m0 + i) * a.K + k + l]) : 0.0f;
      for (int j = 0; j < NB; ++j) acc[i][j] += xv * wv[j];
    }
  }
  T* y = static_cast<T*>(a.y);
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) {
      const f16v& v = acc[i][j];  // one fixed pairwise order
      float h8[8], h4[4], h2[2];
      for (int l = 0; l < 8; ++l) h8[l] = v[l] + v[l + 8];
      for (int l = 0; l < 4; ++l) h4[l] = h8[l] + h8[l + 4];
      for (int l = 0; l < 2; ++l) h2[l] = h4[l] + h4[l + 2];
      float s = h2[0] + h2[1];
      if (a.bias) s += a.bias[n0 + j];
      narrow(s, y + (m0 + i) * a.N + n0 + j);
    }
}

template <int MB, int NB>
inline void tile(const Args& a, int dtype, int64_t m0, int64_t n0) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if (dtype == 1) return tile_bf16<MB, NB>(a, m0, n0);
#endif
  if (dtype == 1) return tile_any<uint16_t, MB, NB>(a, m0, n0);
  return tile_any<_Float16, MB, NB>(a, m0, n0);
}

template <int NB>
inline void rows(const Args& a, int dtype, int64_t n0) {  // every row against outputs n0 .. n0 + NB - 1
  int64_t m = 0;
  for (; m + 4 <= a.M; m += 4) tile<4, NB>(a, dtype, m, n0);
  switch (a.M - m) {
    case 3: tile<3, NB>(a, dtype, m, n0); break;
    case 2: tile<2, NB>(a, dtype, m, n0); break;
    case 1: tile<1, NB>(a, dtype, m, n0); break;
  }
}

}  // namespace

// dtype: 1 bfloat16, 2 float16 (the paged attention's codes). Returns 0, or 1 for a dtype it has no path for.
extern "C" int la_exact_linear(const Args* a, int dtype) {
  if (dtype != 1 && dtype != 2) return 1;
  const int64_t blocks = (a->N + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * 4;
    switch (a->N - n0 >= 4 ? 4 : a->N - n0) {
      case 4: rows<4>(*a, dtype, n0); break;
      case 3: rows<3>(*a, dtype, n0); break;
      case 2: rows<2>(*a, dtype, n0); break;
      case 1: rows<1>(*a, dtype, n0); break;
    }
  }
  return 0;
}
