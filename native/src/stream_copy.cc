// stream_copy.cc — the definitions of stream_copy.h.
#include "fastckpt/stream_copy.h"

#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastckpt {

namespace detail {

#if defined(__x86_64__)
void stream_blocks(uint8_t* dst, const uint8_t* src, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}
static void fence_streamed() { _mm_sfence(); }
#else
void stream_blocks(uint8_t* dst, const uint8_t* src, uint64_t n) { std::memcpy(dst, src, n); }
static void fence_streamed() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

}  // namespace detail

void copy_streaming(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  const uint64_t body = n & ~uint64_t(63);
  detail::stream_blocks(dst, src, body);
  std::memcpy(dst + body, src + body, n - body);
  detail::fence_streamed();
}

void copy_past_cache(uint8_t* dst, const uint8_t* src, uint64_t n) {
  if (n >= kStreamFrom)
    copy_streaming(dst, src, n);
  else
    std::memcpy(dst, src, n);
}

}  // namespace fastckpt
