// Helpers shared by the manifest tests: temp dirs, running commands (the
// k3pack CLI, the python3 oracle) and reading their output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace k3test {

inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

// The built CLI, quoted for a shell command line.
inline std::string Bin() { return ShellQuote(K3PACK_BIN); }

struct CmdResult {
  int rc = -1;
  std::string out;  // stdout + stderr (2>&1) unless separated
};

// Runs `cmd` through /bin/sh; captures stdout (and stderr when merge).
inline CmdResult RunCmd(const std::string& cmd, bool merge_stderr = true) {
  CmdResult r;
  std::string full = cmd + (merge_stderr ? " 2>&1" : "");
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

// A fresh directory under $TMPDIR removed at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "k3manifest") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string Python() { return "/usr/bin/python3"; }
inline std::string SourceFile(const std::string& rel) { return std::string(K3PACK_SOURCE_DIR) + "/" + rel; }

}  // namespace k3test
