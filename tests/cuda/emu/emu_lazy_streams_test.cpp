// EMU_STREAMS=lazy (tests/cuda/emu/emu_streams.cpp): work on a created stream runs only when something
// waits for it, so a missing dependency shows in the bytes. Each case checks the lazy answer of a
// missing wait (what a GPU may give) and that the right wait gives the right bytes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

struct Lazy {
  bool was = emu::set_lazy_streams(true);
  ~Lazy() { emu::set_lazy_streams(was); }
};

struct Streams {
  cudaStream_t a = nullptr, b = nullptr;
  explicit Streams(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, flags), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, flags), cudaSuccess);
  }
  ~Streams() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
};

// Stream a fills src with 1s; stream b copies src to dst, waiting for a's event or not.
uint8_t copied_byte(bool wait) {
  Lazy lazy;
  Streams s;
  uint8_t *src = nullptr, *dst = nullptr;
  EXPECT_EQ(cudaMalloc(&src, 64), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dst, 64), cudaSuccess);
  cudaEvent_t filled = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(src, 1, 64, s.a), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(filled, s.a), cudaSuccess);
  if (wait) {
    EXPECT_EQ(cudaStreamWaitEvent(s.b, filled, 0), cudaSuccess);
  }
  EXPECT_EQ(cudaMemcpyAsync(dst, src, 64, cudaMemcpyDeviceToDevice, s.b), cudaSuccess);
  uint8_t out = 0;
  EXPECT_EQ(cudaMemcpyAsync(&out, dst + 63, 1, cudaMemcpyDeviceToHost, s.b), cudaSuccess);  // pageable: done here
  cudaEventDestroy(filled);
  cudaFree(src);
  cudaFree(dst);
  return out;
}

TEST(EmulatedLazyStreams, AReadWithoutTheWaitSeesTheOldBytes) {
  EXPECT_EQ(copied_byte(false), 0xff);  // cudaMalloc's bytes: stream a had not run
  EXPECT_EQ(copied_byte(true), 1);
}

// A pinned buffer refilled by the host before the copy reading it has run: the device gets the
// new bytes (as a GPU may), on a created stream and on the legacy one; synchronized first, the old
// ones. Pageable memory is staged at the call.
TEST(EmulatedLazyStreams, AHostBufferRefilledBeforeItsCopyRanSendsTheNewBytes) {
  Lazy lazy;
  Streams s;
  int32_t *pinned = nullptr, *dev = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void **>(&pinned), sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev, 2 * sizeof(int32_t)), cudaSuccess);
  for (cudaStream_t stream : {s.a, static_cast<cudaStream_t>(nullptr)})
    for (const bool sync : {false, true}) {
      *pinned = 7;
      ASSERT_EQ(cudaMemcpyAsync(dev, pinned, sizeof(int32_t), cudaMemcpyHostToDevice, stream), cudaSuccess);
      if (sync) {
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
      *pinned = 8;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      int32_t got = 0;
      ASSERT_EQ(cudaMemcpy(&got, dev, sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, sync ? 7 : 8) << (stream ? "created stream" : "legacy stream");
    }
  std::vector<int32_t> pageable{5};
  ASSERT_EQ(cudaMemcpyAsync(dev + 1, pageable.data(), sizeof(int32_t), cudaMemcpyHostToDevice, s.a), cudaSuccess);
  pageable[0] = 6;
  ASSERT_EQ(cudaStreamSynchronize(s.a), cudaSuccess);
  int32_t got = 0;
  ASSERT_EQ(cudaMemcpy(&got, dev + 1, sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, 5);
  cudaFree(dev);
  cudaFreeHost(pinned);
}

// The legacy stream's implicit barrier: a synchronous copy waits for the blocking streams' work and
// not for a non-blocking stream's; a blocking stream's work waits for the legacy stream's before it.
TEST(EmulatedLazyStreams, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  Lazy lazy;
  Streams blocking(0), nonblocking;
  int32_t *dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 2 * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev, 0, sizeof(int32_t), blocking.b), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(dev + 1, 0, sizeof(int32_t), nonblocking.b), cudaSuccess);
  int32_t got[2] = {1, 1};
  ASSERT_EQ(cudaMemcpy(got, dev, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], -1);  // cudaMalloc's bytes: the non-blocking stream's memset had not run
  ASSERT_EQ(cudaMemsetAsync(dev, 2, sizeof(int32_t), nullptr), cudaSuccess);  // legacy
  ASSERT_EQ(cudaMemcpyAsync(got, dev, sizeof(int32_t), cudaMemcpyDeviceToHost, blocking.a), cudaSuccess);
  EXPECT_EQ(got[0], 0x02020202);  // into pageable memory: done at return, after the legacy memset
  cudaFree(dev);
}

}  // namespace
