// xnnblob's XNNPACK backend for ExecuTorch's runtime: registered under "XnnpackBackend" when
// this library is loaded, exactly where ExecuTorch's own XNNPACK backend would be. ExecuTorch's
// options are read here (per load over process-wide); the work is done on the Rust side.

#include "xnnblob-executorch/src/bridge.h"
#include "xnnblob-executorch/src/lib.rs.h"

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

namespace xnnblob::et {

using executorch::runtime::ArrayRef;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::BackendOption;
using executorch::runtime::BackendOptionContext;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;

// ---- EtBuffer, EtDataMap, EtCall ---------------------------------------------------------

EtBuffer::EtBuffer(FreeableBuffer&& buffer) : buffer_(std::move(buffer)) {}

const uint8_t* EtBuffer::data() const {
  return static_cast<const uint8_t*>(buffer_.data());
}

size_t EtBuffer::size() const { return buffer_.size(); }

EtDataMap::EtDataMap(const executorch::runtime::NamedDataMap* map) : map_(map) {}

namespace {

// ExecuTorch's error as the bridge names it (the codes are ExecuTorch's own).
EtError bridged(Error e) { return static_cast<EtError>(static_cast<uint32_t>(e)); }

// An exception for the bridge's fallible calls (cxx hands it to Rust as an Err).
[[noreturn]] void fail(const std::string& what, Error e) {
  char code[16];
  std::snprintf(code, sizeof code, "%#x", static_cast<unsigned>(e));
  throw std::runtime_error(what + " failed with ExecuTorch error " + code);
}

}  // namespace

uint32_t EtDataMap::num_keys() const {
  auto n = map_->get_num_keys();
  if (!n.ok()) fail("get_num_keys()", n.error());
  return *n;
}

size_t EtDataMap::identity() const { return reinterpret_cast<size_t>(map_); }

// A view of the map's own key (ExecuTorch's maps keep their keys for as long as they live),
// checked UTF-8 by rust::Str, which throws (an Err in Rust) on other bytes.
rust::Str EtDataMap::key_at(uint32_t index) const {
  auto key = map_->get_key(index);
  if (!key.ok()) fail("get_key(" + std::to_string(index) + ")", key.error());
  if (*key == nullptr) {
    fail("get_key(" + std::to_string(index) + ") gave no key: it", Error::Internal);
  }
  return rust::Str(*key);
}

std::unique_ptr<EtBuffer> EtDataMap::get_data(rust::Str key, EtError& error) const {
  // ExecuTorch's maps take a string_view but compare keys as C strings (through its data()), so
  // a view into a Rust string, which has no terminating NUL, matched only when the byte after it
  // happened to be 0. Hand them a terminated copy.
  const std::string terminated(key.data(), key.size());
  auto data = map_->get_data(terminated);
  if (!data.ok()) {
    error = bridged(data.error());
    return nullptr;
  }
  error = EtError::Ok;
  return std::make_unique<EtBuffer>(std::move(*data));
}

EtCall::EtCall(Span<EValue*> args) : args_(args) {}

size_t EtCall::num_args() const { return args_.size(); }

namespace {

// The dim order of `t` (rank entries), checked to be a permutation: sizes are read and written
// through it.
bool dim_order_of(const executorch::aten::Tensor& t, size_t rank,
                  executorch::aten::DimOrderType (&order)[16]) {
  if (rank > 16 || executorch::runtime::get_dim_order(t, order, rank) != Error::Ok) {
    return false;
  }
  bool seen[16] = {};
  for (size_t d = 0; d < rank; ++d) {
    if (order[d] >= rank || seen[order[d]]) {
      return false;
    }
    seen[order[d]] = true;
  }
  return true;
}

}  // namespace

bool EtCall::tensor(size_t index, TensorArg& arg) const {
  if (index >= args_.size() || args_[index] == nullptr || !args_[index]->isTensor()) {
    return false;
  }
  const auto& t = args_[index]->toTensor();
  arg.data = static_cast<uint8_t*>(t.mutable_data_ptr());
  arg.nbytes = t.nbytes();
  arg.scalar_type = static_cast<int8_t>(t.scalar_type());
  arg.rank = static_cast<size_t>(t.dim());
  executorch::aten::DimOrderType order[16];
  if (arg.rank > arg.sizes.size() || !dim_order_of(t, arg.rank, order)) {
    return false;
  }
  // As ExecuTorch's backend: XNNPACK sees the sizes in memory order (a channels-last input's
  // graph declares it N, H, W, C).
  for (size_t d = 0; d < arg.rank; ++d) {
    arg.sizes[d] = t.size(order[d]);
  }
  return true;
}

EtError EtCall::resize(size_t index, rust::Slice<const int64_t> sizes, TensorArg& arg) {
  if (index >= args_.size() || args_[index] == nullptr || !args_[index]->isTensor()) {
    return EtError::InvalidArgument;
  }
  constexpr size_t kMaxRank = 16;
  auto& t = args_[index]->toTensor();
  executorch::aten::DimOrderType order[kMaxRank];
  if (sizes.size() > kMaxRank || static_cast<size_t>(t.dim()) != sizes.size() ||
      !dim_order_of(t, sizes.size(), order)) {
    return EtError::InvalidArgument;
  }
  // `sizes` are in memory order: put each back at the dimension it is.
  executorch::aten::SizesType new_sizes[kMaxRank];
  for (size_t d = 0; d < sizes.size(); ++d) {
    new_sizes[order[d]] = static_cast<executorch::aten::SizesType>(sizes[d]);
  }
  Error e = executorch::runtime::resize_tensor(
      t, ArrayRef<executorch::aten::SizesType>(new_sizes, sizes.size()));
  if (e != Error::Ok) {
    return bridged(e);
  }
  return tensor(index, arg) ? EtError::Ok : EtError::InvalidArgument;
}

// ---- The backend -------------------------------------------------------------------------

namespace {

constexpr char kBackendId[] = "XnnpackBackend";
// ExecuTorch's own option keys (backends/xnnpack/runtime/XNNPACKBackend.h), spelt alike so an
// app that configured ExecuTorch's cache configures xnnblob's with the same lines.
constexpr char kWeightCacheEnabled[] = "weight_cache_enabled";
constexpr char kPackedCachePath[] = "packed_cache_path";
constexpr char kWorkspaceSharingMode[] = "workspace_sharing_mode";
constexpr char kSaveWeightCacheOnDisk[] = "save_weight_cache_on_disk";
// xnnblob's own: check every packed weight of the cache file before the first execute.
constexpr char kVerifyOnLoad[] = "verify_on_load";
// xnnblob's own: read-only caches made ahead of time (files or directories, `:`-separated, in
// one option value of ExecuTorch's 256 bytes), consulted before packed_cache_path.
constexpr char kPackedCacheLayers[] = "packed_cache_layers";

Error to_error(Status status) {
  switch (status) {
    case Status::Ok:
      return Error::Ok;
    case Status::InvalidProgram:
      return Error::InvalidProgram;
    case Status::InvalidExternalData:
      return Error::InvalidExternalData;
    case Status::NotSupported:
      return Error::NotSupported;
    case Status::InvalidArgument:
      return Error::InvalidArgument;
    case Status::MemoryAllocationFailed:
      return Error::MemoryAllocationFailed;
    case Status::Internal:
      break;
  }
  return Error::Internal;
}

// The verdict on the ExecuTorch runtime this library runs in, made once: the loaded
// libexecutorch.so is found by one of its functions (dladdr) and its package's version is
// compared, on the Rust side, with the one this library was built against. A note is logged;
// a refusal is returned by every init.
const Outcome& runtime_check() {
  static const Outcome verdict = [] {
    Dl_info info{};
    const char* library = "";
    if (dladdr(reinterpret_cast<void*>(&executorch::runtime::register_backend), &info) != 0 &&
        info.dli_fname != nullptr) {
      library = info.dli_fname;
    }
    // Infallible on the Rust side: every failure comes back as the outcome's status.
    Outcome outcome = check_runtime(rust::Str(library));
    // A refusal is logged by each init it fails; a note once, here.
    if (outcome.status == Status::Ok && outcome.severe) {
      ET_LOG(Error, "xnnblob: %s", std::string(outcome.message).c_str());
    } else if (outcome.status == Status::Ok && !outcome.message.empty()) {
      ET_LOG(Info, "xnnblob: %s", std::string(outcome.message).c_str());
    }
    return outcome;
  }();
  return verdict;
}

class XnnblobBackend final : public BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      ArrayRef<CompileSpec> /*compile_specs: ExecuTorch's XNNPACK payloads carry none*/)
      const override {
    const Outcome& runtime = runtime_check();
    if (runtime.status != Status::Ok) {
      ET_LOG(Error, "xnnblob: %s", std::string(runtime.message).c_str());
      return to_error(runtime.status);
    }
    try {
      InitOptions options = resolve(context);
      // Taken over: freed when the last view of it goes (at the end of init, unless inline
      // constants in it are in use). ExecuTorch's later Free on the moved-from buffer is a no-op.
      auto payload = std::make_unique<EtBuffer>(std::move(*processed));
      std::unique_ptr<EtDataMap> map;
      if (context.get_named_data_map() != nullptr) {
        map = std::make_unique<EtDataMap>(context.get_named_data_map());
      }
      Outcome outcome{Status::Ok, rust::String(), false};
      rust::Box<EtDelegate> delegate =
          delegate_init(options, std::move(payload), std::move(map), outcome);
      if (!outcome.message.empty()) {
        if (outcome.status == Status::Ok && !outcome.severe) {
          ET_LOG(Info, "xnnblob: %s", std::string(outcome.message).c_str());
        } else if (outcome.status == Status::Ok) {
          ET_LOG(Error, "xnnblob: %s", std::string(outcome.message).c_str());
        } else {
          ET_LOG(Error, "xnnblob: init failed: %s", std::string(outcome.message).c_str());
        }
      }
      if (delegate->is_empty()) {
        return to_error(outcome.status == Status::Ok ? Status::Internal : outcome.status);
      }
      return static_cast<DelegateHandle*>(delegate.into_raw());
    } catch (const std::bad_alloc&) {
      return Error::MemoryAllocationFailed;
    } catch (const std::exception& e) {
      ET_LOG(Error, "xnnblob: init failed: %s", e.what());
      return Error::Internal;
    }
  }

  Error execute(
      BackendExecutionContext& /*context*/,
      DelegateHandle* handle,
      Span<EValue*> args) const override {
    if (handle == nullptr) {
      return Error::DelegateInvalidHandle;
    }
    EtCall call(args);
    Outcome outcome = delegate_execute(*static_cast<EtDelegate*>(handle), call);
    if (outcome.status != Status::Ok) {
      ET_LOG(Error, "xnnblob: execute failed: %s", std::string(outcome.message).c_str());
      return to_error(outcome.status);
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* handle) const override {
    if (handle != nullptr) {
      (void)rust::Box<EtDelegate>::from_raw(static_cast<EtDelegate*>(handle));
    }
  }

  Error set_option(BackendOptionContext& /*context*/, const Span<BackendOption>& options)
      override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const BackendOption& o : options) {
      if (std::strcmp(o.key, kWeightCacheEnabled) == 0) {
        if (auto* v = std::get_if<bool>(&o.value)) weight_cache_enabled_ = *v;
        else return Error::InvalidArgument;
      } else if (std::strcmp(o.key, kPackedCachePath) == 0) {
        if (auto* v = std::get_if<std::array<char, executorch::runtime::kMaxOptionValueLength>>(
                &o.value)) {
          packed_cache_path_ = v->data();
        } else {
          return Error::InvalidArgument;
        }
      } else if (std::strcmp(o.key, kPackedCacheLayers) == 0) {
        if (auto* v = std::get_if<std::array<char, executorch::runtime::kMaxOptionValueLength>>(
                &o.value)) {
          packed_cache_layers_ = v->data();
        } else {
          return Error::InvalidArgument;
        }
      } else if (std::strcmp(o.key, kWorkspaceSharingMode) == 0) {
        auto* v = std::get_if<int>(&o.value);
        if (v == nullptr || *v < 0 || *v > 2) return Error::InvalidArgument;
        workspace_sharing_mode_ = *v;
      } else if (std::strcmp(o.key, kVerifyOnLoad) == 0) {
        if (auto* v = std::get_if<bool>(&o.value)) verify_on_load_ = *v;
        else return Error::InvalidArgument;
      } else if (std::strcmp(o.key, kSaveWeightCacheOnDisk) == 0) {
        auto* v = std::get_if<bool>(&o.value);
        if (v == nullptr) return Error::InvalidArgument;
        if (*v) {
          Outcome saved = save_caches();
          if (saved.status != Status::Ok) {
            ET_LOG(Error, "xnnblob: saving the packed-weight cache failed: %s",
                   std::string(saved.message).c_str());
            return to_error(saved.status);
          }
        }
      }
      // Other keys are another backend version's: ignored, as ExecuTorch's backend does.
    }
    return Error::Ok;
  }

  Error get_option(BackendOptionContext& /*context*/, Span<BackendOption>& options) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (BackendOption& o : options) {
      if (std::strcmp(o.key, kWeightCacheEnabled) == 0) {
        o.value = weight_cache_enabled_;
      } else if (std::strcmp(o.key, kPackedCachePath) == 0) {
        std::array<char, executorch::runtime::kMaxOptionValueLength> text{};
        std::strncpy(text.data(), packed_cache_path_.c_str(), text.size() - 1);
        o.value = text;
      } else if (std::strcmp(o.key, kPackedCacheLayers) == 0) {
        std::array<char, executorch::runtime::kMaxOptionValueLength> text{};
        std::strncpy(text.data(), packed_cache_layers_.c_str(), text.size() - 1);
        o.value = text;
      } else if (std::strcmp(o.key, kWorkspaceSharingMode) == 0) {
        o.value = workspace_sharing_mode_;
      } else if (std::strcmp(o.key, kSaveWeightCacheOnDisk) == 0) {
        o.value = false;
      } else if (std::strcmp(o.key, kVerifyOnLoad) == 0) {
        o.value = verify_on_load_;
      }
    }
    return Error::Ok;
  }

 private:
  // The process-wide values, overridden by this load's runtime specs where given.
  InitOptions resolve(const BackendInitContext& context) const {
    InitOptions options;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      options.weight_cache_enabled = weight_cache_enabled_;
      options.packed_cache_path = rust::String(packed_cache_path_);
      options.packed_cache_layers = rust::String(packed_cache_layers_);
      options.workspace_sharing_mode = workspace_sharing_mode_;
      options.verify_on_load = verify_on_load_;
    }
    auto enabled = context.get_runtime_spec<bool>(kWeightCacheEnabled);
    if (enabled.ok()) options.weight_cache_enabled = *enabled;
    auto path = context.get_runtime_spec<const char*>(kPackedCachePath);
    if (path.ok() && *path != nullptr) options.packed_cache_path = rust::String(*path);
    auto layers = context.get_runtime_spec<const char*>(kPackedCacheLayers);
    if (layers.ok() && *layers != nullptr) options.packed_cache_layers = rust::String(*layers);
    auto mode = context.get_runtime_spec<int>(kWorkspaceSharingMode);
    if (mode.ok()) options.workspace_sharing_mode = *mode;
    auto verify = context.get_runtime_spec<bool>(kVerifyOnLoad);
    if (verify.ok()) options.verify_on_load = *verify;
    return options;
  }

  mutable std::mutex mutex_;
  // On by default: in memory, one packing per weight across every program of the process.
  bool weight_cache_enabled_ = true;
  std::string packed_cache_path_;
  std::string packed_cache_layers_;
  // ExecuTorch's default: one workspace for every delegate of the process.
  int workspace_sharing_mode_ = 2;
  bool verify_on_load_ = false;
};

XnnblobBackend& backend_instance() {
  static XnnblobBackend* backend = new XnnblobBackend();  // never destroyed: ExecuTorch keeps it
  return *backend;
}

const bool registered_at_load = [] {
  static const executorch::runtime::Backend entry{kBackendId, &backend_instance()};
  Error e = executorch::runtime::register_backend(entry);
  if (e != Error::Ok) {
    ET_LOG(Error,
           "xnnblob: could not register \"%s\" (error %d): another XNNPACK backend is loaded "
           "first; link one of them only",
           kBackendId, static_cast<int>(e));
  }
  if (e == Error::Ok) {
    // XNNPACK's initialisation is made now, on this thread, as ExecuTorch's own backend makes
    // it when it is loaded; the rest (the thread pool's threads must start) is begun on a
    // thread of its own, ready by the time an app loads its first program.
    prepare_backend();
    // The runtime's verdict too: it is the process's, not a load's (reading the runtime's
    // version file in the first load made it the slowest).
    (void)runtime_check();
  }
  return e == Error::Ok;
}();

}  // namespace

bool registered() { return registered_at_load; }

}  // namespace xnnblob::et
