// 3x3 convolutions (stride 1, zero padding 1) by Winograd's F(2x2, 3x3) and F(4x4, 3x3), and 1x1 convolutions on
// the same register tiles, for the CPU inference graph of ESRT-layout networks (nala_gen.ops.winograd says
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
//
// Instruction sets: the kernels are written once (winograd_kernels.inc) and compiled twice, for AVX-512F (16-float
// vectors) and for AVX2 with FMA (8-float vectors, a smaller register tile), each under its own target, so that a
// CPU without AVX-512 (most laptops, AMD before Zen 4) runs them too instead of oneDNN's direct kernels. Each call
// names the instruction set (the widest this CPU runs by default); nala_gen.ops.winograd passes the options' cap.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define NALA_WINOGRAD_X86 1
#endif

namespace nala_winograd {

#ifdef NALA_WINOGRAD_X86
#define NALA_INLINE __attribute__((always_inline)) inline

#pragma GCC push_options
#pragma GCC target("avx512f,fma")
namespace avx512 {
using vec = __m512;
constexpr int kLanes = 16, kAccumulators = 16, kWideNB = 2, kNarrowNB = 1;  // 8 tiles x 32 or 16 x 16 channels
NALA_INLINE vec load(const float* p) { return _mm512_loadu_ps(p); }
NALA_INLINE void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
NALA_INLINE vec zero() { return _mm512_setzero_ps(); }
NALA_INLINE vec set1(float f) { return _mm512_set1_ps(f); }
NALA_INLINE vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
NALA_INLINE vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
NALA_INLINE vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
NALA_INLINE vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
NALA_INLINE vec fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
NALA_INLINE const float* broadcast(const float* p) { return p; }
NALA_INLINE vec fmadd_broadcast(const float* p, vec w, vec acc) {
  asm("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*p));
  return acc;
}
#include "winograd_kernels.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using vec = __m256;
// 16 registers: 12 accumulators (6 tiles x 16 channels), 2 weights and a broadcast
constexpr int kLanes = 8, kAccumulators = 12, kWideNB = 2, kNarrowNB = 2;
NALA_INLINE vec load(const float* p) { return _mm256_loadu_ps(p); }
NALA_INLINE void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
NALA_INLINE vec zero() { return _mm256_setzero_ps(); }
NALA_INLINE vec set1(float f) { return _mm256_set1_ps(f); }
NALA_INLINE vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
NALA_INLINE vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
NALA_INLINE vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
NALA_INLINE vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
NALA_INLINE vec fnmadd(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
NALA_INLINE vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
NALA_INLINE vec fmadd_broadcast(vec b, vec w, vec acc) { return _mm256_fmadd_ps(b, w, acc); }
#include "winograd_kernels.inc"
}  // namespace avx2
#pragma GCC pop_options
#undef NALA_INLINE
#endif

// The instruction sets this CPU runs the kernels with, widest first ("avx512", "avx2"; none off x86-64).
const std::vector<std::string>& instruction_sets() {
  static const std::vector<std::string> isas = [] {
    std::vector<std::string> found;
#ifdef NALA_WINOGRAD_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) found.push_back("avx512");
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) found.push_back("avx2");
#endif
    return found;
  }();
  return isas;
}

bool available() { return !instruction_sets().empty(); }

// The instruction set a call runs: `isa` ("avx512" or "avx2"), or the widest this CPU runs for ""
static std::string resolve(const std::string& isa) {
  const auto& isas = instruction_sets();
  TORCH_CHECK(!isas.empty(), "the Winograd kernels need a CPU with AVX-512F or AVX2 and FMA");
  if (isa.empty()) return isas.front();
  TORCH_CHECK(std::find(isas.begin(), isas.end(), isa) != isas.end(), "this CPU does not run the kernels' ", isa,
              " variant (it runs: ", isas.front(), isas.size() > 1 ? ", " + isas.back() : std::string(), ")");
  return isa;
}

// The input channel counts compiled (a constant each: see gemm_tile).
bool supports_channels(int64_t ci) { return ci == 16 || ci == 32 || ci == 48 || ci == 64 || ci == 80 || ci == 144; }

// x (B, Ci, H, W) channels-last float32; packed = G g G^T, (16, Ci, Co) for F(2x2, 3x3) or (36, Ci, Co) for
// F(4x4, 3x3) (16 or 32 input channels); bias (Co,) -> (B, Co, H, W) channels-last. isa: "avx512", "avx2", or ""
// for the widest this CPU runs.
torch::Tensor conv3x3(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bias,
                      const std::string& isa) {
  const std::string chosen = resolve(isa);
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
  if (chosen == "avx512")
    avx512::conv3x3(xp, batch, height, width, ci, positions, up, bp, co, yp);
  else
    avx2::conv3x3(xp, batch, height, width, ci, positions, up, bp, co, yp);
#endif
  return y;
}

// x (B, Ci, H, W) channels-last float32; weight_t (Ci, Co) contiguous; bias (Co,) -> (B, Co, H, W) channels-last.
// isa: as conv3x3's.
torch::Tensor conv1x1(const torch::Tensor& x, const torch::Tensor& weight_t, const torch::Tensor& bias,
                      const std::string& isa) {
  const std::string chosen = resolve(isa);
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
  const float *xp = x.data_ptr<float>(), *wp = weight_t.data_ptr<float>(), *bp = bias.data_ptr<float>();
  if (chosen == "avx512")
    avx512::conv1x1(xp, n, ci, wp, bp, co, y.data_ptr<float>());
  else
    avx2::conv1x1(xp, n, ci, wp, bp, co, y.data_ptr<float>());
#endif
  return y;
}

}  // namespace nala_winograd

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("available", &nala_winograd::available, "whether this CPU runs the kernels (AVX-512F, or AVX2 and FMA)");
  m.def("instruction_sets", &nala_winograd::instruction_sets,
        "the instruction sets this CPU runs the kernels with, widest first");
  m.def("conv1x1", &nala_winograd::conv1x1, "1x1 convolution of a channels-last map, 32 or 144 input channels",
        pybind11::arg("x"), pybind11::arg("weight_t"), pybind11::arg("bias"), pybind11::arg("isa") = "");
  m.def("conv3x3", &nala_winograd::conv3x3,
        "3x3 convolution, stride 1, zero padding 1, by Winograd F(2x2, 3x3) or F(4x4, 3x3) (the packed weight's 16 "
        "or 36 positions say which)",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("bias"), pybind11::arg("isa") = "");
}
