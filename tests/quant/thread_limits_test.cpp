// The threaded quant entry points when the process cannot start the threads
// they ask for (a container's pids limit, an address-space limit): the work
// is still done, on the threads there are. std::thread's exception used to
// leave DequantizeParallel and MatVec (which return a Status): as a
// std::system_error when no thread started, and as std::terminate when some
// had (joinable threads destroyed).
#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <vector>

#include "../forked_child.h"
#include "k3pack/quant.h"
#include "quant/fp.h"

namespace k3pack::quant {
namespace {

TEST(QuantThreadLimits, DequantizeParallelDecodesOnTheThreadsItGets) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  // 64 pieces of 1 MiB of output (Q1_0: 18 bytes -> 128 floats), so the call
  // asks for 64 threads: more than glibc's cache of old stacks could serve.
  constexpr size_t kBlocks = size_t{64} * 2048;
  std::vector<uint8_t> src(kBlocks * 18);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t b = 0; b < kBlocks; ++b) src[b * 18 + 1] &= 0x3B;  // finite fp16 scales
  std::vector<float> want(kBlocks * 128), got(kBlocks * 128, -1.0f);
  ASSERT_TRUE(DequantizeParallel(GgmlType::Q1_0, src, want, 1).ok());
  int rc = k3test::InForkedChild([&] {
    // Room for a few 8 MiB thread stacks, not for 64.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{64} << 20)) ::_exit(4);
    try {
      if (!DequantizeParallel(GgmlType::Q1_0, src, got, 64).ok()) ::_exit(2);
    } catch (const std::exception&) {
      ::_exit(5);
    }
    ::_exit(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0 ? 0 : 3);
  });
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 5: std::system_error escaped; 2: an error; 3: wrong values)";
}

TEST(QuantThreadLimits, MatVecComputesEveryRowOnTheThreadsItGets) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  constexpr uint64_t kRows = 64;
  constexpr size_t kN = 64;
  std::vector<float> w(kRows * kN), x(kN);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 17) - 8.0f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i % 5);
  auto act = PrepareActivation(GgmlType::F32, x);
  ASSERT_TRUE(act.ok());
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(w.data()), w.size() * sizeof(float));
  std::vector<float> want(kRows), got(kRows, -1.0f);
  ASSERT_TRUE(MatVec(bytes, kRows, *act, want, 1).ok());
  int rc = k3test::InForkedChild([&] {
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{64} << 20)) ::_exit(4);
    try {
      if (!MatVec(bytes, kRows, *act, got, 64).ok()) ::_exit(2);
    } catch (const std::exception&) {
      ::_exit(5);
    }
    ::_exit(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0 ? 0 : 3);
  });
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 5: std::system_error escaped; 2: an error; 3: wrong values)";
}

}  // namespace
}  // namespace k3pack::quant
