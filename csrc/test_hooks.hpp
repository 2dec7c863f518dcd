// The bindings only the tests use (test_hooks.cpp), kept apart from the user's surface
// (bindings.cpp), which calls bindTestHooks once, last, on the module torch_ddp_lite._C.
#pragma once

#include <pybind11/pybind11.h>

namespace ddplite {

void bindTestHooks(pybind11::module_& m);

}  // namespace ddplite
