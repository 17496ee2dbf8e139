#include "store/cuda_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <vector>

namespace k3pack::store::cuda {
namespace {

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (!*fn) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

Result<Runtime> Load() {
  std::vector<std::string> names;
  if (const char* p = std::getenv("K3PACK_CUDART"); p && *p) names.emplace_back(p);
  for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) names.emplace_back(n);
  std::string tried;
  for (const auto& name : names) {
    void* lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = ::dlerror();
      tried += "\n  " + name + ": " + (why ? why : "not found");
      continue;
    }
    Runtime rt{};
    std::string missing;
    Bind(lib, "cudaGetDeviceCount", &rt.GetDeviceCount, &missing);
    Bind(lib, "cudaSetDevice", &rt.SetDevice, &missing);
    Bind(lib, "cudaRuntimeGetVersion", &rt.RuntimeGetVersion, &missing);
    Bind(lib, "cudaDriverGetVersion", &rt.DriverGetVersion, &missing);
    Bind(lib, "cudaMalloc", &rt.Malloc, &missing);
    Bind(lib, "cudaFree", &rt.Free, &missing);
    Bind(lib, "cudaHostAlloc", &rt.HostAlloc, &missing);
    Bind(lib, "cudaFreeHost", &rt.FreeHost, &missing);
    Bind(lib, "cudaMemcpy", &rt.Memcpy, &missing);
    Bind(lib, "cudaMemcpyAsync", &rt.MemcpyAsync, &missing);
    Bind(lib, "cudaStreamCreate", &rt.StreamCreate, &missing);
    Bind(lib, "cudaStreamDestroy", &rt.StreamDestroy, &missing);
    Bind(lib, "cudaStreamSynchronize", &rt.StreamSynchronize, &missing);
    Bind(lib, "cudaEventCreate", &rt.EventCreate, &missing);
    Bind(lib, "cudaEventDestroy", &rt.EventDestroy, &missing);
    Bind(lib, "cudaEventRecord", &rt.EventRecord, &missing);
    Bind(lib, "cudaEventSynchronize", &rt.EventSynchronize, &missing);
    Bind(lib, "cudaEventElapsedTime", &rt.EventElapsedTime, &missing);
    Bind(lib, "cudaStreamWaitEvent", &rt.StreamWaitEvent, &missing);
    Bind(lib, "cudaGetErrorString", &rt.GetErrorString, &missing);
    if (!missing.empty()) {
      tried += "\n  " + name + ": loaded, but lacks " + missing;
      ::dlclose(lib);
      continue;
    }
    rt.library = name;
    return rt;  // the library stays loaded for the life of the process
  }
  return Error("no CUDA runtime could be loaded; tried:" + tried, ErrorKind::kRuntime)
      .WithHint("install the CUDA runtime (libcudart) or point K3PACK_CUDART at it; the device tier is optional");
}

std::atomic<const Runtime*> g_testing_runtime{nullptr};

}  // namespace

void SetRuntimeForTesting(const Runtime* rt) { g_testing_runtime = rt; }

Result<const Runtime*> LoadRuntime() {
  if (const Runtime* rt = g_testing_runtime.load()) return rt;
  static const Result<Runtime> loaded = Load();
  if (!loaded.ok()) return loaded.error();
  return &loaded.value();
}

Status Check(const Runtime& rt, int code, std::string_view what) {
  if (code == 0) return Status::OK();
  const char* text = rt.GetErrorString ? rt.GetErrorString(code) : nullptr;
  return Error("CUDA error in " + std::string(what) + ": " + (text ? text : "unknown error") + " (code " +
                   std::to_string(code) + ")",
               ErrorKind::kRuntime);
}

}  // namespace k3pack::store::cuda
