// torch's headers that most of csrc/ includes, parsed once per build into a precompiled header.
// setup.py (the real build) and scripts/torch_compile_check.py (the syntax-only check against
// other torches) copy this file next to the .gch they make from it and force-include it
// (`-include`) in every file. Contract: every file compiles to the same result with or without
// it (a file includes what it uses itself; nothing here depends on a macro of ours), so a .gch
// that g++ finds unusable (other flags) only costs time: g++ then reads these headers as text.
// No include guard: it is the main file when precompiled, and is included once per file.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
