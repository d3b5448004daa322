// xnnblob-et-run: runs an ExecuTorch program with ExecuTorch's own runtime (the wheel's Module),
// through xnnblob's XNNPACK backend or ExecuTorch's, and reports what a launch cost.
//
// The backend is a library dlopen'ed before the program loads, so one binary measures both.
// Results are printed as key=value lines (for tests and benches); outputs are written as raw
// little-endian files like `xnnblob run`'s.

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>

#if defined(ET_USE_THREADPOOL)
#include <executorch/extension/threadpool/threadpool_guard.h>
#endif

#include <dirent.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

}  // namespace

// libexecutorch_threadpool's pool. The wheel ships no header for it (threadpool.h needs
// pthreadpool.h, which it does not ship), so the one call used is declared as the library
// defines it.
#if defined(ET_USE_THREADPOOL)
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t new_thread_count);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool
#endif

namespace {

const char kUsage[] =
    "usage: xnnblob-et-run PROGRAM.pte [--data FILE.ptd]... [--method NAME]\n"
    "         [--input FILE [--dtype D] [--shape AxBx..]]... [PROGRAM2.pte ...]\n"
    "         [--backend xnnblob|executorch|LIB.so] [--load-mode file|mmap] [--cache PATH]\n"
    "         [--cache-layers FILE_OR_DIR[:...]]\n"
    "         [--no-weight-cache] [--workspace-sharing 0|1|2] [--steps N] [--repeat N]\n"
    "         [--threads N] [--pool-threads N] [--no-pool] [--verify-on-load]\n"
    "         [--wait-between-executes] [--output-dir DIR]\n"
    "         [--call METHOD[:INPUT,...] [--times N] [--input FILE ...]]... [--share-arenas on|off]\n"
    "--data, --method and --input apply to the program named last. An input path may hold\n"
    "{step}, replaced by the step number (0..N-1) for stateful programs. --steps 0 loads only.\n"
    "--call runs methods of one loaded program in the order given, each --times N times ({step}\n"
    "counts them), instead of --method --steps; --input, --dtype and --shape then apply to the\n"
    "call named last. Methods that share mutable buffers share ExecuTorch's memory arenas\n"
    "(Module's share_memory_arenas): on by default when calls name two methods or more.\n"
    "--threads N loads and runs in N threads at once; --pool-threads N resizes ExecuTorch's\n"
    "thread pool first; --no-pool holds a NoThreadPoolGuard in each of them.\n"
    "--wait-between-executes reads a line from stdin before each repeat after the first.\n"
    "--cache-layers sets xnnblob's packed_cache_layers: read-only caches made ahead of time\n"
    "(xnnblob prepack), consulted before --cache, which it needs.\n";

struct Input {
  std::string path;
  std::optional<ScalarType> dtype;
  std::optional<std::vector<int64_t>> shape;
};

// One method call of a sequence (--call): run `times` times in a row.
struct Call {
  std::string method;
  std::vector<Input> inputs;
  int times = 1;
};

// One program to load, with its data files, method and inputs.
struct Program {
  std::string path;
  std::vector<std::string> data;
  std::string method = "forward";
  std::vector<Input> inputs;
  // A sequence of method calls on the one loaded program, instead of `method` run --steps times.
  std::vector<Call> calls;
  // Module's share_memory_arenas: unset is on when the calls name two methods or more.
  std::optional<bool> share_arenas;
};

struct Options {
  // Loaded one after another into one process (programs sharing weights share them).
  std::vector<Program> programs;
  std::string backend = "xnnblob";
  bool mmap = false;
  std::string cache;
  std::string cache_layers;
  bool weight_cache = true;
  int workspace_sharing = -1;
  int steps = 1;
  int repeat = 1;
  int threads = 1;
  // ExecuTorch's thread pool: resized first (0: left as it is), or kept out of every launch by a
  // NoThreadPoolGuard.
  int pool_threads = 0;
  bool no_pool = false;
  // xnnblob's verify_on_load: every packed weight checked before the first execute.
  bool verify_on_load = false;
  // Before each repeat after the first, a line on stdin: lets a caller change files (cut the
  // cache short, say) between executes of one launch.
  bool wait_between_executes = false;
  std::string output_dir;
};

struct Failure {
  std::string what;
  // A bad command line (exit 2, with the usage), not a failed run (exit 1).
  bool usage = false;
};

[[noreturn]] void fail(const std::string& what) { throw Failure{what}; }
[[noreturn]] void usage_error(const std::string& what) { throw Failure{what, true}; }

std::string error_text(Error e) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ExecuTorch error %#x", static_cast<unsigned>(e));
  return buf;
}

std::optional<ScalarType> parse_dtype(const std::string& name) {
  static const std::map<std::string, ScalarType> names = {
      {"float32", ScalarType::Float}, {"f32", ScalarType::Float},
      {"float16", ScalarType::Half},  {"f16", ScalarType::Half},
      {"bfloat16", ScalarType::BFloat16}, {"bf16", ScalarType::BFloat16},
      {"int8", ScalarType::Char},     {"i8", ScalarType::Char},
      {"uint8", ScalarType::Byte},    {"u8", ScalarType::Byte},
      {"int32", ScalarType::Int},     {"i32", ScalarType::Int},
      {"int64", ScalarType::Long},    {"i64", ScalarType::Long},
      {"bool", ScalarType::Bool}};
  auto it = names.find(name);
  if (it == names.end()) return std::nullopt;
  return it->second;
}

const char* short_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "f32";
    case ScalarType::Half: return "f16";
    case ScalarType::BFloat16: return "bf16";
    case ScalarType::Char: return "i8";
    case ScalarType::Byte: return "u8";
    case ScalarType::Int: return "i32";
    case ScalarType::Long: return "i64";
    case ScalarType::Bool: return "bool";
    default: return "bin";
  }
}

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) {
      usage_error("--shape " + text + ": expected dimensions like 2x12");
    }
    dims.push_back(std::stoll(part));
  }
  return dims;
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](int& i) -> int {
    std::string v = value(i);
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
      usage_error(std::string(argv[i - 1]) + " " + v + ": expected a number");
    }
    return std::stoi(v);
  };
  auto program = [&](const std::string& option) -> Program& {
    if (o.programs.empty()) usage_error(option + " must follow a program");
    return o.programs.back();
  };
  // Where --input, --dtype and --shape go: the last call's inputs, or the program's.
  auto inputs_of = [&](const std::string& option) -> std::vector<Input>& {
    Program& p = program(option);
    return p.calls.empty() ? p.inputs : p.calls.back().inputs;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--data") program(a).data.push_back(value(i));
    else if (a == "--backend") o.backend = value(i);
    else if (a == "--load-mode") {
      std::string m = value(i);
      if (m != "file" && m != "mmap") usage_error("--load-mode " + m + ": file or mmap");
      o.mmap = m == "mmap";
    } else if (a == "--cache") o.cache = value(i);
    else if (a == "--cache-layers") o.cache_layers = value(i);
    else if (a == "--no-weight-cache") o.weight_cache = false;
    else if (a == "--workspace-sharing") o.workspace_sharing = number(i);
    else if (a == "--method") program(a).method = value(i);
    else if (a == "--input") inputs_of(a).push_back(Input{value(i), std::nullopt, std::nullopt});
    else if (a == "--call") {
      std::string spec = value(i);
      Call call;
      size_t colon = spec.find(':');
      call.method = spec.substr(0, colon);
      if (call.method.empty()) usage_error("--call " + spec + ": no method named");
      if (colon != std::string::npos) {
        std::stringstream files(spec.substr(colon + 1));
        std::string file;
        while (std::getline(files, file, ',')) {
          if (file.empty()) usage_error("--call " + spec + ": an empty input path");
          call.inputs.push_back(Input{file, std::nullopt, std::nullopt});
        }
      }
      program(a).calls.push_back(std::move(call));
    } else if (a == "--times") {
      Program& p = program(a);
      if (p.calls.empty()) usage_error("--times must follow a --call");
      p.calls.back().times = std::max(1, number(i));
    } else if (a == "--share-arenas") {
      std::string v = value(i);
      if (v != "on" && v != "off") usage_error("--share-arenas " + v + ": on or off");
      program(a).share_arenas = v == "on";
    } else if (a == "--dtype" || a == "--shape") {
      auto& inputs = inputs_of(a);
      if (inputs.empty()) usage_error(a + " must follow an --input");
      std::string v = value(i);
      if (a == "--dtype") {
        auto t = parse_dtype(v);
        if (!t) usage_error("--dtype " + v + ": unknown");
        inputs.back().dtype = *t;
      } else {
        inputs.back().shape = parse_shape(v);
      }
    } else if (a == "--steps") o.steps = std::max(0, number(i));
    else if (a == "--repeat") o.repeat = std::max(1, number(i));
    else if (a == "--threads") o.threads = std::max(1, number(i));
    else if (a == "--pool-threads") o.pool_threads = std::max(1, number(i));
    else if (a == "--no-pool") o.no_pool = true;
    else if (a == "--verify-on-load") o.verify_on_load = true;
    else if (a == "--wait-between-executes") o.wait_between_executes = true;
    else if (a == "--output-dir") o.output_dir = value(i);
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (!a.empty() && a[0] == '-') usage_error("unknown option " + a);
    else o.programs.push_back(Program{a, {}, "forward", {}});
  }
  if (o.programs.empty()) usage_error("no program given");
  return o;
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// The directory of the libexecutorch.so this process runs with (found by the loader: RUNPATH
// or LD_LIBRARY_PATH), where ExecuTorch's own XNNPACK backend ships beside it. Asked of the
// loader rather than fixed at build time, so that an install (the wheel) that moves both
// packages still finds the one it runs with.
std::string executorch_lib_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&executorch::runtime::register_backend), &info) == 0 ||
      info.dli_fname == nullptr) {
    return ".";
  }
  std::string path(info.dli_fname);
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string backend_library(const std::string& backend) {
  if (backend == "xnnblob") {
    // Beside the runner in a cargo build; in lib/ beside bin/ in an install (install.sh, the
    // wheel).
    std::string beside = self_dir() + "/libxnnblob_executorch.so";
    if (access(beside.c_str(), F_OK) == 0) return beside;
    return self_dir() + "/../lib/libxnnblob_executorch.so";
  }
  if (backend == "executorch") return executorch_lib_dir() + "/libexecutorch_backend_xnnpack.so";
  return backend;
}

// /proc/self/io's counters: rchar counts bytes read by read()/pread() (a data loader reading
// weights into memory), read_bytes those fetched from storage.
std::map<std::string, unsigned long long> proc_io() {
  std::map<std::string, unsigned long long> io;
  std::ifstream in("/proc/self/io");
  std::string key;
  unsigned long long v;
  while (in >> key >> v) io[key.substr(0, key.size() - 1)] = v;
  return io;
}

// A field of /proc/self/status in KiB (VmHWM: the peak resident set; RssAnon: anonymous
// memory, which iOS's phys_footprint and Android's low-memory killer count; RssFile: file
// pages, clean ones of which the kernel can drop), or -1.
long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::stol(line.substr(n + 1));
    }
  }
  return -1;
}

long peak_rss_kib() { return status_kib("VmHWM"); }

// This thread's CPU time, to the scheduler's precision (getrusage's is the tick's).
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Threads of this process whose name starts with `prefix`.
int threads_named(const std::string& prefix) {
  int n = 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(tasks)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      if (std::getline(comm, name) && name.compare(0, prefix.size(), prefix) == 0) ++n;
    }
    closedir(tasks);
  }
  return n;
}

// Threads of this process that kept its name, less the main thread: threads no library named,
// such as ExecuTorch's pool's workers (pthreadpool names none), which start when the pool is
// first used.
int unnamed_threads() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  if (!std::getline(comm, name)) return -1;
  return threads_named(name) - 1;
}

std::string for_step(std::string path, int step) {
  const std::string token = "{step}";
  for (size_t at; (at = path.find(token)) != std::string::npos;) {
    path.replace(at, token.size(), std::to_string(step));
  }
  return path;
}

struct Output {
  ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// One program's launch: its costs and, per step, its outputs.
struct Launch {
  double load_to_ready_ms = 0;
  double first_execute_ms = 0;
  std::vector<double> execute_ms;
  unsigned long long load_rchar = 0;
  unsigned long long load_read_bytes = 0;
  long load_rss_anon_kib = 0;  // right after the load, before any execute
  long load_rss_file_kib = 0;
  long load_minor_faults = 0;  // page faults served from memory during the load (code, data)
  long first_execute_minor_faults = 0;  // the same, during the first execute
  double load_cpu_ms = 0;  // the loading thread's CPU time in the load (the rest it waited)
  int load_unnamed_threads = 0;  // right after the load: ExecuTorch's pool's workers, if started
  std::vector<std::vector<Output>> steps;  // per step (per call made), per output
  bool share_arenas = false;
  std::vector<std::string> calls;  // per call made: "METHOD ITERATION MS"
};

// One execute's inputs: each file (its {step} replaced) as the tensor the method declares, or of
// the dtype and shape given. `storage` and `tensors` hold what the inputs point into.
std::vector<EValue> make_inputs(const std::string& method, executorch::runtime::MethodMeta meta,
                                const std::vector<Input>& given, int step,
                                std::vector<std::vector<uint8_t>>& storage,
                                std::vector<executorch::extension::TensorPtr>& tensors) {
  if (given.size() != meta.num_inputs()) {
    fail("method " + method + " takes " + std::to_string(meta.num_inputs()) + " inputs, " +
         std::to_string(given.size()) + " given");
  }
  std::vector<EValue> inputs;
  storage.reserve(given.size());
  for (size_t i = 0; i < given.size(); ++i) {
    auto tmeta = meta.input_tensor_meta(i);
    if (!tmeta.ok()) fail(method + ": input " + std::to_string(i) + " is not a tensor");
    ScalarType dtype = given[i].dtype.value_or(tmeta->scalar_type());
    std::vector<int64_t> shape(tmeta->sizes().begin(), tmeta->sizes().end());
    storage.push_back(read_file(for_step(given[i].path, step)));
    size_t bytes = storage.back().size();
    size_t element = executorch::runtime::elementSize(dtype);
    if (given[i].shape) {
      shape = *given[i].shape;
    } else if (!shape.empty()) {
      // A dynamic leading dimension, from the file's size.
      size_t rest = element;
      for (size_t d = 1; d < shape.size(); ++d) rest *= static_cast<size_t>(shape[d]);
      if (rest > 0 && bytes % rest == 0) shape[0] = static_cast<int64_t>(bytes / rest);
    }
    size_t numel = 1;
    for (auto d : shape) numel *= static_cast<size_t>(d);
    if (numel * element != bytes) {
      fail(for_step(given[i].path, step) + ": " + std::to_string(bytes) +
           " bytes do not hold the input's shape");
    }
    std::vector<executorch::aten::SizesType> sizes(shape.begin(), shape.end());
    tensors.push_back(executorch::extension::from_blob(storage.back().data(), sizes, dtype));
    inputs.emplace_back(*tensors.back());
  }
  return inputs;
}

// Copies every tensor output (an output may alias an arena the next call reuses).
std::vector<Output> copy_outputs(const std::vector<EValue>& result) {
  std::vector<Output> outputs;
  for (const EValue& v : result) {
    if (!v.isTensor()) continue;
    const auto& out = v.toTensor();
    const uint8_t* p = static_cast<const uint8_t*>(out.const_data_ptr());
    outputs.push_back(Output{out.scalar_type(),
                             std::vector<int64_t>(out.sizes().begin(), out.sizes().end()),
                             std::vector<uint8_t>(p, p + out.nbytes())});
  }
  return outputs;
}

// The distinct methods of a program's calls, in first-call order.
std::vector<std::string> call_methods(const Program& p) {
  std::vector<std::string> methods;
  for (const Call& c : p.calls) {
    if (std::find(methods.begin(), methods.end(), c.method) == methods.end()) {
      methods.push_back(c.method);
    }
  }
  return methods;
}

Launch launch(const Options& o, const Program& p, std::unique_ptr<Module>& keep) {
  Launch r;
  auto io_before = proc_io();
  struct rusage usage_before {};
  getrusage(RUSAGE_THREAD, &usage_before);
  const double cpu_before = thread_cpu_ms();
  auto started = std::chrono::steady_clock::now();
  auto mode = o.mmap ? Module::LoadMode::Mmap : Module::LoadMode::File;
  // Methods called in sequence share ExecuTorch's arenas (mem_id 1, activations, and 2, the
  // mutable buffers that share_mutable_buffers plans there): without it, each method has its own
  // copy of a buffer another method writes, and reads zeros.
  const std::vector<std::string> methods =
      p.calls.empty() ? std::vector<std::string>{p.method} : call_methods(p);
  r.share_arenas = p.share_arenas.value_or(methods.size() > 1);
  keep = std::make_unique<Module>(p.path, p.data, mode, nullptr, nullptr, nullptr, r.share_arenas);
  Module& module = *keep;

  executorch::runtime::BackendOptions<6> backend_options;
  if (!o.weight_cache) backend_options.set_option("weight_cache_enabled", false);
  if (!o.cache.empty()) {
    backend_options.set_option("weight_cache_enabled", o.weight_cache);
    backend_options.set_option("packed_cache_path", o.cache.c_str());
  }
  if (!o.cache_layers.empty()) {
    if (o.cache_layers.size() >= executorch::runtime::kMaxOptionValueLength) {
      fail("--cache-layers is longer than an ExecuTorch option value (" +
           std::to_string(executorch::runtime::kMaxOptionValueLength - 1) + " bytes)");
    }
    backend_options.set_option("packed_cache_layers", o.cache_layers.c_str());
  }
  if (o.workspace_sharing >= 0) {
    backend_options.set_option("workspace_sharing_mode", o.workspace_sharing);
  }
  if (o.verify_on_load) backend_options.set_option("verify_on_load", true);
  executorch::runtime::LoadBackendOptionsMap options_map;
  if (options_map.set_options("XnnpackBackend", backend_options.view()) != Error::Ok) {
    fail("cannot set the backend options");
  }
  Error e = module.load(options_map);
  if (e != Error::Ok) fail("loading " + p.path + ": " + error_text(e));
  for (const std::string& m : methods) {
    e = module.load_method(m, nullptr, nullptr, &options_map);
    if (e != Error::Ok) fail("loading method " + m + ": " + error_text(e));
  }
  r.load_to_ready_ms = ms_since(started);
  struct rusage usage_after {};
  getrusage(RUSAGE_THREAD, &usage_after);
  r.load_minor_faults = usage_after.ru_minflt - usage_before.ru_minflt;
  r.load_cpu_ms = thread_cpu_ms() - cpu_before;
  auto io_after = proc_io();
  r.load_rchar = io_after["rchar"] - io_before["rchar"];
  r.load_read_bytes = io_after["read_bytes"] - io_before["read_bytes"];
  r.load_rss_anon_kib = status_kib("RssAnon");
  r.load_rss_file_kib = status_kib("RssFile");
  r.load_unnamed_threads = unnamed_threads();

  if (!p.calls.empty()) {
    for (const Call& call : p.calls) {
      auto meta = module.method_meta(call.method);
      if (!meta.ok()) fail("method " + call.method + ": " + error_text(meta.error()));
      for (int step = 0; step < call.times; ++step) {
        std::vector<std::vector<uint8_t>> storage;
        std::vector<executorch::extension::TensorPtr> tensors;
        auto inputs = make_inputs(call.method, *meta, call.inputs, step, storage, tensors);
        auto t = std::chrono::steady_clock::now();
        auto result = module.execute(call.method, inputs);
        double took = ms_since(t);
        if (!result.ok()) fail("executing " + call.method + ": " + error_text(result.error()));
        if (r.execute_ms.empty()) r.first_execute_ms = took;
        r.execute_ms.push_back(took);
        r.steps.push_back(copy_outputs(*result));
        r.calls.push_back(call.method + " " + std::to_string(step) + " " + std::to_string(took));
      }
    }
    return r;
  }
  auto meta = module.method_meta(p.method);
  if (!meta.ok()) fail("method " + p.method + ": " + error_text(meta.error()));
  for (int step = 0; step < o.steps; ++step) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<executorch::extension::TensorPtr> tensors;
    auto inputs = make_inputs(p.method, *meta, p.inputs, step, storage, tensors);
    std::vector<Output> outputs;
    for (int rep = 0; rep < (step == 0 ? o.repeat : 1); ++rep) {
      if (rep > 0 && o.wait_between_executes) {
        std::fprintf(stderr, "waiting for a line on stdin before execute %d\n", rep + 1);
        std::fflush(stderr);
        std::string line;
        std::getline(std::cin, line);
      }
      struct rusage usage_before {};
      getrusage(RUSAGE_THREAD, &usage_before);
      auto t = std::chrono::steady_clock::now();
      auto result = module.execute(p.method, inputs);
      double took = ms_since(t);
      if (!result.ok()) fail("executing " + p.method + ": " + error_text(result.error()));
      if (step == 0 && rep == 0) {
        r.first_execute_ms = took;
        struct rusage usage_after {};
        getrusage(RUSAGE_THREAD, &usage_after);
        r.first_execute_minor_faults = usage_after.ru_minflt - usage_before.ru_minflt;
      }
      r.execute_ms.push_back(took);
      if (rep == 0) outputs = copy_outputs(*result);
    }
    r.steps.push_back(std::move(outputs));
  }
  return r;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d) s += (d ? "x" : "") + std::to_string(shape[d]);
  return s + "]";
}

// Prints one program's launch (key=value lines, the first program's without a prefix) and
// writes its outputs.
void report(const Options& o, size_t p, const Launch& r) {
  std::string prefix = p > 0 ? "p" + std::to_string(p) + "." : "";
  std::printf("%sprogram=%s\n", prefix.c_str(), o.programs[p].path.c_str());
  std::printf("%sload_mode=%s\n", prefix.c_str(), o.mmap ? "mmap" : "file");
  std::printf("%sload_to_ready_ms=%.3f\n", prefix.c_str(), r.load_to_ready_ms);
  std::vector<double> sorted = r.execute_ms;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {  // --steps 0 loads only
    std::printf("%sfirst_execute_ms=%.3f\n", prefix.c_str(), r.first_execute_ms);
    std::printf("%sexecute_ms=%.3f\n", prefix.c_str(), sorted[sorted.size() / 2]);
  }
  std::printf("%sload_rchar=%llu\n", prefix.c_str(), r.load_rchar);
  std::printf("%sload_read_bytes=%llu\n", prefix.c_str(), r.load_read_bytes);
  std::printf("%sload_minor_faults=%ld\n", prefix.c_str(), r.load_minor_faults);
  std::printf("%sload_cpu_ms=%.3f\n", prefix.c_str(), r.load_cpu_ms);
  std::printf("%sfirst_execute_minor_faults=%ld\n", prefix.c_str(), r.first_execute_minor_faults);
  std::printf("%sload_rss_anon_kib=%ld\n", prefix.c_str(), r.load_rss_anon_kib);
  std::printf("%sload_rss_file_kib=%ld\n", prefix.c_str(), r.load_rss_file_kib);
  std::printf("%sload_unnamed_threads=%d\n", prefix.c_str(), r.load_unnamed_threads);
  std::printf("%sshare_memory_arenas=%d\n", prefix.c_str(), r.share_arenas ? 1 : 0);
  for (size_t c = 0; c < r.calls.size(); ++c) {
    // "call step=S method=M iteration=I ms=T": which method each step's outputs came from.
    std::stringstream fields(r.calls[c]);
    std::string method, iteration, ms;
    fields >> method >> iteration >> ms;
    std::printf("%scall step=%zu method=%s iteration=%s ms=%s\n", prefix.c_str(), c,
                method.c_str(), iteration.c_str(), ms.c_str());
  }
  for (size_t s = 0; s < r.steps.size(); ++s) {
    for (size_t j = 0; j < r.steps[s].size(); ++j) {
      const Output& out = r.steps[s][j];
      std::string name = (p > 0 ? "p" + std::to_string(p) + "." : std::string()) +
                         (r.steps.size() > 1 ? "step" + std::to_string(s) + "." : std::string()) +
                         "output" + std::to_string(j) + "." + short_name(out.dtype);
      std::string file;
      if (!o.output_dir.empty()) {
        file = o.output_dir + "/" + name;
        std::ofstream f(file, std::ios::binary);
        f.write(reinterpret_cast<const char*>(out.bytes.data()),
                static_cast<std::streamsize>(out.bytes.size()));
        if (!f) fail("cannot write " + file);
      }
      std::printf("output program=%zu step=%zu index=%zu dtype=%s shape=%s file=%s\n", p, s, j,
                  short_name(out.dtype), shape_text(out.shape).c_str(),
                  file.empty() ? "-" : file.c_str());
    }
  }
}

int run(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::string library = backend_library(o.backend);
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) fail("cannot load the backend " + library + ": " + dlerror());
  using Registered = bool (*)();
  auto registered = reinterpret_cast<Registered>(dlsym(handle, "xnnblob_executorch_registered"));
  if (registered != nullptr && !registered()) {
    fail(library + " did not register XnnpackBackend (another XNNPACK backend was first)");
  }

  // Per thread, per program. Modules stay loaded until every program has run, so programs
  // sharing weights are in the process together.
  std::vector<std::vector<Launch>> launches(static_cast<size_t>(o.threads));
  std::vector<std::string> errors(launches.size());
#if defined(ET_USE_THREADPOOL)
  if (o.pool_threads > 0) {
    executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(
        static_cast<uint32_t>(o.pool_threads));
  }
#else
  if (o.pool_threads > 0 || o.no_pool) fail("this ExecuTorch runtime has no thread pool");
#endif
  auto one = [&](size_t t) {
#if defined(ET_USE_THREADPOOL)
    std::optional<executorch::extension::threadpool::NoThreadPoolGuard> guard;
    if (o.no_pool) guard.emplace();
#endif
    std::vector<std::unique_ptr<Module>> modules(o.programs.size());
    try {
      for (size_t p = 0; p < o.programs.size(); ++p) {
        launches[t].push_back(launch(o, o.programs[p], modules[p]));
      }
    } catch (const Failure& f) {
      errors[t] = f.what;
    }
  };
  if (o.threads == 1) {
    one(0);
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < launches.size(); ++t) pool.emplace_back(one, t);
    for (auto& th : pool) th.join();
  }
  for (size_t t = 0; t < errors.size(); ++t) {
    if (!errors[t].empty()) fail((o.threads > 1 ? "thread " + std::to_string(t) + ": " : "") + errors[t]);
  }
  for (size_t t = 1; t < launches.size(); ++t) {
    for (size_t p = 0; p < o.programs.size(); ++p) {
      const Launch& r = launches[0][p];
      const Launch& other = launches[t][p];
      bool same = other.steps.size() == r.steps.size();
      for (size_t s = 0; same && s < r.steps.size(); ++s) {
        same = other.steps[s].size() == r.steps[s].size();
        for (size_t j = 0; same && j < r.steps[s].size(); ++j) {
          same = other.steps[s][j].bytes == r.steps[s][j].bytes;
        }
      }
      if (!same) fail("thread " + std::to_string(t) + "'s outputs differ from thread 0's");
    }
  }

  std::printf("backend=%s\n", library.c_str());
  std::printf("peak_rss_kib=%ld\n", peak_rss_kib());
  std::printf("rss_anon_kib=%ld\n", status_kib("RssAnon"));
  std::printf("rss_file_kib=%ld\n", status_kib("RssFile"));
  std::printf("threads=%d\n", o.threads);
  std::printf("own_pool_threads=%d\n", threads_named("xnnblob-pool"));
  for (size_t p = 0; p < o.programs.size(); ++p) {
    report(o, p, launches[0][p]);
  }
  using Report = size_t (*)(char*, size_t);
  if (auto report = reinterpret_cast<Report>(dlsym(handle, "xnnblob_executorch_cache_report"))) {
    std::vector<char> text(report(nullptr, 0) + 1);
    report(text.data(), text.size());
    std::printf("%s\n", text.data());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

extern "C" int xnnblob_et_run_main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Failure& f) {
    std::fprintf(stderr, "xnnblob-et-run: %s\n", f.what.c_str());
    if (f.usage) std::fputs(kUsage, stderr);
    return f.usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xnnblob-et-run: %s\n", e.what());
    return 1;
  }
}
