// 3x3 convolution (stride 1, zero padding 1) by Winograd's F(2x2, 3x3) for the CPU inference graph of ESRT-layout
// networks (nala_gen.sr.archs.winograd says when it is used).
//
// Each 2x2 block of outputs is A^T [ sum_ci (G g G^T)_ci (.) (B^T d B)_ci ] A, d the block's 4x4 input patch: 16
// multiply-adds per input channel and output channel where the direct convolution needs 36. NaLaSR's and ESRT's
// convolutions have 16 to 32 input channels, which oneDNN's direct kernels run below their rate on wide ones, so
// fewer multiply-adds is where the time is (docs/results/peers.md, "Where the time goes").
//
// Layout: channels-last (B, H, W, C) float32 input and output; the weight pre-transformed by the caller to
// U (16, Ci, Co) = G g G^T, position-major. Per job, one segment of a row of 2x2 blocks ("tiles"):
//   1. the input transform of its tiles into V (16, tiles, Ci), in cache;
//   2. per 32 output channels and per position p, M_p (tiles, 32) = V_p (tiles, Ci) @ U_p (Ci, 32), a register
//      tile of 8 tiles x 32 channels whose V operand is the FMA's broadcast memory operand (a load: a register
//      broadcast is a shuffle, which competes with the FMAs for the same pipes on AMD's Zen 4);
//   3. the output transform of M into the output, with the bias.
// Ci must be a multiple of 16 and Co of 32 (the caller checks); inputs of any size, odd ones included.

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
constexpr int kTiles = 8;     // tiles per register tile (8 x 2 accumulators of 16 floats)

// M (kTiles, 32) = V (kTiles, CI) @ U (CI, 32 of ldu): CI a constant, so every V operand is one base register
// plus a fixed displacement (no chain of address adds).
template <int CI>
__attribute__((always_inline)) inline void gemm_tile(const float* v, const float* u, int64_t ldu, float* m) {
  __m512 acc[kTiles][2];
  for (int t = 0; t < kTiles; ++t)
    for (int k = 0; k < 2; ++k) acc[t][k] = _mm512_setzero_ps();
  for (int ci = 0; ci < CI; ++ci) {
    __m512 w[2];
    for (int k = 0; k < 2; ++k) w[k] = _mm512_loadu_ps(u + ci * ldu + 16 * k);
    for (int t = 0; t < kTiles; ++t)
      for (int k = 0; k < 2; ++k)
        asm("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc[t][k]) : "v"(w[k]), "m"(v[t * CI + ci]));
  }
  for (int t = 0; t < kTiles; ++t)
    for (int k = 0; k < 2; ++k) _mm512_storeu_ps(m + t * 32 + 16 * k, acc[t][k]);
}

template <int CI>
void gemm_positions(const float* V, const float* U, int64_t co_total, int64_t co, int tiles, float* M) {
  for (int p = 0; p < 16; ++p) {
    const float* v = V + (int64_t)p * kSegment * CI;
    const float* u = U + (int64_t)p * CI * co_total + co;
    float* m = M + (int64_t)p * kSegment * 32;
    for (int t = 0; t < tiles; t += kTiles) gemm_tile<CI>(v + t * CI, u, co_total, m + t * 32);
  }
}

// B^T d B of one tile's 4x4 patch, 16 channels from c, into V[p][t][c..c+15]; rows[i] is input row 2ty-1+i
// (nullptr outside the image), columns outside it or past the segment's tiles read as zeros.
__attribute__((always_inline)) inline void input_transform(const float* const rows[4], int64_t ci, int x0, int width, bool live, int64_t c,
                            float* v, int64_t v_step) {
  __m512 r[4][4];
  for (int j = 0; j < 4; ++j) {  // B^T d column by column: 4 loads -> 4 values, no 4x4 block of inputs held
    const int ix = x0 + j;
    const bool in = live && ix >= 0 && ix < width;
    __m512 d[4];
    for (int i = 0; i < 4; ++i) d[i] = in && rows[i] ? _mm512_loadu_ps(rows[i] + ix * ci + c) : _mm512_setzero_ps();
    r[0][j] = _mm512_sub_ps(d[0], d[2]);
    r[1][j] = _mm512_add_ps(d[1], d[2]);
    r[2][j] = _mm512_sub_ps(d[2], d[1]);
    r[3][j] = _mm512_sub_ps(d[1], d[3]);
  }
  for (int i = 0; i < 4; ++i) {
    float* o = v + (int64_t)(4 * i) * v_step;
    _mm512_storeu_ps(o, _mm512_sub_ps(r[i][0], r[i][2]));
    _mm512_storeu_ps(o + v_step, _mm512_add_ps(r[i][1], r[i][2]));
    _mm512_storeu_ps(o + 2 * v_step, _mm512_sub_ps(r[i][2], r[i][1]));
    _mm512_storeu_ps(o + 3 * v_step, _mm512_sub_ps(r[i][1], r[i][3]));
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

template <int CI>
void conv_segment(const float* x, int64_t b, int ty, int tx0, int height, int width, const float* U,
                  const float* bias, int64_t co_total, float* y, float* V, float* M) {
  const int tiles_w = (width + 1) / 2, tiles = std::min(kSegment, tiles_w - tx0);
  const int padded = (tiles + kTiles - 1) / kTiles * kTiles;  // whole register tiles; the extra ones read zeros
  const float* rows[4];
  for (int i = 0; i < 4; ++i) {
    const int iy = 2 * ty - 1 + i;
    rows[i] = iy >= 0 && iy < height ? x + ((b * height + iy) * width) * (int64_t)CI : nullptr;
  }
  const int64_t v_step = (int64_t)kSegment * CI;
  for (int t = 0; t < padded; ++t)
    for (int64_t c = 0; c < CI; c += 16)
      input_transform(rows, CI, 2 * (tx0 + t) - 1, width, t < tiles, c, V + t * CI + c, v_step);
  const bool second_row = 2 * ty + 1 < height;
  const int64_t row_step = (int64_t)width * co_total;
  float* out_row = y + ((b * height + 2 * ty) * width) * co_total;
  for (int64_t co = 0; co < co_total; co += 32) {
    gemm_positions<CI>(V, U, co_total, co, padded, M);
    for (int t = 0; t < tiles; ++t) {
      const int ox = 2 * (tx0 + t);
      for (int k = 0; k < 32; k += 16)
        output_transform(M + t * 32 + k, (int64_t)kSegment * 32, bias + co + k, out_row + ox * co_total + co + k,
                         row_step, co_total, second_row, ox + 1 < width);
    }
  }
}

template <int CI>
void conv(const float* x, int64_t batch, int height, int width, const float* U, const float* bias, int64_t co_total,
          float* y) {
  const int tiles_h = (height + 1) / 2, segments = ((width + 1) / 2 + kSegment - 1) / kSegment;
  at::parallel_for(0, batch * tiles_h * segments, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> V((size_t)16 * kSegment * CI), M((size_t)16 * kSegment * 32);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t b = job / (tiles_h * segments);
      const int ty = job / segments % tiles_h, segment = job % segments;
      conv_segment<CI>(x, b, ty, segment * kSegment, height, width, U, bias, co_total, y, V.data(), M.data());
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
bool supports_channels(int64_t ci) { return ci == 16 || ci == 32 || ci == 48 || ci == 64; }

// x (B, Ci, H, W) channels-last float32; packed (16, Ci, Co) = G g G^T; bias (Co,) -> (B, Co, H, W) channels-last.
torch::Tensor conv3x3(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias) {
  TORCH_CHECK(available(), "the Winograd convolution needs a CPU with AVX-512F");
  TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "x: a 4-D float32 CPU tensor");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "x must be channels-last contiguous");
  const int64_t batch = x.size(0), ci = x.size(1), height = x.size(2), width = x.size(3);
  TORCH_CHECK(supports_channels(ci), "input channels must be 16, 32, 48 or 64, got ", ci);
  TORCH_CHECK(packed.dim() == 3 && packed.size(0) == 16 && packed.size(1) == ci && packed.is_contiguous() &&
                  packed.scalar_type() == at::kFloat,
              "packed: a contiguous float32 (16, Ci, Co) weight");
  const int64_t co = packed.size(2);
  TORCH_CHECK(co % 32 == 0, "output channels must be a multiple of 32, got ", co);
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == co && bias.is_contiguous() && bias.scalar_type() == at::kFloat,
              "bias: a contiguous float32 (Co,)");
  auto y = torch::empty({batch, co, height, width}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
#ifdef NALA_WINOGRAD_X86
  const float *xp = x.data_ptr<float>(), *up = packed.data_ptr<float>(), *bp = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (ci) {
    case 16: conv<16>(xp, batch, height, width, up, bp, co, yp); break;
    case 32: conv<32>(xp, batch, height, width, up, bp, co, yp); break;
    case 48: conv<48>(xp, batch, height, width, up, bp, co, yp); break;
    default: conv<64>(xp, batch, height, width, up, bp, co, yp); break;
  }
#endif
  return y;
}

}  // namespace nala_winograd

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &nala_winograd::available, "whether this CPU runs the kernels (AVX-512F)");
  m.def("conv3x3", &nala_winograd::conv3x3, "3x3 convolution, stride 1, zero padding 1, by Winograd F(2x2, 3x3)");
}
