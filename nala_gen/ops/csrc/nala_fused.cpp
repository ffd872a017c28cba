// Fused NaLa linear attention for the CPU: forward and backward in tiles of tokens that stay in cache.
//
// out_t = (R_t phi(q_t))^T KV / max(phi(q_t) . z + eps, tiny),  KV = sum_j (R_j phi(k_j)) v_j^T,  z = sum_j phi(k_j)
//
// phi is the NaLa map (nala_gen.attention.kernels.nala_features), R_t the optional RoPE rotation of the numerator
// features. The eager PyTorch form makes a dozen passes over (N, 2d) buffers per call; here each tile of 64 tokens
// is mapped, rotated and multiplied while it is in L1/L2, so the features never exist for all tokens at once.
// Work is split into (batch*head, token range) items handed out by an atomic counter (a core that is busy with
// another process simply takes fewer items), and partial sums are reduced in a fixed order, so results do not
// depend on the thread count or on timing.
//
// The backward recomputes the features tile by tile (nothing O(N F) is saved): one pass over the queries
// accumulates dKV and dz and writes dq, one pass over the keys writes dk and dv.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <immintrin.h>  // the AVX-512 kernels' getexp/scalef (nala_tiles.inc), compiled under their target

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace nala_fused {

struct MapSpec {
  int d, Dp;          // head size and its padded width (multiple of 8)
  float lam, tau, angle_scale;
  bool key_raw;       // keys' magnitude |k_i|^lam (the paper) instead of |dir(k)_i|^lam
  int lam_int;        // lam when it is a whole number in [1, 8] (keys' power by products), else 0
};

// Rows a thread reads after the tile it maps now (`rows` rows of `width` floats, `stride` floats apart). The map
// asks for one of them per token it maps, so that they come from memory in the shadow of its arithmetic: the
// hardware prefetcher follows a stream, not the jump to the next head or tile, and the map then waited for them.
struct Ahead {
  const float* x = nullptr;
  int64_t stride = 0;
  int rows = 0, width = 0;
};

// One thread's scratch for one tile of tokens (pointers into a buffer the thread owns).
struct Tile {
  float *x, *u, *m, *c, *s, *th, *lg;  // T x Dp
  float *phi;                          // T x 2Dp
  float *norm, *power, *tanh_norm;     // T
  float *gdirect;                      // Dp
  Ahead ahead[2];  // what the thread reads next (map_tile asks for one row of each per token it maps)
};

#define NALA_WIDTH 8
#define NALA_AVX 0  // whether the target has AVX's 256-bit instructions (nala_tiles.inc's non-temporal stores)
#define NALA_ISA baseline
#include "nala_tiles.inc"
#include "nala_soa.inc"
#undef NALA_ISA
#undef NALA_AVX
#define NALA_AVX 1

#if defined(__x86_64__) && defined(__GNUC__)
#define NALA_HAVE_X86_TARGETS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define NALA_ISA avx2
#include "nala_tiles.inc"
#include "nala_soa.inc"
#undef NALA_ISA
#pragma GCC pop_options
#undef NALA_WIDTH
#define NALA_WIDTH 16
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")
#define NALA_ISA avx512
#include "nala_tiles.inc"
#include "nala_soa.inc"
#undef NALA_ISA
#pragma GCC pop_options
#endif
#undef NALA_WIDTH
#undef NALA_AVX

struct Kernels {
  const char* name;
  int width;  // floats per vector: heads are padded to a multiple of it
  void (*map_tile)(const MapSpec&, bool, float, const float*, int64_t, int, Tile&, bool);
  void (*rotate_tile)(int, int, const float*, const float*, const float*, int, float*);
  void (*unrotate_tile)(int, int, const float*, const float*, const float*, int, float*);
  void (*gemm_nn)(const float*, int, int, const float*, int, float*);
  void (*gemm_tn_acc)(const float*, int, int, const float*, int64_t, int, float*);
  float (*dot)(const float*, const float*, int);
  float (*max_abs)(const float*, int);
  void (*add_rows)(const float*, int, int, float*);
  void (*axpy)(float, const float*, float*, int);
  void (*finish_tile)(const float*, int, const float*, float, float, const float*, int, int, int, float*, int64_t,
                      bool, const float*, int64_t, float*);
  float (*map_tile_backward)(const MapSpec&, bool, float, const Tile&, const float*, int, float*, int64_t, float*);
  int soa_fb, soa_jb;  // the SoA path's register blocks: features are padded to soa_fb rows, values to soa_jb
  void (*soa_key_tile)(const MapSpec&, int, int, int, int, const float*, int64_t, const float*, int64_t, int,
                       const float*, const float*, int64_t, float*, float*, float*, float*, float*, float*, float*,
                       const Ahead*);
  void (*soa_query_tile)(const MapSpec&, int, int, int, float, const float*, int64_t, int, const float*,
                         const float*, int64_t, const float*, const float*, float, float*, int64_t, const float*,
                         int64_t, float*, float*, float*, float*, const Ahead*);
};

#define NALA_KERNELS(ns) \
  Kernels { #ns, ns::W, ns::map_tile, ns::rotate_tile, ns::unrotate_tile, ns::gemm_nn, ns::gemm_tn_acc, ns::dot, ns::max_abs, ns::add_rows, ns::axpy, ns::finish_tile, \
      ns::map_tile_backward, ns::kSoaFB, ns::kSoaJB, ns::soa_key_tile, ns::soa_query_tile }

static int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// The kernels with the fewest vector operations for a head on this CPU: the 16-float AVX-512 ones unless their
// padding makes the products' vector work (Dp * DVp / W per token) larger than the 8-float AVX2 ones' (heads of 8
// floats, or a small dv beside a large d); their maps never take more vectors. NaLaSR's heads of 18 floats run
// 32-wide (64 vector FMAs per token in each product against 72 at 24 wide, and 2 map vectors against 3): about a
// tenth faster than the AVX2 kernels in timings of its 62,500-token call. Chosen from the shape alone, so forward
// and backward agree.
// A cap (set_isa_cap, from nala_gen.ops.options' fused_isa: NALA_GEN_FUSED_ISA=avx2 or =baseline) narrows the
// choice: to test or time the narrower kernels on a CPU that has wider ones, or to reproduce another machine's bits.
// 0: none, 1: avx2, 2: baseline. Read on every call, so the Python side can pass the options in force.
static std::atomic<int> isa_cap{0};

static const Kernels& kernels(int d = 16, int dv = 16) {
#ifdef NALA_HAVE_X86_TARGETS
  static const bool cpu_avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  static const bool cpu_avx512 = cpu_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  const int cap = isa_cap.load(std::memory_order_relaxed);
  const bool avx2 = cpu_avx2 && cap < 2, avx512 = cpu_avx512 && cap < 1;
  static const Kernels k512 = NALA_KERNELS(avx512), k256 = NALA_KERNELS(avx2);
  const bool wide_pays = round_up(d, 16) * round_up(dv, 16) / 16 <= round_up(d, 8) * round_up(dv, 8) / 8;
  if (avx512 && wide_pays) return k512;
  if (avx2) return k256;
#endif
  static const Kernels base = NALA_KERNELS(baseline);
  return base;
}

constexpr int kTile = 64;  // tokens per tile: 64 x 64 floats of features is 16 KiB, an L1's worth with its operands
constexpr float kTiny = 1.17549435e-38f;

static int round4(int n) { return (n + 3) / 4 * 4; }

// A (B, H, N, width) float tensor read row by row: row (bh, t) starts at rows(bh) + t * stride.
struct Rows {
  const float* data;
  int64_t heads, stride_b, stride_h, stride_n;
  Rows(const at::Tensor& x)
      : data(x.data_ptr<float>()), heads(x.size(1)), stride_b(x.stride(0)), stride_h(x.stride(1)),
        stride_n(x.stride(2)) {}
  const float* at(int64_t bh, int64_t t) const {
    return data + (bh / heads) * stride_b + (bh % heads) * stride_h + t * stride_n;
  }
  float* mut(int64_t bh, int64_t t) const { return const_cast<float*>(at(bh, t)); }
};

// Everything one thread needs for one tile, in one allocation.
struct Scratch {
  std::vector<float> buffer;
  Tile tile;
  float *rot, *grad_phi, *grad_rot, *values, *grads, *outs, *gu;  // rot, grad_*: T x 2Dp; values...: T x DVp
  float* den;                                                     // T
  Scratch(int Dp, int DVp) {
    const int F = 2 * Dp;
    const size_t sizes[] = {7u * kTile * Dp, 3u * kTile * F + kTile * F, 3u * kTile * DVp, 3u * kTile, 2u * Dp, kTile};
    size_t total = 0;
    for (size_t s : sizes) total += s;
    buffer.assign(total, 0.0f);
    float* p = buffer.data();
    auto take = [&p](size_t n) { float* q = p; p += n; return q; };
    tile.x = take(kTile * Dp); tile.u = take(kTile * Dp); tile.m = take(kTile * Dp); tile.c = take(kTile * Dp);
    tile.s = take(kTile * Dp); tile.th = take(kTile * Dp); tile.lg = take(kTile * Dp);
    tile.phi = take(kTile * F); rot = take(kTile * F); grad_phi = take(kTile * F); grad_rot = take(kTile * F);
    values = take(kTile * DVp); grads = take(kTile * DVp); outs = take(kTile * DVp);
    tile.norm = take(kTile); tile.power = take(kTile); tile.tanh_norm = take(kTile);
    tile.gdirect = take(Dp); gu = take(Dp);
    den = take(kTile);
  }
};

// One thread's scratch for the SoA path (nala_soa.inc): rows of TT floats, zero-initialised (the padded feature and
// value rows are never written, so they stay zero). vT also holds a query tile's outputs; acc (`lanes` floats) a key
// item's lane-wise sums.
struct SoaScratch {
  std::vector<float> buffer;
  float *xT, *phiT, *rT, *vT, *acc;
  SoaScratch(int d, int Fp, int DVq, int TT, int64_t lanes = 0)
      : buffer((size_t)(d + 2 * Fp + DVq) * TT + lanes, 0.0f) {
    xT = buffer.data();
    phiT = xT + (size_t)d * TT;
    rT = phiT + (size_t)Fp * TT;
    vT = rT + (size_t)Fp * TT;
    acc = vT + (size_t)DVq * TT;
  }
};

constexpr int kSoaTile = 128;  // tokens per SoA tile (a multiple of two 16-float vectors)

// Orders the calling thread's non-temporal stores before its later stores.
static void fence_streams() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// Run fn(item, scratch) for item in [0, items), items handed out one at a time to the threads of ATen's pool;
// each thread makes its scratch once with make().
template <class Make, class Fn>
static void for_each_item(int64_t items, const Make& make, const Fn& fn) {
  if (items <= 0) return;
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), items));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t slot = begin; slot < end; ++slot) {
      auto scratch = make();
      if constexpr (std::is_invocable_v<const Fn&, int64_t, int64_t, decltype(scratch)&>) {
        // Each thread takes its next item before it runs the current one, so fn knows what it reads next; with
        // few items per thread it does not (a thread could take a pair while another waits), and fn gets -1.
        const bool reserve = items >= 4 * threads;
        for (int64_t item = next.fetch_add(1); item < items;) {
          const int64_t following = reserve ? next.fetch_add(1) : items;
          fn(item, following < items ? following : -1, scratch);
          item = reserve ? following : next.fetch_add(1);
        }
      } else {
        for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) fn(item, scratch);
      }
    }
    fence_streams();  // the thread's non-temporal stores (if any) before the pool's join
  });
}

template <class Fn>
static void for_each_item(int64_t items, int Dp, int DVp, const Fn& fn) {
  for_each_item(items, [Dp, DVp] { return Scratch(Dp, DVp); }, fn);
}

// Copy n rows of `width` floats (row stride `stride`) into a T x padded tile, zero-filling the rest.
static void load_rows(const float* src, int64_t stride, int n, int width, int padded, int rows, float* dst) {
  for (int t = 0; t < rows; ++t) {
    float* out = dst + t * padded;
    if (t < n) {
      std::memcpy(out, src + t * stride, sizeof(float) * width);
      std::fill(out + width, out + padded, 0.0f);
    } else {
      std::fill(out, out + padded, 0.0f);
    }
  }
}

struct Problem {
  MapSpec spec;
  int64_t BH, heads, Nq, Nk;
  int dv, DVp, F;
  bool rope;
  const float *cos, *sin;  // (N, d) RoPE tables, rows by token, when rope
  const float* gamma;      // (heads,) norm scale per head
  float eps_total;
};

static Problem make_problem(int width, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& gamma, double lam, double tau,
                            double angle_scale, bool key_raw, double eps_total) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v must be (B, heads, N, d)");
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu(), "fused NaLa takes float32 CPU tensors");
    TORCH_CHECK(t->stride(3) == 1, "fused NaLa needs a contiguous last dimension");
  }
  Problem p;
  p.spec.d = (int)q.size(3);
  p.spec.Dp = round_up(p.spec.d, width);
  p.spec.lam = (float)lam;
  p.spec.tau = (float)tau;
  p.spec.angle_scale = (float)angle_scale;
  p.spec.key_raw = key_raw;
  p.spec.lam_int = (lam == std::floor(lam) && lam >= 1 && lam <= 8) ? (int)lam : 0;
  p.heads = q.size(1);
  p.BH = q.size(0) * q.size(1);
  p.Nq = q.size(2);
  p.Nk = k.size(2);
  p.dv = (int)v.size(3);
  p.DVp = round_up(p.dv, width);
  p.F = 2 * p.spec.Dp;
  p.rope = cos.defined() && cos.numel() > 0;
  if (p.rope) {
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat, "bad RoPE tables");
    TORCH_CHECK(cos.size(-1) == p.spec.d && cos.size(0) >= std::max(p.Nq, p.Nk), "RoPE tables do not fit the tokens");
  }
  p.cos = p.rope ? cos.data_ptr<float>() : nullptr;
  p.sin = p.rope ? sin.data_ptr<float>() : nullptr;
  TORCH_CHECK(gamma.is_contiguous() && gamma.numel() == p.heads && gamma.scalar_type() == at::kFloat,
              "norm scale must be one float32 per head");
  p.gamma = gamma.data_ptr<float>();
  p.eps_total = (float)eps_total;
  return p;
}

// Map tokens [t0, t0 + n) of one (batch, head) into scratch.tile.phi (rows n..T zero) and scratch.rot (rotated, or
// phi itself without RoPE). Returns the rotated features' pointer and the padded row count.
static const float* map_and_rotate(const Kernels& K, const Problem& P, bool is_query, float gamma, const float* x,
                                   int64_t stride, int64_t t0, int n, int rows, Scratch& s, bool keep) {
  K.map_tile(P.spec, is_query, gamma, x, stride, n, s.tile, keep);
  std::fill(s.tile.phi + (int64_t)n * P.F, s.tile.phi + (int64_t)rows * P.F, 0.0f);
  if (!P.rope) return s.tile.phi;
  K.rotate_tile(P.spec.d, P.spec.Dp, s.tile.phi, P.cos + t0 * P.spec.d, P.sin + t0 * P.spec.d, n, s.rot);
  std::fill(s.rot + (int64_t)n * P.F, s.rot + (int64_t)rows * P.F, 0.0f);
  return s.rot;
}

// Split each head's tiles into groups whose partial sums are reduced in a fixed order. The split depends on the
// shape only (never on the thread count), so every process computes the same bits: about 64 work items in all.
static int64_t group_count(int64_t BH, int64_t tiles) {
  return std::max<int64_t>(1, std::min<int64_t>(tiles, 64 / std::max<int64_t>(BH, 1)));
}

// What a key pass's thread reads after tile `tile` (of TT tokens) of (batch, head) `bh`, whose group of tiles ends
// with `last`: the group's next tile of keys and values, or the first tile of the thread's next item (`following`,
// -1 for none; both key passes hand out items head-fastest, `groups` per head).
static void keys_ahead(const Problem& P, const Rows& kr, const Rows& vr, int64_t TT, int64_t groups, int64_t k_tiles,
                       int64_t bh, int64_t tile, int64_t last, int64_t following, Ahead* ahead) {
  if (tile == last && following < 0) {
    ahead[0] = ahead[1] = {};
    return;
  }
  if (tile < last) {
    ++tile;
  } else {
    bh = following % P.BH;
    tile = following / P.BH * k_tiles / groups;
  }
  const int64_t t0 = tile * TT;
  const int n = (int)std::min<int64_t>(TT, P.Nk - t0);
  ahead[0] = {kr.at(bh, t0), kr.stride_n, n, P.spec.d};
  ahead[1] = {vr.at(bh, t0), vr.stride_n, n, P.dv};
}

// What a query pass's thread reads after head `bh` of its item (the tile at t0 of heads [slot * per_item, (slot + 1)
// * per_item), TT tokens a tile): the item's next head's queries, or the first head's of the thread's next item
// (`following`, -1 for none).
static Ahead queries_ahead(const Problem& P, const Rows& qr, int64_t TT, int64_t slots, int64_t per_item, int64_t bh,
                           int64_t t0, int64_t following) {
  if ((bh + 1) % per_item != 0) {
    return {qr.at(bh + 1, t0), qr.stride_n, (int)std::min<int64_t>(TT, P.Nq - t0), P.spec.d};
  }
  if (following < 0) return {};
  const int64_t f0 = following / slots * TT;
  return {qr.at(following % slots * per_item, f0), qr.stride_n, (int)std::min<int64_t>(TT, P.Nq - f0), P.spec.d};
}

// Key pass: KV (F x DVp) and z (F) per (batch, head), from partial sums per group of tiles, and the largest
// |key component| per (batch, head) while the keys are in cache (the caller checks it for overflow instead of
// making a pass of its own over the keys). Returns {state (BH, F * DVp + F), key_max (BH,)}.
static std::pair<at::Tensor, at::Tensor> key_pass(const Kernels& K, const Problem& P, const at::Tensor& k,
                                                  const at::Tensor& v) {
  const int F = P.F, DVp = P.DVp, Dp = P.spec.Dp;
  const Rows kr(k), vr(v);
  const int64_t k_tiles = (P.Nk + kTile - 1) / kTile;
  const int64_t groups = group_count(P.BH, k_tiles);
  const int64_t state = (int64_t)F * DVp + F;
  at::Tensor partial = at::zeros({P.BH * groups, state + 1}, k.options());
  float* partial_p = partial.data_ptr<float>();
  // Items run head-fastest: the heads of one token range are taken one after another (and by the threads side by
  // side), so a token's row of q, k and v (one per head, interleaved in the caller's projection output) is read
  // from memory once for all heads, not once per head. Which tiles an item sums, and the order of the reduction,
  // do not depend on this order. While a tile computes, the map asks for what the thread reads next (keys_ahead).
  for_each_item(P.BH * groups, Dp, DVp, [&](int64_t item, int64_t following, Scratch& s) {
    const int64_t bh = item % P.BH, g = item / P.BH;
    float* kv = partial_p + (bh * groups + g) * (state + 1);
    float* z = kv + (int64_t)F * DVp;
    float* key_max = z + F;
    const int64_t last = (g + 1) * k_tiles / groups - 1;
    for (int64_t tile = g * k_tiles / groups; tile <= last; ++tile) {
      const int64_t t0 = tile * kTile;
      const int n = (int)std::min<int64_t>(kTile, P.Nk - t0), rows = round4(n);
      keys_ahead(P, kr, vr, kTile, groups, k_tiles, bh, tile, last, following, s.tile.ahead);
      const float* rot = map_and_rotate(K, P, false, 1.0f, kr.at(bh, t0), kr.stride_n, t0, n, rows, s, false);
      *key_max = std::max(*key_max, K.max_abs(s.tile.x, n * Dp));  // tile.x: the tile's keys, zero-padded
      K.add_rows(s.tile.phi, n, F, z);
      // A whole tile of unpadded values is read where it lies; a short or padded one is copied into zeroed rows.
      const bool in_place = n == rows && P.dv == DVp;
      if (!in_place) load_rows(vr.at(bh, t0), vr.stride_n, n, P.dv, DVp, rows, s.values);
      K.gemm_tn_acc(rot, rows, F, in_place ? vr.at(bh, t0) : s.values, in_place ? vr.stride_n : DVp, DVp, kv);
    }
  });
  const at::Tensor per_group = partial.view({P.BH, groups, state + 1});
  at::Tensor kv_state = per_group.narrow(2, 0, state).sum(1);  // groups summed in order
  at::Tensor key_max = std::get<0>(per_group.select(2, state).max(1));
  return {kv_state, key_max};
}

// Bytes above which the query pass streams its output: the size of the highest-level cache Linux lists for CPU 0
// (sysfs: one L3 instance, as lscpu shows; glibc's sysconf adds up the L3s of the whole package), else 32 MiB.
int64_t stream_threshold_bytes() {
  static const int64_t cache = [] {
    int64_t bytes = (int64_t)32 << 20;
    int best = 0;
    for (int index = 0; index < 8; ++index) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
      std::ifstream level_file(dir + "level"), size_file(dir + "size");
      int level = 0;
      int64_t kib = 0;
      std::string unit;
      if (level_file >> level && size_file >> kib >> unit && level > best && kib > 0) {
        best = level;
        bytes = kib << (unit == "M" ? 20 : 10);  // sysfs writes "32768K"
      }
    }
    return bytes;
  }();
  return cache;
}

// Whether the query pass writes `out` (B, H, N, dv) by non-temporal stores: when it is larger than the last-level
// cache (so no reader after the op could find it there) and its rows are whole cache lines (each starts on one and
// dv fills them: every line is written whole, never merged with what memory holds).
bool streams_output(const at::Tensor& out) {
  if (out.numel() * (int64_t)sizeof(float) <= stream_threshold_bytes()) return false;
  if ((uintptr_t)out.data_ptr<float>() % 64 || out.size(3) * sizeof(float) % 64) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (out.size(dim) > 1 && out.stride(dim) * sizeof(float) % 64) return false;
  }
  return true;
}

// Query pass: rows of `out` (any strides) = the attention of each query, plus the row of `addend` when it is
// defined and not empty; the clamped denominators go to `den_p` when it is not null. Each tile of queries is
// independent.
static void query_pass(const Kernels& K, const Problem& P, const at::Tensor& q, const at::Tensor& kv_state,
                       const at::Tensor& out, const at::Tensor& addend, float* den_p) {
  const int F = P.F, DVp = P.DVp, Dp = P.spec.Dp;
  const Rows qr(q), outr(out);
  const bool add = addend.defined() && addend.numel() > 0;
  const Rows addr(add ? addend : out);  // read only when add
  const int64_t state = (int64_t)F * DVp + F;
  const float* state_p = kv_state.data_ptr<float>();
  const int64_t q_tiles = (P.Nq + kTile - 1) / kTile;
  // An item is all heads of a tile of tokens when there are tiles enough to share out, so that one thread writes
  // a token's whole output row (heads side by side in the caller's layout would otherwise be written by two
  // threads into the same cache lines), and it reads a token's q row, interleaved across heads, once.
  const int64_t per_item = (P.BH / P.heads) * q_tiles >= 16 ? P.heads : 1;
  const int64_t slots = P.BH / per_item;
  const bool stream = streams_output(out);
  for_each_item(slots * q_tiles, Dp, DVp, [&](int64_t item, int64_t following, Scratch& s) {
    const int64_t slot = item % slots, t0 = (item / slots) * kTile;
    const int n = (int)std::min<int64_t>(kTile, P.Nq - t0), rows = round4(n);
    for (int64_t bh = slot * per_item; bh < (slot + 1) * per_item; ++bh) {
      s.tile.ahead[0] = queries_ahead(P, qr, kTile, slots, per_item, bh, t0, following);
      const float* kv = state_p + bh * state;
      const float* z = kv + (int64_t)F * DVp;
      const float gamma_h = P.gamma[bh % P.heads];
      const float* rot = map_and_rotate(K, P, true, gamma_h, qr.at(bh, t0), qr.stride_n, t0, n, rows, s, false);
      K.gemm_nn(rot, rows, F, kv, DVp, s.outs);
      K.finish_tile(s.tile.phi, F, z, P.eps_total, kTiny, s.outs, DVp, n, P.dv, outr.mut(bh, t0), outr.stride_n,
                    stream, add ? addr.at(bh, t0) : nullptr, addr.stride_n,
                    den_p ? den_p + bh * P.Nq + t0 : nullptr);
    }
  });
}

static at::Tensor last_dim_contiguous(const at::Tensor& x) { return x.stride(3) == 1 ? x : x.contiguous(); }

std::vector<at::Tensor> forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& gamma, double lam,
                                double tau, double angle_scale, bool key_raw, double eps_total) {
  const at::Tensor q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in), v = last_dim_contiguous(v_in);
  const Kernels& K = kernels((int)q.size(3), (int)v.size(3));
  const Problem P = make_problem(K.width, q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total);
  auto [kv_state, key_max] = key_pass(K, P, k, v);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), P.dv}, q.options());
  at::Tensor den = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  query_pass(K, P, q, kv_state, out, at::Tensor(), den.data_ptr<float>());
  return {out, den, kv_state, key_max};
}

// Whether forward_into takes the SoA kernels: when their products' vector work per token (2d x dv, rounded up to
// their register blocks, over W lanes) is at most 4/5 of the tile kernels' (2Dp x DVp / W, heads padded to a
// vector), which leaves a margin for the SoA path's transposes in and out. NaLaSR's heads of 18: 40.5 against 128
// FMAs per token, SoA; heads of 16 or 32 floats: no padding to save, tiles.
static bool soa_pays(const Kernels& tiles, const Kernels& wide, int d, int dv) {
  const double soa = (double)round_up(2 * d, wide.soa_fb) * round_up(dv, wide.soa_jb) / wide.width;
  const double tile = 2.0 * round_up(d, tiles.width) * round_up(dv, tiles.width) / tiles.width;
  return soa * 1.25 <= tile;
}

// The SoA path's RoPE tables by component, (d, n rounded up to a tile): a tile's lanes read one contiguous slice
// per row. Undefined without RoPE.
static std::pair<at::Tensor, at::Tensor> soa_tables(const Problem& P, const at::Tensor& cos, const at::Tensor& sin,
                                                    int64_t n) {
  if (!P.rope) return {};
  const int64_t tab = (n + kSoaTile - 1) / kSoaTile * kSoaTile;
  at::Tensor cos_t = at::zeros({P.spec.d, tab}, cos.options()), sin_t = at::zeros({P.spec.d, tab}, sin.options());
  const int64_t rows = std::min<int64_t>(cos.size(0), tab);
  cos_t.narrow(1, 0, rows).copy_(cos.narrow(0, 0, rows).t());
  sin_t.narrow(1, 0, rows).copy_(sin.narrow(0, 0, rows).t());
  return {cos_t, sin_t};
}

// The SoA path's key pass (nala_soa.inc), with K the widest kernels (the layout pads no head to a vector):
// {state (BH, Fp * DVq + Fp), key_max (BH,)}, items head-fastest as in key_pass.
static std::pair<at::Tensor, at::Tensor> soa_key_pass(const Kernels& K, const Problem& P, const at::Tensor& k,
                                                      const at::Tensor& v, const at::Tensor& cos_t,
                                                      const at::Tensor& sin_t) {
  const int d = P.spec.d, dv = P.dv, W = K.width, TT = kSoaTile;
  const int Fp = round_up(2 * d, K.soa_fb), DVq = round_up(dv, K.soa_jb);
  const float* cos_p = P.rope ? cos_t.data_ptr<float>() : nullptr;
  const float* sin_p = P.rope ? sin_t.data_ptr<float>() : nullptr;
  const int64_t tab = P.rope ? cos_t.size(1) : 0;
  // Each item sums its tiles' KV (Fp x DVq), z (Fp) and largest |key| lane-wise in its thread's scratch, then
  // across the lanes into its row of `partial` (a few KB per item, where lane-wise rows would be tens of KB: a
  // buffer of megabytes, page-faulted in afresh by every call).
  const Rows kr(k), vr(v);
  const int64_t k_tiles = (P.Nk + TT - 1) / TT;
  const int64_t groups = group_count(P.BH, k_tiles);
  const int64_t kv_size = (int64_t)Fp * DVq, sums = kv_size + Fp + 1, lanes = sums * W;
  const auto make = [=] { return SoaScratch(d, Fp, DVq, TT, lanes); };
  at::Tensor partial = at::empty({P.BH * groups, sums}, k.options());
  float* partial_p = partial.data_ptr<float>();
  for_each_item(P.BH * groups, make, [&](int64_t item, int64_t following, SoaScratch& s) {
    const int64_t bh = item % P.BH, g = item / P.BH;
    float* acc = s.acc;
    std::fill(acc, acc + lanes, 0.0f);
    const int64_t last = (g + 1) * k_tiles / groups - 1;
    for (int64_t tile = g * k_tiles / groups; tile <= last; ++tile) {
      const int64_t t0 = tile * TT;
      const int n = (int)std::min<int64_t>(TT, P.Nk - t0);
      Ahead ahead[2];
      keys_ahead(P, kr, vr, TT, groups, k_tiles, bh, tile, last, following, ahead);
      K.soa_key_tile(P.spec, dv, Fp, DVq, TT, kr.at(bh, t0), kr.stride_n, vr.at(bh, t0), vr.stride_n, n,
                     P.rope ? cos_p + t0 : nullptr, P.rope ? sin_p + t0 : nullptr, tab, s.xT, s.phiT, s.rT, s.vT,
                     acc, acc + kv_size * W, acc + (kv_size + Fp) * W, ahead);
    }
    float* row = partial_p + (bh * groups + g) * sums;
    for (int64_t e = 0; e < sums - 1; ++e) {  // lanes summed in order: the bits depend on the shape alone
      float sum = 0.0f;
      for (int a = 0; a < W; ++a) sum += acc[e * W + a];
      row[e] = sum;
    }
    float top = 0.0f;
    for (int a = 0; a < W; ++a) top = std::max(top, acc[(sums - 1) * W + a]);
    row[sums - 1] = top;
  });
  // Groups summed in an order fixed by the shape (the bits do not depend on the thread count).
  const at::Tensor per_group = partial.view({P.BH, groups, sums});
  at::Tensor state = per_group.narrow(2, 0, sums - 1).sum(1);
  at::Tensor key_max = std::get<0>(per_group.select(2, sums - 1).max(1));
  return {state, key_max};
}

// The SoA path's query pass: all heads of a tile per item when there are tiles enough (as query_pass, for the same
// reasons).
static void soa_query_pass(const Kernels& K, const Problem& P, const at::Tensor& q, const at::Tensor& state,
                           const at::Tensor& cos_t, const at::Tensor& sin_t, const at::Tensor& out,
                           const at::Tensor& addend) {
  const bool add = addend.defined() && addend.numel() > 0;
  const int d = P.spec.d, dv = P.dv, TT = kSoaTile;
  const int Fp = round_up(2 * d, K.soa_fb), DVq = round_up(dv, K.soa_jb);
  const int64_t kv_size = (int64_t)Fp * DVq;
  const float* cos_p = P.rope ? cos_t.data_ptr<float>() : nullptr;
  const float* sin_p = P.rope ? sin_t.data_ptr<float>() : nullptr;
  const int64_t tab = P.rope ? cos_t.size(1) : 0;
  const auto make = [=] { return SoaScratch(d, Fp, DVq, TT); };
  const float* state_p = state.data_ptr<float>();
  const Rows qr(q), outr(out);
  const Rows addr(add ? addend : out);  // read only when add
  const int64_t q_tiles = (P.Nq + TT - 1) / TT;
  const int64_t per_item = (P.BH / P.heads) * q_tiles >= 16 ? P.heads : 1;
  const int64_t slots = P.BH / per_item;
  for_each_item(slots * q_tiles, make, [&](int64_t item, int64_t following, SoaScratch& s) {
    const int64_t slot = item % slots, t0 = (item / slots) * TT;
    const int n = (int)std::min<int64_t>(TT, P.Nq - t0);
    for (int64_t bh = slot * per_item; bh < (slot + 1) * per_item; ++bh) {
      const Ahead ahead[2] = {queries_ahead(P, qr, TT, slots, per_item, bh, t0, following), {}};
      const float* kv = state_p + bh * (kv_size + Fp);
      K.soa_query_tile(P.spec, dv, DVq, TT, P.gamma[bh % P.heads], qr.at(bh, t0), qr.stride_n, n,
                       P.rope ? cos_p + t0 : nullptr, P.rope ? sin_p + t0 : nullptr, tab, kv, kv + kv_size,
                       P.eps_total, outr.mut(bh, t0), outr.stride_n, add ? addr.at(bh, t0) : nullptr,
                       addr.stride_n, s.xT, s.phiT, s.rT, s.vT, ahead);
    }
  });
}

// The kernels forward_into, key_state and query_into run for heads of d floats and values of dv (the SoA layout's
// widest ones, or the tiles' for d and dv), and whether they are the SoA layout's.
static std::pair<const Kernels*, bool> inference_kernels(int d, int dv) {
  const Kernels& tiles = kernels(d, dv);
  const Kernels& wide = kernels();
  const bool soa = soa_pays(tiles, wide, d, dv);
  return {soa ? &wide : &tiles, soa};
}

static void check_written(const at::Tensor& t, const std::vector<int64_t>& shape) {
  TORCH_CHECK(t.dim() == 4 && t.sizes() == at::IntArrayRef(shape) && t.scalar_type() == at::kFloat &&
                  t.device().is_cpu() && t.stride(3) == 1,
              "out and addend must be float32 CPU tensors (B, heads, N_q, dv) with a contiguous last dimension");
}

// Inference: forward's output, plus `addend` when it is defined, written into `out` (B, heads, N_q, dv) of any
// strides with a contiguous last dimension (a head group's channels of a wider (B, N, C) map, say), without the
// intermediate output or the backward's saved state. `addend` (same shape, contiguous last dimension) must not
// overlap `out`. Returns key_max, as forward.
at::Tensor forward_into(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& cos,
                        const at::Tensor& sin, const at::Tensor& gamma, double lam, double tau, double angle_scale,
                        bool key_raw, double eps_total, at::Tensor out, const at::Tensor& addend) {
  const at::Tensor q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in), v = last_dim_contiguous(v_in);
  const auto [K, soa] = inference_kernels((int)q.size(3), (int)v.size(3));
  const Problem P = make_problem(K->width, q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total);
  const std::vector<int64_t> shape = {q.size(0), q.size(1), q.size(2), v.size(3)};
  check_written(out, shape);
  if (addend.defined() && addend.numel() > 0) check_written(addend, shape);
  if (soa) {
    const auto [cos_t, sin_t] = soa_tables(P, cos, sin, std::max(P.Nq, P.Nk));
    auto [state, key_max] = soa_key_pass(*K, P, k, v, cos_t, sin_t);
    soa_query_pass(*K, P, q, state, cos_t, sin_t, out, addend);
    return key_max;
  }
  auto [kv_state, key_max] = key_pass(*K, P, k, v);
  query_pass(*K, P, q, kv_state, out, addend, nullptr);
  return key_max;
}

// forward_into's key pass alone, over some of the keys: {state, key_max}. The states of disjoint runs of keys add
// up (float rounding aside) to the state of all of them, which query_into reads: attention over more tokens than
// are held at once. The RoPE tables are the keys' own rows; the state's layout is the kernels' (opaque).
std::vector<at::Tensor> key_state(const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& cos,
                                  const at::Tensor& sin, const at::Tensor& gamma, double lam, double tau,
                                  double angle_scale, bool key_raw) {
  const at::Tensor k = last_dim_contiguous(k_in), v = last_dim_contiguous(v_in);
  const auto [K, soa] = inference_kernels((int)k.size(3), (int)v.size(3));
  const Problem P = make_problem(K->width, k, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, 0.0);
  if (soa) {
    const auto [cos_t, sin_t] = soa_tables(P, cos, sin, P.Nk);
    auto [state, key_max] = soa_key_pass(*K, P, k, v, cos_t, sin_t);
    return {state, key_max};
  }
  auto [state, key_max] = key_pass(*K, P, k, v);
  return {state, key_max};
}

// forward_into's query pass alone, on a key_state (summed over every key): out (B, heads, N_q, dv) = the
// attention of each query, plus `addend` when it is not empty; eps_total is the denominator's offset for all the
// keys. The RoPE tables are the queries' own rows.
void query_into(const at::Tensor& q_in, const at::Tensor& state, const at::Tensor& cos, const at::Tensor& sin,
                const at::Tensor& gamma, double lam, double tau, double angle_scale, bool key_raw, double eps_total,
                at::Tensor out, const at::Tensor& addend) {
  const at::Tensor q = last_dim_contiguous(q_in);
  const std::vector<int64_t> shape = {q.size(0), q.size(1), q.size(2), out.size(3)};
  check_written(out, shape);
  if (addend.defined() && addend.numel() > 0) check_written(addend, shape);
  const auto [K, soa] = inference_kernels((int)q.size(3), (int)out.size(3));
  const Problem P = make_problem(K->width, q, q, out, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total);
  const int64_t size = soa ? (int64_t)round_up(2 * P.spec.d, K->soa_fb) * (round_up(P.dv, K->soa_jb) + 1)
                           : (int64_t)P.F * P.DVp + P.F;
  TORCH_CHECK(state.is_contiguous() && state.scalar_type() == at::kFloat && state.dim() == 2 &&
                  state.size(0) == P.BH && state.size(1) == size,
              "the state does not fit these queries: make it with key_state for the same heads and sizes");
  if (soa) {
    const auto [cos_t, sin_t] = soa_tables(P, cos, sin, P.Nq);
    soa_query_pass(*K, P, q, state, cos_t, sin_t, out, addend);
    return;
  }
  query_pass(*K, P, q, state, out, addend, nullptr);
}

// Gradients of forward's output. `state` is forward's KV/z; `den` its clamped denominators.
std::vector<at::Tensor> backward(const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, const at::Tensor& cos, const at::Tensor& sin,
                                 const at::Tensor& gamma, const at::Tensor& out_in, const at::Tensor& den,
                                 const at::Tensor& state_in, double lam, double tau, double angle_scale, bool key_raw,
                                 double eps_total) {
  at::Tensor q = q_in.stride(3) == 1 ? q_in : q_in.contiguous();
  at::Tensor k = k_in.stride(3) == 1 ? k_in : k_in.contiguous();
  at::Tensor v = v_in.stride(3) == 1 ? v_in : v_in.contiguous();
  at::Tensor grad = grad_in.stride(3) == 1 ? grad_in : grad_in.contiguous();
  at::Tensor out = out_in.stride(3) == 1 ? out_in : out_in.contiguous();
  at::Tensor state = state_in.contiguous();
  const Kernels& K = kernels((int)q.size(3), (int)v.size(3));
  const Problem P = make_problem(K.width, q, k, v, cos, sin, gamma, lam, tau, angle_scale, key_raw, eps_total);
  const int F = P.F, DVp = P.DVp, Dp = P.spec.Dp, d = P.spec.d;
  const Rows qr(q), kr(k), vr(v), gr(grad), outr(out);
  const int64_t state_size = (int64_t)F * DVp + F;
  const float* state_p = state.data_ptr<float>();
  const float* den_p = den.data_ptr<float>();

  // KV^T per (batch, head), for d(phi_q) = KV g / den.
  at::Tensor kv_t = state.narrow(1, 0, (int64_t)F * DVp).view({P.BH, F, DVp}).transpose(1, 2).contiguous();
  const float* kv_t_p = kv_t.data_ptr<float>();

  // Each is written whole below.
  const auto float_cpu = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  at::Tensor gq = at::empty(q.sizes(), float_cpu), gk = at::empty(k.sizes(), float_cpu);
  at::Tensor gv = at::empty(v.sizes(), float_cpu);
  const Rows gqr(gq), gkr(gk), gvr(gv);

  // Query pass: dq, and dKV (F x DVp), dz (F), d(gamma) per (batch, head) from partial sums per group of tiles.
  const int64_t q_tiles = (P.Nq + kTile - 1) / kTile;
  const int64_t groups = group_count(P.BH, q_tiles);
  const int64_t partial_size = state_size + 1;
  at::Tensor partial = at::zeros({P.BH * groups, partial_size}, q.options());
  float* partial_p = partial.data_ptr<float>();
  for_each_item(P.BH * groups, Dp, DVp, [&](int64_t item, Scratch& s) {  // head-fastest, as in forward
    const int64_t bh = item % P.BH, g = item / P.BH;
    const float* kv = state_p + bh * state_size;
    const float* z = kv + (int64_t)F * DVp;
    float* gkv = partial_p + (bh * groups + g) * partial_size;
    float* gz = gkv + (int64_t)F * DVp;
    float* ggamma = gz + F;
    const float gamma_h = P.gamma[bh % P.heads];
    for (int64_t tile = g * q_tiles / groups; tile < (g + 1) * q_tiles / groups; ++tile) {
      const int64_t t0 = tile * kTile;
      const int n = (int)std::min<int64_t>(kTile, P.Nq - t0), rows = round4(n);
      const float* rot = map_and_rotate(K, P, true, gamma_h, qr.at(bh, t0), qr.stride_n, t0, n, rows, s, true);
      load_rows(gr.at(bh, t0), gr.stride_n, n, P.dv, DVp, rows, s.grads);
      load_rows(outr.at(bh, t0), outr.stride_n, n, P.dv, DVp, rows, s.outs);
      for (int t = 0; t < n; ++t) {
        const float denominator = den_p[bh * P.Nq + t0 + t];
        float* gt = s.grads + t * DVp;
        const float* ot = s.outs + t * DVp;
        const float go = K.dot(gt, ot, DVp);
        const float inv = 1.0f / denominator;
        // A clamped denominator (a query that matches no key) passes no gradient to it.
        s.den[t] = denominator > kTiny ? -go * inv : 0.0f;
        for (int j = 0; j < DVp; ++j) gt[j] *= inv;  // d numerator
      }
      K.gemm_tn_acc(rot, rows, F, s.grads, DVp, DVp, gkv);
      for (int t = 0; t < n; ++t) K.axpy(s.den[t], s.tile.phi + t * F, gz, F);
      K.gemm_nn(s.grads, rows, DVp, kv_t_p + bh * (int64_t)DVp * F, F, s.grad_rot);
      if (P.rope) {
        K.unrotate_tile(d, Dp, s.grad_rot, P.cos + t0 * d, P.sin + t0 * d, n, s.grad_phi);
      } else {
        std::memcpy(s.grad_phi, s.grad_rot, sizeof(float) * n * F);
      }
      for (int t = 0; t < n; ++t) K.axpy(s.den[t], z, s.grad_phi + t * F, F);
      *ggamma += K.map_tile_backward(P.spec, true, gamma_h, s.tile, s.grad_phi, n, gqr.mut(bh, t0), gqr.stride_n,
                                     s.gu);
    }
  });
  at::Tensor reduced = partial.view({P.BH, groups, partial_size}).sum(1);
  const float* reduced_p = reduced.data_ptr<float>();
  at::Tensor gkv_t = reduced.narrow(1, 0, (int64_t)F * DVp).view({P.BH, F, DVp}).transpose(1, 2).contiguous();
  const float* gkv_t_p = gkv_t.data_ptr<float>();

  // Key pass: dk and dv, tile by tile.
  const int64_t k_tiles = (P.Nk + kTile - 1) / kTile;
  for_each_item(P.BH * k_tiles, Dp, DVp, [&](int64_t item, Scratch& s) {
    const int64_t bh = item % P.BH, t0 = (item / P.BH) * kTile;
    const int n = (int)std::min<int64_t>(kTile, P.Nk - t0), rows = round4(n);
    const float* gkv = reduced_p + bh * (state_size + 1);
    const float* gz = gkv + (int64_t)F * DVp;
    const float* rot = map_and_rotate(K, P, false, 1.0f, kr.at(bh, t0), kr.stride_n, t0, n, rows, s, true);
    load_rows(vr.at(bh, t0), vr.stride_n, n, P.dv, DVp, rows, s.values);
    K.gemm_nn(s.values, rows, DVp, gkv_t_p + bh * (int64_t)DVp * F, F, s.grad_rot);
    if (P.rope) {
      K.unrotate_tile(d, Dp, s.grad_rot, P.cos + t0 * d, P.sin + t0 * d, n, s.grad_phi);
    } else {
      std::memcpy(s.grad_phi, s.grad_rot, sizeof(float) * n * F);
    }
    for (int t = 0; t < n; ++t) K.axpy(1.0f, gz, s.grad_phi + t * F, F);
    K.map_tile_backward(P.spec, false, 1.0f, s.tile, s.grad_phi, n, gkr.mut(bh, t0), gkr.stride_n, s.gu);
    K.gemm_nn(rot, rows, F, gkv, DVp, s.outs);
    for (int t = 0; t < n; ++t) std::memcpy(gvr.mut(bh, t0 + t), s.outs + t * DVp, sizeof(float) * P.dv);
  });
  at::Tensor ggamma = reduced.select(1, state_size).contiguous();
  return {gq, gk, gv, ggamma};
}

// The widest instruction set the kernels use on this CPU (for heads whose size it suits; see kernels()).
std::string isa() { return kernels().name; }

// Which kernels forward_into runs for heads of d floats and values of dv: "soa" or "tiles".
std::string inference_layout(int64_t d, int64_t dv) {
  return inference_kernels((int)d, (int)dv).second ? "soa" : "tiles";
}

// Caps the instruction set of the calls that follow: "avx2", "baseline", or "" (none).
void set_isa_cap(const std::string& cap) {
  TORCH_CHECK(cap.empty() || cap == "avx512" || cap == "avx2" || cap == "baseline", "unknown instruction set ", cap);
  isa_cap.store(cap == "baseline" ? 2 : cap == "avx2" ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace nala_fused

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Fused NaLa linear attention (CPU): forward and backward in cache-sized tiles";
  m.def("forward", &nala_fused::forward, "out, den, state, key_max = forward(q, k, v, cos, sin, gamma, lam, tau, "
                                         "angle_scale, key_raw, eps_total)");
  m.def("forward_into", &nala_fused::forward_into, "key_max = forward_into(q, k, v, cos, sin, gamma, lam, tau, "
                                                   "angle_scale, key_raw, eps_total, out, addend): inference, "
                                                   "out = attention + addend (addend may be empty)");
  m.def("key_state", &nala_fused::key_state, "state, key_max = key_state(k, v, cos, sin, gamma, lam, tau, "
                                             "angle_scale, key_raw): forward_into's key pass alone");
  m.def("query_into", &nala_fused::query_into, "query_into(q, state, cos, sin, gamma, lam, tau, angle_scale, "
                                               "key_raw, eps_total, out, addend): its query pass on a summed state");
  m.def("backward", &nala_fused::backward, "gq, gk, gv, ggamma = backward(grad, q, k, v, cos, sin, gamma, out, den, "
                                           "state, lam, tau, angle_scale, key_raw, eps_total)");
  m.def("isa", &nala_fused::isa, "the instruction set the kernels were dispatched to");
  m.def("inference_layout", &nala_fused::inference_layout, "forward_into's kernels for (d, dv): soa or tiles");
  m.def("set_isa_cap", &nala_fused::set_isa_cap, "caps the instruction set of the calls that follow: avx2, "
                                                 "baseline, or an empty string for none");
  m.def("streams_output", &nala_fused::streams_output, "whether the query pass writes this output by "
        "non-temporal stores (larger than the last-level cache, rows whole cache lines)");
  m.def("stream_threshold_bytes", &nala_fused::stream_threshold_bytes, "output bytes above which it streams");
}
