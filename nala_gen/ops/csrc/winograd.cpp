// 3x3 convolutions (stride 1, zero padding 1) by Winograd's F(2x2, 3x3) and F(4x4, 3x3), and 1x1 convolutions on
// the same register tiles, for the CPU inference graph of ESRT-layout networks (nala_gen.sr.archs.winograd says
// when each is used).
//
// Each 2x2 block of outputs is A^T [ sum_ci (G g G^T)_ci (.) (B^T d B)_ci ] A, d the block's 4x4 input patch: 16
// multiply-adds per input channel and output channel where the direct convolution needs 36 (F(4x4, 3x3), below:
// 36 for a 4x4 block where it needs 144). NaLaSR's and ESRT's convolutions have 16 to 32 input channels, which
// oneDNN's direct kernels run below their rate on wide ones, so fewer multiply-adds is where the time is
// (docs/results/peers.md, "Where the time goes").
//
// Layout: channels-last (B, H, W, C) float32 input and output; the weight pre-transformed by the caller to
// U (16, Ci, Co) = G g G^T, position-major (36 positions for F(4x4, 3x3), below). Per job, one segment of a row
// of 2x2 blocks ("tiles"):
//   1. the input transform of its tiles into V (16, tiles, Ci), in cache: each input column's B^T d once, kept in
//      registers for the next tile, which shares two columns;
//   2. per 32 (or 16) output channels and per position p, M_p (tiles, 32) = V_p (tiles, Ci) @ U_p (Ci, 32), a
//      register tile of 8 tiles x 32 channels (16 x 16) whose V operand is the FMA's broadcast memory operand (a
//      load: a register broadcast is a shuffle, which competes with the FMAs for the same pipes on AMD's Zen 4);
//   3. the output transform of M into the output, with the bias.
// The transforms, not the products, were most of the time until V's and M's positions were set apart by more than a
// multiple of 4 KB (kSkew). Ci must be a multiple of 16 and Co of 16 (the caller checks); inputs of any size.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NALA_WINOGRAD_X86 1
#endif

namespace nala_winograd {

#ifdef NALA_WINOGRAD_X86
#pragma GCC push_options
#pragma GCC target("avx512f,fma")

constexpr int kSegment = 64;  // tiles per job: V and M of one job stay in L2 (2 x 128 KB at 32 channels)
constexpr int kPrefetch = 16;  // input columns ahead of the one transformed
constexpr int kSkew = 16;     // floats between positions' blocks of V and M beyond their size: their strides would
                              // be multiples of 4 KB, so the 16 positions of a tile would fall in one L1 set

// floats from one position's block of V (tiles x CI) or M (tiles x width) to the next
constexpr int64_t position_stride(int channels, int segment = kSegment) { return (int64_t)segment * channels + kSkew; }

// A register tile: 16 accumulators of 16 floats, kTiles<NB> tiles x NB vectors of output channels (NB = 2: 8 tiles
// x 32 channels; NB = 1: 16 tiles x 16 channels, for outputs of 16k channels).
template <int NB>
constexpr int kTiles = 16 / NB;

// M (kTiles, 16 NB of ldm) = V (kTiles, CI) @ U (CI, 16 NB of ldu) (+ bias): CI a constant, so every V operand is
// one base register plus a fixed displacement (no chain of address adds).
template <int CI, int NB>
__attribute__((always_inline)) inline void gemm_tile(const float* v, const float* u, int64_t ldu, float* m,
                                                     int64_t ldm = 16 * NB, const float* bias = nullptr) {
  constexpr int T = kTiles<NB>;
  __m512 acc[T][NB];
  for (int k = 0; k < NB; ++k) {
    const __m512 start = bias ? _mm512_loadu_ps(bias + 16 * k) : _mm512_setzero_ps();
    for (int t = 0; t < T; ++t) acc[t][k] = start;
  }
  for (int ci = 0; ci < CI; ++ci) {
    __m512 w[NB];
    for (int k = 0; k < NB; ++k) w[k] = _mm512_loadu_ps(u + ci * ldu + 16 * k);
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < NB; ++k)
        asm("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc[t][k]) : "v"(w[k]), "m"(v[t * CI + ci]));
  }
  for (int t = 0; t < T; ++t)
    for (int k = 0; k < NB; ++k) _mm512_storeu_ps(m + t * ldm + 16 * k, acc[t][k]);
}

// M_p = V_p @ U_p for the P positions of a tile (16 for F(2x2, 3x3), 36 for F(4x4, 3x3)), S tiles per segment
template <int CI, int NB, int P = 16, int S = kSegment>
void gemm_positions(const float* V, const float* U, int64_t co_total, int64_t co, int tiles, float* M) {
  for (int p = 0; p < P; ++p) {
    const float* v = V + p * position_stride(CI, S);
    const float* u = U + (int64_t)p * CI * co_total + co;
    float* m = M + p * position_stride(16 * NB, S);
    for (int t = 0; t < tiles; t += kTiles<NB>) gemm_tile<CI, NB>(v + t * CI, u, co_total, m + t * 16 * NB);
  }
}

// B^T d of one input column (its 4 rows), 16 channels: rows[i] + ix * step[i] is row i's pixel ix (step 0 and a
// row of zeros outside the image); a column outside the image is zeros.
struct Column {
  __m512 r[4];
};

__attribute__((always_inline)) inline Column column_transform(const float* const rows[4], const int64_t step[4], int ix,
                                                              int width) {
  Column col;
  if (ix < 0 || ix >= width) {
    for (int i = 0; i < 4; ++i) col.r[i] = _mm512_setzero_ps();
    return col;
  }
  __m512 d[4];
  for (int i = 0; i < 4; ++i) {
    d[i] = _mm512_loadu_ps(rows[i] + ix * step[i]);
    _mm_prefetch(reinterpret_cast<const char*>(rows[i] + (ix + kPrefetch) * step[i]), _MM_HINT_T0);
  }
  col.r[0] = _mm512_sub_ps(d[0], d[2]);
  col.r[1] = _mm512_add_ps(d[1], d[2]);
  col.r[2] = _mm512_sub_ps(d[2], d[1]);
  col.r[3] = _mm512_sub_ps(d[1], d[3]);
  return col;
}

// The input transform B^T d B of a row of tiles, 16 channels (rows[] already offset to them), into V[p][t] at v
// (+ t * ci, + p * v_step). Tile t's patch is columns 2t-1 .. 2t+2 from x0 = 2 tx0: neighbours share two columns,
// so each column is transformed once and kept in registers for the next tile.
__attribute__((always_inline)) inline void input_transform(const float* const rows[4], const int64_t step[4], int x0,
                                                           int width, int tiles, int64_t ci, float* v,
                                                           int64_t v_step) {
  Column c0 = column_transform(rows, step, x0 - 1, width), c1 = column_transform(rows, step, x0, width);
  for (int t = 0; t < tiles; ++t) {
    const int ix = x0 + 2 * t;
    const Column c2 = column_transform(rows, step, ix + 1, width), c3 = column_transform(rows, step, ix + 2, width);
    float* o = v + t * ci;
    for (int i = 0; i < 4; ++i, o += 4 * v_step) {
      _mm512_storeu_ps(o, _mm512_sub_ps(c0.r[i], c2.r[i]));
      _mm512_storeu_ps(o + v_step, _mm512_add_ps(c1.r[i], c2.r[i]));
      _mm512_storeu_ps(o + 2 * v_step, _mm512_sub_ps(c2.r[i], c1.r[i]));
      _mm512_storeu_ps(o + 3 * v_step, _mm512_sub_ps(c1.r[i], c3.r[i]));
    }
    c0 = c2;
    c1 = c3;
  }
}

// A^T m A + bias of one tile's 16 channels (m[p] at m + p * m_step) -> its 2x2 outputs, those inside the image.
__attribute__((always_inline)) inline void output_transform(const float* m, int64_t m_step, const float* bias, float* out, int64_t row_step,
                             int64_t co_total, bool second_row, bool second_col) {
  __m512 a0[4], a1[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 m0 = _mm512_loadu_ps(m + j * m_step), m1 = _mm512_loadu_ps(m + (4 + j) * m_step);
    const __m512 m2 = _mm512_loadu_ps(m + (8 + j) * m_step), m3 = _mm512_loadu_ps(m + (12 + j) * m_step);
    a0[j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
    a1[j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
  }
  const __m512 b = _mm512_loadu_ps(bias);
  const __m512* a[2] = {a0, a1};
  for (int i = 0; i < (second_row ? 2 : 1); ++i) {
    const __m512* s = a[i];
    _mm512_storeu_ps(out + i * row_step, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), s[2]), b));
    if (second_col)
      _mm512_storeu_ps(out + i * row_step + co_total,
                       _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[1], s[2]), s[3]), b));
  }
}

alignas(64) static const float kZeroRow[16] = {};  // a row outside the image: 16 channels of zeros, step 0

// Rows iy0 .. iy0 + N - 1 of image b of a channels-last (B, H, W, CI) map and the step between their pixels; rows
// outside the image are kZeroRow with step 0, so the transforms read them without a branch.
template <int N, int CI>
__attribute__((always_inline)) inline void patch_rows(const float* x, int64_t b, int iy0, int height, int width,
                                                      const float* rows[N], int64_t step[N]) {
  for (int i = 0; i < N; ++i) {
    const int iy = iy0 + i;
    const bool inside = iy >= 0 && iy < height;
    rows[i] = inside ? x + ((b * height + iy) * width) * (int64_t)CI : kZeroRow;
    step[i] = inside ? CI : 0;
  }
}

template <int CI, int NB>
void conv_segment(const float* x, int64_t b, int ty, int tx0, int height, int width, const float* U,
                  const float* bias, int64_t co_total, float* y, float* V, float* M) {
  constexpr int W = 16 * NB;  // output channels per block
  const int tiles_w = (width + 1) / 2, tiles = std::min(kSegment, tiles_w - tx0);
  const int padded = (tiles + kTiles<NB> - 1) / kTiles<NB> * kTiles<NB>;  // whole register tiles
  const float* rows[4];
  int64_t step[4];
  patch_rows<4, CI>(x, b, 2 * ty - 1, height, width, rows, step);
  const int64_t v_step = position_stride(CI);
  for (int c = 0; c < CI; c += 16) {
    const float* chunk[4];
    for (int i = 0; i < 4; ++i) chunk[i] = rows[i] + (step[i] ? c : 0);
    // the padded tiles past the segment's last one read columns past the image (zeros) or inside it (finite):
    // their products are computed and never written out
    input_transform(chunk, step, 2 * tx0, width, padded, CI, V + c, v_step);
  }
  const bool second_row = 2 * ty + 1 < height;
  const int64_t row_step = (int64_t)width * co_total;
  float* out_row = y + ((b * height + 2 * ty) * width) * co_total;
  for (int64_t co = 0; co < co_total; co += W) {
    gemm_positions<CI, NB>(V, U, co_total, co, padded, M);
    for (int t = 0; t < tiles; ++t) {
      const int ox = 2 * (tx0 + t);
      for (int k = 0; k < W; k += 16)
        output_transform(M + t * W + k, position_stride(W), bias + co + k, out_row + ox * co_total + co + k,
                         row_step, co_total, second_row, ox + 1 < width);
    }
  }
}

// ---- F(4x4, 3x3): 6x6 input patches, 4x4 blocks of outputs, 36 positions: 36 multiply-adds per channel pair for
// 16 outputs (2.25 each against F(2x2, 3x3)'s 4), for larger transforms with entries up to 8 (B^T, A^T below; the
// weight's G g G^T is made by the caller). Used for 16 and 32 input channels, where the products are the larger
// share; the rounding stays near float32's (tests).

constexpr int kSegment4 = 32;  // 4x4 blocks per job: V and M of 36 positions stay in L2 (2 x 150 KB at 32 channels)

// B^T x of 6 values (rows of a patch column, or a row of the column-transformed patch)
__attribute__((always_inline)) inline void bt6(const __m512 x[6], __m512 r[6]) {
  const __m512 four = _mm512_set1_ps(4.f), five = _mm512_set1_ps(5.f), two = _mm512_set1_ps(2.f);
  const __m512 a = _mm512_fnmadd_ps(four, x[2], x[4]), b = _mm512_fnmadd_ps(four, x[1], x[3]);
  const __m512 c = _mm512_sub_ps(x[4], x[2]), e = _mm512_mul_ps(two, _mm512_sub_ps(x[3], x[1]));
  r[0] = _mm512_fmadd_ps(four, x[0], _mm512_fnmadd_ps(five, x[2], x[4]));
  r[1] = _mm512_add_ps(a, b);
  r[2] = _mm512_sub_ps(a, b);
  r[3] = _mm512_add_ps(c, e);
  r[4] = _mm512_sub_ps(c, e);
  r[5] = _mm512_fmadd_ps(four, x[1], _mm512_fnmadd_ps(five, x[3], x[5]));
}

// A^T m of 6 values -> 4
__attribute__((always_inline)) inline void at6(const __m512 m[6], __m512 o[4]) {
  const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
  o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
  o[1] = _mm512_fmadd_ps(_mm512_set1_ps(2.f), d34, d12);
  o[2] = _mm512_fmadd_ps(_mm512_set1_ps(4.f), s34, s12);
  o[3] = _mm512_add_ps(_mm512_fmadd_ps(_mm512_set1_ps(8.f), d34, d12), m[5]);
}

// B^T d B of one 6x6 patch, 16 channels, into V[p][t] (v + p * v_step, p = 6 i + j); rows[i] + ix * step[i] is
// row i's pixel ix (step 0: a row of zeros), columns outside [0, width) are zeros.
__attribute__((always_inline)) inline void input_transform4(const float* const rows[6], const int64_t step[6], int x0,
                                                            int width, float* v, int64_t v_step) {
  __m512 t[6][6];  // t[i][j]: (B^T d)[i] of column j
  for (int j = 0; j < 6; ++j) {
    const int ix = x0 + j;
    __m512 d[6];
    if (ix >= 0 && ix < width) {
      for (int i = 0; i < 6; ++i) d[i] = _mm512_loadu_ps(rows[i] + ix * step[i]);
    } else {
      for (int i = 0; i < 6; ++i) d[i] = _mm512_setzero_ps();
    }
    __m512 r[6];
    bt6(d, r);
    for (int i = 0; i < 6; ++i) t[i][j] = r[i];
  }
  for (int i = 0; i < 6; ++i) {
    __m512 r[6];
    bt6(t[i], r);
    for (int j = 0; j < 6; ++j) _mm512_storeu_ps(v + (6 * i + j) * v_step, r[j]);
  }
}

// A^T m A + bias of one block's 16 channels (m[p] at m + p * m_step) -> its 4x4 outputs, those inside the image
// (rows: how many of the 4 rows, cols: of the 4 columns).
__attribute__((always_inline)) inline void output_transform4(const float* m, int64_t m_step, const float* bias,
                                                             float* out, int64_t row_step, int64_t co_total,
                                                             int rows, int cols) {
  __m512 a[4][6];  // a[i][j]: (A^T m)[i] of column j
  for (int j = 0; j < 6; ++j) {
    __m512 col[6], o[4];
    for (int i = 0; i < 6; ++i) col[i] = _mm512_loadu_ps(m + (6 * i + j) * m_step);
    at6(col, o);
    for (int i = 0; i < 4; ++i) a[i][j] = o[i];
  }
  const __m512 b = _mm512_loadu_ps(bias);
  for (int i = 0; i < rows; ++i) {
    __m512 o[4];
    at6(a[i], o);
    for (int j = 0; j < cols; ++j) _mm512_storeu_ps(out + i * row_step + j * co_total, _mm512_add_ps(o[j], b));
  }
}

template <int CI, int NB>
void conv_segment4(const float* x, int64_t b, int ty, int tx0, int height, int width, const float* U,
                   const float* bias, int64_t co_total, float* y, float* V, float* M) {
  constexpr int W = 16 * NB;
  const int tiles_w = (width + 3) / 4, tiles = std::min(kSegment4, tiles_w - tx0);
  const int padded = (tiles + kTiles<NB> - 1) / kTiles<NB> * kTiles<NB>;
  const float* rows[6];
  int64_t step[6];
  patch_rows<6, CI>(x, b, 4 * ty - 1, height, width, rows, step);
  const int64_t v_step = position_stride(CI, kSegment4);
  for (int c = 0; c < CI; c += 16) {
    const float* chunk[6];
    for (int i = 0; i < 6; ++i) chunk[i] = rows[i] + (step[i] ? c : 0);
    // the padded blocks past the segment's last one read columns past the image (zeros) or inside it (finite):
    // their products are computed and never written out
    for (int t = 0; t < padded; ++t)
      input_transform4(chunk, step, 4 * (tx0 + t) - 1, width, V + t * CI + c, v_step);
  }
  const int out_rows = std::min(4, height - 4 * ty);
  const int64_t row_step = (int64_t)width * co_total;
  float* out_row = y + ((b * height + 4 * ty) * width) * co_total;
  for (int64_t co = 0; co < co_total; co += W) {
    gemm_positions<CI, NB, 36, kSegment4>(V, U, co_total, co, padded, M);
    for (int t = 0; t < tiles; ++t) {
      const int ox = 4 * (tx0 + t);
      for (int k = 0; k < W; k += 16)
        output_transform4(M + t * W + k, position_stride(W, kSegment4), bias + co + k,
                          out_row + ox * co_total + co + k, row_step, co_total, out_rows, std::min(4, width - ox));
    }
  }
}

// The whole convolution by F(B x B, 3x3) (B = 2 or 4): one job per segment of a row of B x B blocks
template <int CI, int NB, int B>
void conv(const float* x, int64_t batch, int height, int width, const float* U, const float* bias, int64_t co_total,
          float* y) {
  constexpr int P = (B + 2) * (B + 2), S = B == 2 ? kSegment : kSegment4;  // positions, blocks per segment
  const int tiles_h = (height + B - 1) / B, segments = ((width + B - 1) / B + S - 1) / S;
  at::parallel_for(0, batch * tiles_h * segments, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> V(P * position_stride(CI, S)), M(P * position_stride(16 * NB, S));
    for (int64_t job = begin; job < end; ++job) {
      const int64_t b = job / (tiles_h * segments);
      const int ty = job / segments % tiles_h, tx0 = job % segments * S;
      if constexpr (B == 2)
        conv_segment<CI, NB>(x, b, ty, tx0, height, width, U, bias, co_total, y, V.data(), M.data());
      else
        conv_segment4<CI, NB>(x, b, ty, tx0, height, width, U, bias, co_total, y, V.data(), M.data());
    }
  });
}

// 32 output channels per register tile where they divide, 16 otherwise
template <int CI, int B = 2>
void conv_channels(const float* x, int64_t batch, int height, int width, const float* U, const float* bias,
                   int64_t co_total, float* y) {
  if (co_total % 32 == 0)
    conv<CI, 2, B>(x, batch, height, width, U, bias, co_total, y);
  else
    conv<CI, 1, B>(x, batch, height, width, U, bias, co_total, y);
}

// ---- 1x1 convolutions (the graph's per-token Linears) on the same register tiles: y (n, Co) = x (n, CI) @ W (CI,
// Co) + bias, x and y channels-last maps of n pixels.

constexpr int kPointwiseBlock = 64;  // pixels per job

// y (n, Co) = x (n, CI) @ W (CI, Co) + bias, output channels [co, co + 16 NB), for one block of at most
// kPointwiseBlock pixels; the register tile past the block's last whole one runs on a zero-padded copy of its rows
// (xs: 16 rows of CI).
template <int CI, int NB>
void pointwise_channels(const float* x, int64_t n, const float* xs, const float* w, const float* bias,
                        int64_t co_total, int64_t co, float* y) {
  constexpr int T = kTiles<NB>, W = 16 * NB;
  const int64_t whole = n / T * T;
  for (int64_t t = 0; t < whole; t += T)
    gemm_tile<CI, NB>(x + t * CI, w + co, co_total, y + t * co_total + co, co_total, bias + co);
  if (whole < n) {
    alignas(64) float ys[T * W];
    gemm_tile<CI, NB>(xs + (whole % 16) * CI, w + co, co_total, ys, W, bias + co);
    for (int64_t t = whole; t < n; ++t) std::copy(ys + (t - whole) * W, ys + (t - whole + 1) * W, y + t * co_total + co);
  }
}

template <int CI>
void pointwise(const float* x, int64_t n, const float* w, const float* bias, int64_t co_total, float* y) {
  at::parallel_for(0, (n + kPointwiseBlock - 1) / kPointwiseBlock, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float xs[16 * CI];  // the block's last 16-pixel group, zero-padded
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * kPointwiseBlock, count = std::min<int64_t>(kPointwiseBlock, n - first);
      const float* xb = x + first * CI;
      float* yb = y + first * co_total;
      if (count % 16) {  // a tail for 16-pixel tiles (and maybe for 8-pixel ones)
        const int64_t from = count / 16 * 16;
        std::fill(xs, xs + 16 * CI, 0.f);
        std::copy(xb + from * CI, xb + count * CI, xs);
      }
      int64_t co = 0;
      for (; co + 32 <= co_total; co += 32) pointwise_channels<CI, 2>(xb, count, xs, w, bias, co_total, co, yb);
      if (co < co_total) pointwise_channels<CI, 1>(xb, count, xs, w, bias, co_total, co, yb);
    }
  });
}

#pragma GCC pop_options
#endif

bool available() {
#ifdef NALA_WINOGRAD_X86
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// The input channel counts compiled (a constant each: see gemm_tile).
bool supports_channels(int64_t ci) { return ci == 16 || ci == 32 || ci == 48 || ci == 64 || ci == 80 || ci == 144; }

// x (B, Ci, H, W) channels-last float32; packed = G g G^T, (16, Ci, Co) for F(2x2, 3x3) or (36, Ci, Co) for
// F(4x4, 3x3) (16 or 32 input channels); bias (Co,) -> (B, Co, H, W) channels-last.
torch::Tensor conv3x3(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  TORCH_CHECK(available(), "the Winograd convolution needs a CPU with AVX-512F");
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: a 4-D float32 CPU tensor");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "x must be channels-last contiguous");
  const int64_t batch = x.size(0), ci = x.size(1), height = x.size(2), width = x.size(3);
  TORCH_CHECK(supports_channels(ci), "input channels must be 16, 32, 48, 64, 80 or 144, got ", ci);
  const int64_t positions = packed.dim() == 3 ? packed.size(0) : 0;
  TORCH_CHECK((positions == 16 || (positions == 36 && (ci == 16 || ci == 32))) && packed.size(1) == ci &&
                  packed.is_contiguous() && packed.scalar_type() == at::kFloat,
              "packed: a contiguous float32 (16, Ci, Co) weight, or (36, Ci, Co) for 16 or 32 input channels");
  const int64_t co = packed.size(2);
  TORCH_CHECK(co % 16 == 0, "output channels must be a multiple of 16, got ", co);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == co && bias.is_contiguous() && bias.scalar_type() == at::kFloat,
              "bias: a contiguous float32 (Co,)");
  auto y = torch::empty({batch, co, height, width}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
#ifdef NALA_WINOGRAD_X86
  const float *xp = x.data_ptr<float>(), *up = packed.data_ptr<float>(), *bp = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (positions == 36) {
    if (ci == 16)
      conv_channels<16, 4>(xp, batch, height, width, up, bp, co, yp);
    else
      conv_channels<32, 4>(xp, batch, height, width, up, bp, co, yp);
    return y;
  }
  switch (ci) {
    case 16: conv_channels<16>(xp, batch, height, width, up, bp, co, yp); break;
    case 32: conv_channels<32>(xp, batch, height, width, up, bp, co, yp); break;
    case 48: conv_channels<48>(xp, batch, height, width, up, bp, co, yp); break;
    case 64: conv_channels<64>(xp, batch, height, width, up, bp, co, yp); break;
    case 80: conv_channels<80>(xp, batch, height, width, up, bp, co, yp); break;
    default: conv_channels<144>(xp, batch, height, width, up, bp, co, yp); break;
  }
#endif
  return y;
}

// x (B, Ci, H, W) channels-last float32; weight_t (Ci, Co) contiguous; bias (Co,) -> (B, Co, H, W) channels-last
torch::Tensor conv1x1(const torch::Tensor& x, const torch::Tensor& weight_t, const torch::Tensor& bias) {
  TORCH_CHECK(available(), "the kernels need a CPU with AVX-512F");
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: a 4-D float32 CPU tensor");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "x must be channels-last contiguous");
  const int64_t ci = x.size(1);
  TORCH_CHECK(ci == 32 || ci == 144, "input channels must be 32 or 144, got ", ci);
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.size(0) == ci && weight_t.is_contiguous() &&
                  weight_t.scalar_type() == at::kFloat, "weight_t: a contiguous float32 (Ci, Co)");
  const int64_t co = weight_t.size(1);
  TORCH_CHECK(co % 16 == 0, "output channels must be a multiple of 16, got ", co);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == co && bias.is_contiguous() && bias.scalar_type() == at::kFloat,
              "bias: a contiguous float32 (Co,)");
  auto y = torch::empty({x.size(0), co, x.size(2), x.size(3)}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int64_t n = x.size(0) * x.size(2) * x.size(3);
  if (n == 0) return y;
#ifdef NALA_WINOGRAD_X86
  if (ci == 32)
    pointwise<32>(x.data_ptr<float>(), n, weight_t.data_ptr<float>(), bias.data_ptr<float>(), co, y.data_ptr<float>());
  else
    pointwise<144>(x.data_ptr<float>(), n, weight_t.data_ptr<float>(), bias.data_ptr<float>(), co, y.data_ptr<float>());
#endif
  return y;
}

}  // namespace nala_winograd

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &nala_winograd::available, "whether this CPU runs the kernels (AVX-512F)");
  m.def("conv1x1", &nala_winograd::conv1x1, "1x1 convolution of a channels-last map, 32 or 144 input channels");
  m.def("conv3x3", &nala_winograd::conv3x3,
        "3x3 convolution, stride 1, zero padding 1, by Winograd F(2x2, 3x3) or F(4x4, 3x3) (the packed weight's 16 "
        "or 36 positions say which)");
}
