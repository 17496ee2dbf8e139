// The handful of CUDA runtime entry points the device tier needs, resolved
// with dlopen at run time. The tier only allocates and copies (no kernels),
// so nothing needs nvcc: one k3pack binary built on a machine without the
// CUDA toolkit uses a GPU wherever libcudart and a driver are installed, and
// its CPU-side logic is built and tested everywhere. The C signatures and
// enum values used here are CUDA's stable public runtime ABI.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "k3pack/error.h"

namespace k3pack::store::cuda {

using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t
enum MemcpyKind : int { kHostToDevice = 1, kDeviceToHost = 2 };

struct Runtime {
  int (*GetDeviceCount)(int*);
  int (*SetDevice)(int);
  int (*RuntimeGetVersion)(int*);
  int (*DriverGetVersion)(int*);
  int (*Malloc)(void**, size_t);
  int (*Free)(void*);
  int (*HostAlloc)(void**, size_t, unsigned);
  int (*FreeHost)(void*);
  int (*Memcpy)(void*, const void*, size_t, int);
  int (*MemcpyAsync)(void*, const void*, size_t, int, Stream);
  int (*StreamCreate)(Stream*);
  int (*StreamDestroy)(Stream);
  int (*StreamSynchronize)(Stream);
  int (*EventCreate)(Event*);
  int (*EventDestroy)(Event);
  int (*EventRecord)(Event, Stream);
  int (*EventSynchronize)(Event);
  int (*EventElapsedTime)(float*, Event, Event);
  int (*StreamWaitEvent)(Stream, Event, unsigned);  // queue a wait, no host sync
  const char* (*GetErrorString)(int);
  std::string library;  // the file that was loaded
};

// Loads the runtime once per process: $K3PACK_CUDART if set, else
// libcudart.so and its versioned names. The error lists what was tried.
Result<const Runtime*> LoadRuntime();

// Test seam: LoadRuntime() returns `rt` until called again with nullptr.
// Tests use a host-memory emulation to run the tier's logic where no GPU is.
void SetRuntimeForTesting(const Runtime* rt);

// OK for cudaSuccess; otherwise "CUDA error in <what>: <runtime's text> (code N)".
Status Check(const Runtime& rt, int code, std::string_view what);

}  // namespace k3pack::store::cuda
