// Attention that reads each row's keys and values where they lie (lookahead/paged_attention.py): rows at any
// offsets of the batch cache's token-major pool, or any [rows, kv_heads, len, dim] view.
//
// A task is one row's KV heads: its queries of each head's group, packed as the rows of one small matrix, against
// the row's keys, in float32 with vectorized blocks. Every query's output is a function of its own visible keys
// (in order) alone: its scores are one dot product per key in a fixed order, its maximum is a maximum, its
// normaliser and weighted sum run over the keys in order (a masked key adds an exact zero). So a token gets the
// same bits verified alone, inside a tree or inside a batch: what exact attention needs (attention.py).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

namespace {

struct bf16 { uint16_t bits; };

inline float widen(float x) { return x; }
inline float widen(bf16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline float widen(_Float16 x) { return float(x); }
inline void narrow(float a, float* p) { *p = a; }
inline void narrow(float a, _Float16* p) { *p = _Float16(a); }
inline void narrow(float f, bf16* p) {  // to nearest even, as torch's .to(bfloat16) rounds
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = uint16_t((u >> 16) | 0x40); return; }
  u += 0x7fffu + ((u >> 16) & 1u);
  p->bits = uint16_t(u >> 16);
}

struct Args {
  const void* q; const void* k; const void* v; void* out;  // q, out [tokens, heads, dim]; k, v: see the strides
  const int64_t* bases; const int64_t* kv_lens;             // [rows] element offset of the row's key 0; keys it reads
  const int64_t* starts; const int64_t* counts;              // [rows] the row's queries in the packed tokens
  const uint8_t* mask; int64_t mask_row, mask_slot;          // row b's query s sees key j iff mask[b*mask_row + s*mask_slot + j]
  int64_t rows, heads, kv_heads, dim; double scale;
  int64_t tok_stride, head_stride;                           // elements from key j to j + 1, from head h to h + 1
};

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
constexpr int W = 8;    // floats per vector
constexpr int JB = 32;  // keys per block: 4 vectors of scores per query

inline f8 splat(float x) { return f8{x, x, x, x, x, x, x, x}; }
inline f8 load(const float* p) { f8 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

// e^x for x <= 0 (scores less their row's max): Cephes' expf polynomial, within 2 ulp; 0 below -87.3 and at -inf.
inline f8 exp_neg(f8 x) {
  const f8 lo = splat(-87.3f);
  const i8 dead = x < lo;
  x = dead ? lo : x;
  const f8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  f8 n = (x * splat(1.44269504088896341f) + magic) - magic;
  f8 r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  f8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  i8 e = (__builtin_convertvector(n, i8) + 127) << 23;
  f8 scale; std::memcpy(&scale, &e, sizeof scale);
  f8 y = p * scale;
  return dead ? splat(0.0f) : y;
}

struct Scratch { std::vector<float> qf, kt, vb, sc, acc, tot; };

template <int QB>  // scores of queries i .. i + QB - 1 of head h against the JB keys in s.kt (one kt load serves QB)
inline void qk_block(Scratch& s, int64_t h, int64_t Q, int64_t i, int64_t D, int64_t npad, int64_t j0) {
  f8 r[QB][4];
  for (int u = 0; u < QB; ++u)
    for (int v = 0; v < 4; ++v) r[u][v] = splat(0);
  const float* x = &s.qf[(h * Q + i) * D];
  const float* kh = &s.kt[h * D * JB];
  for (int64_t d = 0; d < D; ++d) {
    const float* kt = kh + d * JB;
    const f8 k0 = load(kt), k1 = load(kt + W), k2 = load(kt + 2 * W), k3 = load(kt + 3 * W);
    for (int u = 0; u < QB; ++u) {
      const f8 xd = splat(x[u * D + d]);
      r[u][0] += xd * k0; r[u][1] += xd * k1; r[u][2] += xd * k2; r[u][3] += xd * k3;
    }
  }
  for (int u = 0; u < QB; ++u) {
    float* dst = &s.sc[(h * Q + i + u) * npad + j0];
    for (int v = 0; v < 4; ++v) store(dst + v * W, r[u][v]);
  }
}

template <int QB, int NV>  // acc of queries i .. i + QB - 1, dims [dc, dc + NV*W): += sum_j p[i][j] * vb[j][dc ..]
inline void pv_block(float* acc, const float* p, int64_t npad, const float* vb, int64_t jn, int64_t D, int64_t dc) {
  f8 r[QB][NV];
  for (int u = 0; u < QB; ++u)
    for (int v = 0; v < NV; ++v) r[u][v] = load(acc + u * D + dc + v * W);
  for (int64_t jj = 0; jj < jn; ++jj) {
    const float* vp = vb + jj * D + dc;
    f8 x[NV];
    for (int v = 0; v < NV; ++v) x[v] = load(vp + v * W);
    for (int u = 0; u < QB; ++u) {
      const f8 w = splat(p[u * npad + jj]);
      for (int v = 0; v < NV; ++v) r[u][v] += w * x[v];
    }
  }
  for (int u = 0; u < QB; ++u)
    for (int v = 0; v < NV; ++v) store(acc + u * D + dc + v * W, r[u][v]);
}

template <int QB>  // queries i .. i + QB - 1 over every dim
inline void pv_rows(float* acc, const float* p, int64_t npad, const float* vb, int64_t jn, int64_t D) {
  int64_t dc = 0;
  for (; dc + 4 * W <= D; dc += 4 * W) pv_block<QB, 4>(acc, p, npad, vb, jn, D, dc);
  for (; dc + W <= D; dc += W) pv_block<QB, 1>(acc, p, npad, vb, jn, D, dc);
}

// KV heads [h0, h1) of row b. Keys and values are read a block of JB tokens at a time, each token's slice for these
// heads in one contiguous run, so the pool streams through once.
template <typename T>
void attend(const Args& a, int64_t b, int64_t h0, int64_t h1, Scratch& s) {
  const T* q = static_cast<const T*>(a.q); T* out = static_cast<T*>(a.out);
  const int64_t G = a.heads / a.kv_heads, C = a.counts[b], Q = G * C, D = a.dim, n = a.kv_lens[b], NH = h1 - h0;
  const int64_t npad = (n + JB - 1) / JB * JB, tok = a.tok_stride, hs = a.head_stride;
  s.qf.resize(NH * Q * D); s.kt.resize(NH * D * JB); s.vb.resize(NH * JB * D); s.sc.resize(NH * Q * npad);
  s.acc.assign(NH * Q * D, 0.0f); s.tot.assign(NH * Q, 0.0f);
  const float scale = float(a.scale);
  for (int64_t h = 0; h < NH; ++h)  // qf[h][c * G + g]: the queries of KV head h0 + h, scaled
    for (int64_t c = 0; c < C; ++c)
      for (int64_t g = 0; g < G; ++g) {
        const T* src = q + ((a.starts[b] + c) * a.heads + (h0 + h) * G + g) * D;
        float* dst = &s.qf[(h * Q + c * G + g) * D];
        for (int64_t d = 0; d < D; ++d) dst[d] = widen(src[d]) * scale;
      }
  const T* kbase = static_cast<const T*>(a.k) + a.bases[b] + h0 * hs;
  const T* vbase = static_cast<const T*>(a.v) + a.bases[b] + h0 * hs;
  for (int64_t j0 = 0; j0 < n; j0 += JB) {  // scores: a block of keys, transposed to kt[h][d][jj], against every query
    const int64_t jn = n - j0 < JB ? n - j0 : JB;
    for (int64_t jj = 0; jj < JB; ++jj) {
      const T* kp = kbase + (j0 + jj) * tok;
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t d = 0; d < D; ++d) s.kt[(h * D + d) * JB + jj] = jj < jn ? widen(kp[h * hs + d]) : 0.0f;
    }
    for (int64_t h = 0; h < NH; ++h) {
      int64_t i = 0;
      for (; i + 3 <= Q; i += 3) qk_block<3>(s, h, Q, i, D, npad, j0);
      for (; i < Q; ++i) qk_block<1>(s, h, Q, i, D, npad, j0);
    }
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t h = 0; h < NH; ++h)  // mask, max, exp, sum: per query
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* m = a.mask + b * a.mask_row + c * a.mask_slot;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t i = h * Q + c * G + g;
        float* row = &s.sc[i * npad];
        float mx = ninf;
        for (int64_t j = 0; j < npad; ++j) {
          if (j >= n || !m[j]) row[j] = ninf;
          mx = row[j] > mx ? row[j] : mx;
        }
        if (mx == ninf) { for (int64_t j = 0; j < npad; ++j) row[j] = 0.0f; continue; }
        for (int64_t j = 0; j < npad; j += W) store(row + j, exp_neg(load(row + j) - splat(mx)));
        float t = 0;  // in key order, whatever the row's length: the same sum alone or in a tree
        for (int64_t j = 0; j < n; ++j) t += row[j];
        s.tot[i] = t;
      }
    }
  for (int64_t j0 = 0; j0 < n; j0 += JB) {  // weighted values: a block of values, vb[h][jj][d], every query
    const int64_t jn = n - j0 < JB ? n - j0 : JB;
    for (int64_t jj = 0; jj < jn; ++jj) {
      const T* vp = vbase + (j0 + jj) * tok;
      for (int64_t h = 0; h < NH; ++h)
        for (int64_t d = 0; d < D; ++d) s.vb[(h * JB + jj) * D + d] = widen(vp[h * hs + d]);
    }
    for (int64_t h = 0; h < NH; ++h) {
      const float* vb = &s.vb[h * JB * D];
      int64_t i = 0;
      for (; i + 2 <= Q; i += 2) pv_rows<2>(&s.acc[(h * Q + i) * D], &s.sc[(h * Q + i) * npad + j0], npad, vb, jn, D);
      for (; i < Q; ++i) pv_rows<1>(&s.acc[(h * Q + i) * D], &s.sc[(h * Q + i) * npad + j0], npad, vb, jn, D);
    }
  }
  for (int64_t h = 0; h < NH; ++h)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t i = h * Q + c * G + g;
        T* dst = out + ((a.starts[b] + c) * a.heads + (h0 + h) * G + g) * D;
        const float inv = s.tot[i] > 0 ? 1.0f / s.tot[i] : 0.0f;
        for (int64_t d = 0; d < D; ++d) narrow(s.acc[i * D + d] * inv, dst + d);
      }
}

template <typename T>
void run(const Args& a) {
  // A task is a row's KV heads, all of them while there are rows enough to keep every thread busy (the row's
  // range then streams through once); one head each when there are few rows.
  const int64_t per_row = a.rows >= 2 * omp_get_max_threads() ? 1 : a.kv_heads;
  const int64_t span = a.kv_heads / per_row, tasks = a.rows * per_row;
#pragma omp parallel
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / per_row, h0 = t % per_row * span;
      attend<T>(a, b, h0, h0 + span, s);
    }
  }
}

}  // namespace

// dtype: 0 float32, 1 bfloat16, 2 float16. Returns 0, or 1 for a call it has no path for.
extern "C" int la_paged_attention(const Args* a, int dtype) {
  if (a->dim % W != 0 || a->heads % a->kv_heads != 0) return 1;
  switch (dtype) {
    case 0: run<float>(*a); return 0;
    case 1: run<bf16>(*a); return 0;
    case 2: run<_Float16>(*a); return 0;
  }
  return 1;
}
