// createCudaPath for builds without NCCL (setup.py found no nccl.h, libnccl.so.2 or CUDA torch):
// there is no CUDA path, and the backend refuses CUDA tensors with a message saying so.
#include "cuda/cuda_path.hpp"

#if !DDPLITE_WITH_NCCL
namespace ddplite {

std::unique_ptr<CudaPath> createCudaPath(const CudaPathDeps& deps) {
  return nullptr;
}

}  // namespace ddplite
#endif
