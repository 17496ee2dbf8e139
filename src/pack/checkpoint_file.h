// The build checkpoint `<pack>.partial.checkpoint`, kept writable on a full
// disk.
//
// The checkpoint matters most when the disk has just filled up: the copy
// stops and the finished prefix must be recorded, so the rerun resumes there.
// A temp file + rename needs a new block at exactly that moment. So the
// writer reserves its space while there is room: two files of a fixed size,
// the checkpoint and `<checkpoint>.spare`, both fully allocated when the
// build starts. Each update rewrites the spare in place (no new blocks),
// fsyncs it and swaps the two names atomically (renameat2 RENAME_EXCHANGE);
// the old checkpoint becomes the next spare. A reader sees the old or the new
// checkpoint, never a torn one. The content is the checkpoint's JSON padded
// with spaces to the fixed size (JSON allows trailing whitespace).
//
// Where the filesystem cannot exchange names, updates fall back to temp file
// + rename (then a full disk can make the update fail, as before).
#pragma once

#include <string>

#include "pack/copy.h"
#include "pack/sidecars.h"
#include "util/file.h"

namespace k3pack::pack {

inline constexpr size_t kCheckpointFileBytes = 4096;

std::string CheckpointSparePathFor(const std::string& checkpoint_path);  // <checkpoint>.spare

class CheckpointFile {
 public:
  // Writes `initial` as the checkpoint and reserves the space of every later
  // update. `budget` (the ENOSPC test seam) is charged for writes that need
  // new blocks, as a real full filesystem would refuse them.
  static Result<CheckpointFile> Create(const std::string& path, const Checkpoint& initial, WriteBudget* budget);
  CheckpointFile(CheckpointFile&&) = default;
  CheckpointFile& operator=(CheckpointFile&&) = default;

  // Replaces the checkpoint durably with `c`.
  Status Write(const Checkpoint& c);
  void set_budget(WriteBudget* budget) { budget_ = budget; }

 private:
  CheckpointFile() = default;
  Status WriteNewFile(const std::string& text);  // the temp-file + rename fallback
  std::string path_, spare_;
  UniqueFd current_, spare_fd_;  // spare_fd_ is the file named spare_ now
  bool exchange_ = false;
  WriteBudget* budget_ = nullptr;
};

}  // namespace k3pack::pack
