// npusim's PrivateUse1 ("npu") hooks: what torch's C++ asks of an accelerator beyond the device guard. torch's
// Python hooks class (torch._C._acc.PrivateUse1Hooks) answers only is_built / is_available / has_primary_context,
// so pinned host memory (Tensor.pin_memory, torch.empty(pin_memory=True), is_pinned, DataLoader(pin_memory=True))
// and torch.Generator(device="npu") need these C++ ones. Built and loaded by hooks.py.
//
// - pinned memory: host memory from c10's CPU allocation, remembered by address so that isPinnedPtr answers for
//   any pointer inside a live block (as the driver's pointer query does for pinned pages on hardware). npu kernels
//   run on the host, so pinning changes no copy: it marks the memory.
// - generators: an npu generator is torch's CPU generator (Mersenne Twister, same seed, state and numbers) labelled
//   with the npu device. The kernels are the CPU's; the fallback hands them a CPU generator with this one's state
//   and writes the state back (backend.py). The default npu generator is torch's CPU default generator: every NPU
//   shares it (rng.py).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace {

using c10::DeviceIndex;

class PinnedBlocks {
 public:
  void add(void* ptr, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
  }
  void remove(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  bool contains(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);          // the first block starting after p
    if (it == blocks_.begin()) return false;
    --it;                                      // the last block starting at or before p
    return p == it->first || p < it->first + it->second;
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;         // start -> bytes
};

PinnedBlocks& pinned_blocks() {
  static auto* blocks = new PinnedBlocks();   // never destroyed: tensors may die after static destructors run
  return *blocks;
}

void free_pinned(void* ptr) {
  pinned_blocks().remove(ptr);
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(nbytes);
    pinned_blocks().add(ptr, nbytes);
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

struct NpuGenerator final : public at::CPUGeneratorImpl {
  explicit NpuGenerator(DeviceIndex index, uint64_t seed = c10::default_rng_seed_val) : CPUGeneratorImpl(seed) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

 private:
  NpuGenerator* clone_impl() const override {
    auto* gen = new NpuGenerator(device_.index());
    gen->set_engine(const_cast<NpuGenerator*>(this)->engine());
    gen->set_next_float_normal_sample(const_cast<NpuGenerator*>(this)->next_float_normal_sample());
    gen->set_next_double_normal_sample(const_cast<NpuGenerator*>(this)->next_double_normal_sample());
    return gen;
  }
};

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator; }
  bool isPinnedPtr(const void* data) const override { return pinned_blocks().contains(data); }
  at::Generator getNewGenerator(DeviceIndex index = -1) const override {
    return at::make_generator<NpuGenerator>(index);
  }
  const at::Generator& getDefaultGenerator(DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
};

NpuHooks hooks;

}  // namespace

extern "C" int npusim_register_npu_hooks() {
  if (at::isPrivateUse1HooksRegistered()) return 0;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return 1;
}
