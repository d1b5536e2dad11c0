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
// - storage resizing (UntypedStorage.resize_, FSDP's freeing and re-allocating of its flat parameters): a new host
//   block for the storage, the old bytes copied as far as both reach, the old block freed (resize to 0 leaves no
//   block). storage.py accounts npu blocks by host address, so it is asked first whether the new bytes fit on the
//   card (torch_npu's out-of-memory error if not) and told of the new block, which replaces the old one.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

// storage.py's accounting of a resize, in two calls that return 0 (done), 1 (out of memory) or 2 (another error),
// with the message in the buffer: before the host allocates, whether the new bytes fit on the card (device, bytes,
// message buffer, its size); after, the new block replacing the old (device, old data, new data, new bytes, a weak
// reference to the storage that the callee owns, message buffer, its size).
using FitsCallback = int (*)(int, size_t, char*, size_t);
using ResizedCallback = int (*)(int, uintptr_t, uintptr_t, size_t, uintptr_t, char*, size_t);
FitsCallback fits_callback = nullptr;
ResizedCallback resized_callback = nullptr;
constexpr size_t kMessageBytes = 4096;

void raise_for(int status, const char* message) {
  TORCH_CHECK_WITH(OutOfMemoryError, status != 1, message);
  TORCH_CHECK(status == 0, message);
}

void resize_bytes(c10::StorageImpl* impl, size_t nbytes) {
  TORCH_CHECK(resized_callback != nullptr, "npu storage resize: torch_npu's accounting callbacks are not registered");
  const size_t old_nbytes = impl->nbytes();
  if (nbytes == old_nbytes) return;
  const c10::Device device = impl->device();
  char message[kMessageBytes] = {0};
  if (nbytes) raise_for(fits_callback(device.index(), nbytes, message, kMessageBytes - 1), message);
  void* fresh = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
  void* weak = c10::raw::intrusive_ptr::make_weak(impl);
  int status = resized_callback(device.index(), reinterpret_cast<uintptr_t>(impl->data_ptr().get()),
                                reinterpret_cast<uintptr_t>(fresh), nbytes, reinterpret_cast<uintptr_t>(weak),
                                message, kMessageBytes - 1);
  if (status != 0 && fresh) c10::free_cpu(fresh);
  raise_for(status, message);
  const size_t kept = std::min(old_nbytes, nbytes);
  if (kept) std::memcpy(fresh, impl->data_ptr().get(), kept);
  impl->set_data_ptr_noswap(c10::DataPtr(fresh, fresh, fresh ? &c10::free_cpu : nullptr, device));
  impl->set_nbytes(nbytes);
}

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
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

NpuHooks hooks;

}  // namespace

extern "C" int npusim_register_npu_hooks() {
  if (at::isPrivateUse1HooksRegistered()) return 0;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return 1;
}

extern "C" void npusim_set_resize_callbacks(FitsCallback fits, ResizedCallback resized) {
  fits_callback = fits;
  resized_callback = resized;
}

// A CPU storage on an npu storage's bytes (storage.cpu_view) made resizable with the CPU allocator, so that a CPU
// kernel can resize an out= argument of the wrong size as CPU torch does; the old bytes are not the view's to free.
extern "C" void npusim_make_resizable(uintptr_t storage_impl) {
  auto* impl = reinterpret_cast<c10::StorageImpl*>(storage_impl);
  impl->set_allocator(c10::GetCPUAllocator());
  impl->set_resizable(true);
}
