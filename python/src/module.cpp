// The _k3pack extension module: Python bindings of k3pack's C++ API.
// The pure-Python package k3pack (python/k3pack/) wraps it; import that.
#include "common.h"
#include "k3pack_version.h"

PYBIND11_MODULE(_k3pack, m) {
  m.doc() = "k3pack C++ core (GGUF reader, non-expert loader, quant, pack, expert store)";
  m.attr("__version__") = K3PACK_VERSION;
  k3py::RegisterExitGuard(m);
  k3py::RegisterErrors(m);
  k3py::RegisterGguf(m);
  k3py::RegisterLoader(m);
  k3py::RegisterQuant(m);
  k3py::RegisterPack(m);
  k3py::RegisterStore(m);
  k3py::RegisterSlotCache(m);
  k3py::RegisterSynth(m);
}
