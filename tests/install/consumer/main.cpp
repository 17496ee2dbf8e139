#include <cstdio>
#include <k3pack/doctor.h>
int main(int argc, char** argv) {
  const auto report = k3pack::doctor::Diagnose({argc > 1 ? argv[1] : "/nonexistent.gguf"});
  std::printf("Q2_K %u bytes/block, doctor exit %d\n", k3pack::GgmlTypeInfoFor(k3pack::GgmlType::Q2_K)->type_size, report.ExitCode());
}
