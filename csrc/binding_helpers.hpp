// What bindings.cpp and test_hooks.cpp share (pybind only).
#pragma once

#include "backend/backend.hpp"

#include <pybind11/pybind11.h>

namespace ddplite {

// The ddplite group behind a torch Backend; TypeError for another backend's.
inline DdpliteBackend& asDdplite(const c10::intrusive_ptr<c10d::Backend>& backend) {
  auto* group = dynamic_cast<DdpliteBackend*>(backend.get());
  if (group == nullptr) throw pybind11::type_error("not a ddplite backend");
  return *group;
}

}  // namespace ddplite
