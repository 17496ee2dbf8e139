// Runs the built k3pack (K3PACK_BIN) as a child process for the pack CLI
// tests: stderr through a pipe (read while it runs), stdout discarded.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace k3pack::pack {

struct Proc {
  pid_t pid = -1;
  int err_fd = -1;  // read end of the child's stderr
};

// Starts K3PACK_BIN with `args`, extra environment `env` (NAME=VALUE), stdout
// to /dev/null, stderr to a pipe.
inline Proc Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  Proc p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    close(fds[0]);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(K3PACK_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(K3PACK_BIN, argv.data());
    _exit(127);
  }
  close(fds[1]);
  p.err_fd = fds[0];
  return p;
}

// Runs to completion; returns {exit code, stderr}.
inline std::pair<int, std::string> RunCli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  Proc p = Spawn(args, env);
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((n = read(p.err_fd, buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
  close(p.err_fd);
  int status = 0;
  waitpid(p.pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
}

}  // namespace k3pack::pack
