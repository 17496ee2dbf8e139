// A CUDA runtime emulated in host memory, for running the device tier's
// logic (slots, routes, copy workers, pinned-buffer detection, error paths)
// on machines without a GPU, under the sanitizers too. "Device" memory is
// host memory and copies are synchronous memcpy, so it checks correctness,
// never speed. Counts live objects so tests can check nothing leaks, and
// can fail the Nth host-to-device copy.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "store/cuda_runtime.h"

namespace k3pack::store::testing {

struct EmulatedCuda {
  static inline std::atomic<int> live_device{0}, live_pinned{0}, live_streams{0}, live_events{0};
  static inline std::atomic<int64_t> h2d_copies{0};
  static inline std::atomic<int64_t> fail_h2d_copy{-1};  // index of the copy that fails (-1: none)
  static constexpr int kIllegalAddress = 700;

  static const cuda::Runtime& Get() {
    static const cuda::Runtime rt = [] {
      cuda::Runtime r{};
      r.GetDeviceCount = [](int* n) { return *n = 1, 0; };
      r.SetDevice = [](int d) { return d == 0 ? 0 : 101; };  // cudaErrorInvalidDevice
      r.RuntimeGetVersion = [](int* v) { return *v = 0, 0; };
      r.DriverGetVersion = [](int* v) { return *v = 0, 0; };
      r.Malloc = [](void** p, size_t n) { return (*p = std::aligned_alloc(256, (n + 255) / 256 * 256)) ? ++live_device, 0 : 2; };
      r.Free = [](void* p) { return std::free(p), --live_device, 0; };
      r.HostAlloc = [](void** p, size_t n, unsigned) {
        return (*p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)) ? ++live_pinned, 0 : 2;
      };
      r.FreeHost = [](void* p) { return std::free(p), --live_pinned, 0; };
      r.Memcpy = [](void* d, const void* s, size_t n, int) { return std::memcpy(d, s, n), 0; };
      r.MemcpyAsync = [](void* d, const void* s, size_t n, int kind, cuda::Stream) {
        if (kind == cuda::kHostToDevice && h2d_copies++ == fail_h2d_copy.load()) return kIllegalAddress;
        return std::memcpy(d, s, n), 0;
      };
      r.StreamCreate = [](cuda::Stream* s) { return *s = new int(0), ++live_streams, 0; };
      r.StreamDestroy = [](cuda::Stream s) { return delete static_cast<int*>(s), --live_streams, 0; };
      r.StreamSynchronize = [](cuda::Stream) { return 0; };
      r.EventCreate = [](cuda::Event* e) { return *e = new int(0), ++live_events, 0; };
      r.EventDestroy = [](cuda::Event e) { return delete static_cast<int*>(e), --live_events, 0; };
      r.EventRecord = [](cuda::Event, cuda::Stream) { return 0; };
      r.EventSynchronize = [](cuda::Event) { return 0; };
      r.EventElapsedTime = [](float* ms, cuda::Event, cuda::Event) { return *ms = 0, 0; };
      r.StreamWaitEvent = [](cuda::Stream, cuda::Event, unsigned) { return 0; };
      r.GetErrorString = [](int code) { return code == kIllegalAddress ? "an illegal memory access was encountered" : "emulated error"; };
      r.library = "emulated";
      return r;
    }();
    return rt;
  }
};

// Installs the emulation for one scope.
struct ScopedEmulatedCuda {
  ScopedEmulatedCuda() { cuda::SetRuntimeForTesting(&EmulatedCuda::Get()); }
  ~ScopedEmulatedCuda() {
    cuda::SetRuntimeForTesting(nullptr);
    EmulatedCuda::fail_h2d_copy = -1;
  }
};

}  // namespace k3pack::store::testing
