// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), versions 0.x and 1.x: the
// few structures gfd's Python module reads from other libraries' tensors and writes for its own
// buffers. Declared here (the ABI is stable) so that the build needs no DLPack headers.
#pragma once

#include <cstdint>

namespace gfd::python::dlpack {

enum DeviceType : std::int32_t {
  kCPU = 1,
  kCUDA = 2,
  kCUDAHost = 3,  // pinned host memory
  kROCM = 10,
  kCUDAManaged = 13,
};

enum TypeCode : std::uint8_t {
  kInt = 0,
  kUInt = 1,
  kFloat = 2,
  kBfloat = 4,
  kBool = 6,
  kFloat8_e4m3fn = 10,
  kFloat8_e5m2 = 12,
};

struct Device {
  std::int32_t device_type;
  std::int32_t device_id;
};

struct DataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null: compact row-major
  std::uint64_t byte_offset;
};

// Capsule name "dltensor" (consumed: "used_dltensor").
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

struct Version {
  std::uint32_t major;
  std::uint32_t minor;
};

inline constexpr std::uint64_t kFlagReadOnly = 1;

// Capsule name "dltensor_versioned" (consumed: "used_dltensor_versioned").
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  std::uint64_t flags;
  Tensor dl_tensor;
};

}  // namespace gfd::python::dlpack
