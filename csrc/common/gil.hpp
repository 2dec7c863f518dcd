// Joining a thread of ours must never happen while holding Python's GIL: a thread of ours that
// drops the last C++ reference to a tensor whose Python object torch keeps alive for C++
// (PyObject preservation) takes the GIL to free that object, so a joiner holding the GIL and
// that thread would wait for each other forever. torch calls into the backend (shutdown, the
// destructor when the last Python reference goes) with the GIL held.
#pragma once

#include <Python.h>

namespace ddplite {

// Releases the GIL for its scope when the calling thread holds it (and Python is running); else
// nothing. Not copyable.
class GilReleasedScope {
 public:
  GilReleasedScope() {
    if (Py_IsInitialized() && PyGILState_Check()) saved_ = PyEval_SaveThread();
  }
  ~GilReleasedScope() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  GilReleasedScope(const GilReleasedScope&) = delete;
  GilReleasedScope& operator=(const GilReleasedScope&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

}  // namespace ddplite
