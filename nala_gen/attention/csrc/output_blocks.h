// Blocks for the op's new outputs (the inference output, the backward's gradients): freed blocks are kept for the
// next outputs that fit them.
//
// Why: PyTorch's CPU allocator takes large blocks from malloc, and glibc serves blocks above its mmap threshold
// (32 MiB at most) by mmap and gives them back to the system when they are freed, so each new output of that size
// is page-faulted in afresh: the kernel clears every page before the op may write it. At 71,680 tokens (4 heads of
// 32 floats: 37 MB) that clearing was about a third of the op's inference time on the 2-vCPU EPYC
// (scripts/op_time_split.py), and the backward makes three such tensors. A caller that keeps no output across
// calls (a transformer's attention layers one after another, a training step's gradients once applied, a
// benchmark's repeats) gets its next outputs from the blocks the last ones freed, with their pages in place.
//
// The trade: up to kKeptBlocks freed blocks (the backward's three gradients) stay resident until outputs reuse
// them, later ones replace them, release() frees them, or the process ends. Layers that call the op one after
// another free each output before the next call, so inference holds one block in its steady state. Only blocks of
// at least kMinBytes go through here (smaller ones glibc recycles itself), and a block is reused only for an output
// of at least half its size. Thread-safe; tensors keep their block alive through their deleter, so a block is never
// handed out while a tensor still views it. NALA_GEN_OUTPUT_BLOCKS=0 (read on every call) takes PyTorch's
// allocator instead.
#pragma once

#include <torch/extension.h>

#include <cctype>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <utility>

namespace nala_fused {
namespace output_blocks {

constexpr size_t kMinBytes = size_t(1) << 20;
constexpr size_t kKeptBlocks = 3;
constexpr size_t kAlign = 64;  // a cache line, as PyTorch's CPU allocator aligns

struct Pool {
  std::mutex lock;
  std::deque<std::pair<void*, size_t>> kept;  // (block, bytes), oldest first
};

// Never destroyed: a tensor freed during interpreter shutdown may still hand its block back.
inline Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

inline void give_back(void* block, size_t bytes) {
  void* dropped = nullptr;
  {
    std::lock_guard<std::mutex> guard(pool().lock);
    auto& kept = pool().kept;
    if (kept.size() == kKeptBlocks) {
      dropped = kept.front().first;
      kept.pop_front();
    }
    kept.emplace_back(block, bytes);
  }
  std::free(dropped);
}

// The smallest kept block of `bytes` up to twice that, taken out of the pool; {nullptr, 0} when none fits (the
// pool then keeps what it has: the caller's new block replaces the oldest when freed).
inline std::pair<void*, size_t> take(size_t bytes) {
  std::lock_guard<std::mutex> guard(pool().lock);
  auto& kept = pool().kept;
  auto best = kept.end();
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if (it->second >= bytes && it->second <= 2 * bytes && (best == kept.end() || it->second < best->second)) best = it;
  }
  if (best == kept.end()) return {nullptr, 0};
  const auto found = *best;
  kept.erase(best);
  return found;
}

// Unless NALA_GEN_OUTPUT_BLOCKS is 0, false or no.
inline bool enabled() {
  const char* value = std::getenv("NALA_GEN_OUTPUT_BLOCKS");
  if (!value) return true;
  std::string v(value);
  for (char& c : v) c = (char)std::tolower((unsigned char)c);
  return v != "0" && v != "false" && v != "no";
}

// A new float32 CPU tensor of `sizes` (contiguous, uninitialised), from a kept block when one fits.
inline at::Tensor empty(at::IntArrayRef sizes) {
  int64_t count = 1;
  for (const int64_t s : sizes) count *= s;
  const size_t wanted = size_t(count) * sizeof(float);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCPU);
  if (wanted < kMinBytes || !enabled()) return at::empty(sizes, options);
  auto [block, bytes] = take(wanted);
  if (!block) {
    bytes = (wanted + kAlign - 1) / kAlign * kAlign;
    block = std::aligned_alloc(kAlign, bytes);
    if (!block) throw std::bad_alloc();
  }
  return at::from_blob(block, sizes, [bytes = bytes](void* p) { give_back(p, bytes); }, options);
}

// Frees the kept blocks; returns how many bytes they held.
inline int64_t release() {
  std::deque<std::pair<void*, size_t>> kept;
  {
    std::lock_guard<std::mutex> guard(pool().lock);
    kept.swap(pool().kept);
  }
  int64_t bytes = 0;
  for (const auto& [block, size] : kept) {
    std::free(block);
    bytes += (int64_t)size;
  }
  return bytes;
}

// Bytes held by kept blocks now.
inline int64_t kept_bytes() {
  std::lock_guard<std::mutex> guard(pool().lock);
  int64_t bytes = 0;
  for (const auto& entry : pool().kept) bytes += (int64_t)entry.second;
  return bytes;
}

}  // namespace output_blocks
}  // namespace nala_fused
