// Hints that name a limit of the process (not of a file or of the input) as
// the likely cause of a failure, with the limit's value now.
#pragma once

#include <string>

#include "k3pack/error.h"

namespace k3pack {

// The soft limit `resource` (RLIMIT_AS, ...) has now, in its own units;
// "unlimited" when none.
std::string SoftLimitOf(int resource);

// Whether `err` says the process, not the file, is why a read failed: no
// permission (EACCES, EPERM) or a limit of the process (EMFILE, ENFILE,
// ENOMEM). Such a failure judges nothing of the file's contents.
bool IsProcessCannotRead(int err);

// For threads that could not be started: pthread_create says EAGAIN
// whichever limit stopped it, so this names the thread limit and, under
// `ulimit -v` (each thread's stack is address space), that limit with its
// value: "raise the process's thread limit (...) or its address space (...)".
std::string ThreadStartHint();

// For an allocation that failed: under `ulimit -v` it names the limit and its
// value; without one it says to free memory or ask for smaller buffers.
std::string OutOfMemoryHint();

// An allocation deep in the code (a container's growth) failed on `where`
// ("a copy thread of the pack build"): `out of memory on {where} (an
// allocation failed)`, ENOMEM, with OutOfMemoryHint().
Error OutOfMemoryOn(const std::string& where);

// "out of memory" (ENOMEM), made without allocating: the text fits
// std::string's inline buffer, so a thread whose every allocation fails (an
// I/O thread under `ulimit -v`) can still fail a read with it rather than
// end the process. The thread that reports it to the user, which may
// allocate, replaces it with an error naming what was lost; IsBareOutOfMemory
// tells it apart.
Error BareOutOfMemory() noexcept;
bool IsBareOutOfMemory(const Error& e);

}  // namespace k3pack
