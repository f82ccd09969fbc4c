// The emulator's capture of copies (tests/cuda/emu/emu_memory.cpp, emu_streams.cpp): a copy from
// pinned host memory is a graph node that reads the pinned bytes at each launch (the decoder's
// replays upload their step that way); a copy from pageable memory is refused and invalidates the
// capture, as on the GPU, so code that would fail there fails here.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// The device int after one launch of the graph, with *pinned set to `value` just before it.
int32_t replayed(cudaGraphExec_t exec, cudaStream_t s, int32_t* pinned, int32_t* dev, int32_t value) {
  *pinned = value;
  EXPECT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  int32_t got = 0;
  EXPECT_EQ(cudaMemcpy(&got, dev, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  return got;
}

TEST(EmulatedCapture, CopyFromPinnedMemoryReadsItAtEachLaunch) {
  Stream st;
  int32_t *pinned = nullptr, *dev = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dev, sizeof(int32_t)), cudaSuccess);
  *pinned = 1;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, pinned, sizeof(int32_t), cudaMemcpyHostToDevice, st.s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st.s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  EXPECT_EQ(replayed(exec, st.s, pinned, dev, 2), 2);
  EXPECT_EQ(replayed(exec, st.s, pinned, dev, 3), 3);
  cudaGraphExecDestroy(exec);
  cudaFree(dev);
  cudaFreeHost(pinned);
}

TEST(EmulatedCapture, CopyWithPageableMemoryInvalidatesTheCapture) {
  Stream st;
  int32_t* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, sizeof(int32_t)), cudaSuccess);
  std::vector<int32_t> pageable{4};
  for (const bool up : {true, false}) {
    ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const cudaError_t copied =
        up ? cudaMemcpyAsync(dev, pageable.data(), sizeof(int32_t), cudaMemcpyHostToDevice, st.s)
           : cudaMemcpyAsync(pageable.data(), dev, sizeof(int32_t), cudaMemcpyDeviceToHost, st.s);
    EXPECT_EQ(copied, cudaErrorStreamCaptureUnsupported) << (up ? "to the device" : "to the host");
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(st.s, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
  }
  EXPECT_EQ(pageable[0], 4);  // nothing copied
  cudaFree(dev);
}

}  // namespace
