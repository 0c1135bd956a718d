# C++20 for nvcc on CMake versions that do not know it (3.25 has no cuda_std_20 for NVIDIA's
# compiler; later versions do): teach CMake the flag, as later versions have it, when nvcc is
# 12.0 or newer. Included by gfd's own build after enabling CUDA, and by gfd's package config,
# so that the cuda_std_20 requirement gfd::gfd carries also works in a consumer on CMake 3.25
# (that consumer must enable CUDA before find_package(gfd)).
if(CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" AND
   CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0 AND
   NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
