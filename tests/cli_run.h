// Runs the built `k3pack` CLI (K3PACK_BIN) with a shell-quoted argument
// string and collects stdout + stderr: for tests that drive the CLI end to end.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace k3pack::testing_cli {

struct CliRun {
  int code;  // exit status; -1 when the process did not exit normally
  std::string out;
};

// `prefix` is put before the binary: "timeout 60" makes a hang a failure
// (exit 124) instead of a stalled ctest, "cd DIR &&" runs it elsewhere.
inline CliRun CliVia(const std::string& prefix, const std::string& args) {
  const std::string cmd = prefix + (prefix.empty() ? "" : " ") + std::string(K3PACK_BIN) + " " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return {-1, "popen failed: " + cmd};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline CliRun Cli(const std::string& args) { return CliVia("", args); }

// A file's bytes ("" when it cannot be read): what a CLI run left behind.
inline std::string FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace k3pack::testing_cli
