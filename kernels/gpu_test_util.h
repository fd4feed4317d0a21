// For gpu-tagged tests: whether a CUDA device can be used, as a gtest
// assertion whose message says how to run or skip the test.
#ifndef GRADSYNC_KERNELS_GPU_TEST_UTIL_H_
#define GRADSYNC_KERNELS_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace gradsync::kernels {

inline ::testing::AssertionResult HaveCudaDevice() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err == cudaSuccess && devices > 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "no usable CUDA device (" << cudaGetErrorString(err)
         << "); this test is tagged \"gpu\": run it on a GPU machine or pass "
            "--test_tag_filters=-gpu";
}

}  // namespace gradsync::kernels

#endif  // GRADSYNC_KERNELS_GPU_TEST_UTIL_H_
