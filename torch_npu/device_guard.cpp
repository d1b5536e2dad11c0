// npusim's device guard for PrivateUse1 ("npu"): what torch's C++ asks of a device type — the current device
// index (per thread), the number of devices, one default stream per device — for a backend whose kernels run
// on the host. torch's Python guard for PrivateUse1 answers one device, index 0, which stops autograd on npu:k
// for k > 0 (the engine keeps one ready queue per device index). Built and loaded by device_guard.py.
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

thread_local DeviceIndex current_index = 0;
DeviceIndex device_count = 1;

struct NpuGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    current_index = d.index();
    return old;
  }
  Device getDevice() const override { return Device(DeviceType::PrivateUse1, current_index); }
  void setDevice(Device d) const override { current_index = d.index(); }
  void uncheckedSetDevice(Device d) const noexcept override { current_index = d.index(); }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override { return device_count; }
};

NpuGuard guard;

}  // namespace

extern "C" int npusim_register_npu_guard(int count) {
  if (c10::impl::hasDeviceGuardImpl(DeviceType::PrivateUse1)) return 0;
  device_count = static_cast<DeviceIndex>(count);
  c10::impl::registerDeviceGuard(DeviceType::PrivateUse1, &guard);
  return 1;
}

extern "C" void npusim_set_npu_device_count(int count) { device_count = static_cast<DeviceIndex>(count); }
