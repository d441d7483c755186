// tests/op_library/scripted_ops.cpp: an op library whose static initializer follows a script read
// from the environment variable OPREG_SCRIPT_<OPREG_SCRIPT_NAME>, for the tests of loads that race
// other threads, nest, or bring in other libraries (tests/python/test_reliability_loads.py).
// Built several times under other names (scripted_a, scripted_b, ...); opreg_scripted_run runs a
// script later, outside the load. A script is a list of
// steps separated by ';':
//   def:NAME:K      define opreg_script::NAME(Tensor x) -> Tensor as x + K, with a kernel that
//                   follows the accelerated device types (and one of its own for the CPU)
//   rep:NAME:K      the same, replacing the op
//   defin:NS:NAME:K the same in the namespace NS (NS::NAME)
//   undef:NAME      undefine opreg_script::NAME
//   devtype:TYPE    register TYPE as an accelerated device type
//   wait:FILE       wait (at most 20 s) until FILE exists: other threads act meanwhile
//   sleep:MS        sleep MS milliseconds
//   loadlib:PATH    opreg::load_library(PATH)
//   dlopen:PATH     a plain dlopen(PATH)
//   touch:FILE      create FILE (tells a test that the script got here)
//   bundle:DIR,MANIFEST,FILE...
//                   register an embedded Triton bundle, as generated sources do: the manifest
//                   and binaries read from the folder DIR
//   bad             a definition with a bad schema: the load fails
#include <ATen/ATen.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <opreg/opreg.h>
#include <opreg/triton.h>

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) parts.push_back(part);
  return parts;
}

void define_plus(const std::string& qualified, double k, bool replace) {
  opreg::op(qualified + "(Tensor x) -> Tensor")
      .fallback([k](const at::Tensor& x) { return x + k; })
      .kernel([k](const at::Tensor& x) { return x + k; },
              opreg::KernelOptions<>().name("accelerated"))
      .kernel([k](const at::Tensor& x) { return x + k; }, opreg::on({"cpu"}).name("on_cpu"))
      .replace(replace)
      .define();
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// register_embedded_bundle copies what it registers (a generated source's arrays are static).
void register_bundle(const std::vector<std::string>& parts) {
  const std::string& folder = parts.at(0);
  const std::string manifest = read_file(folder + "/" + parts.at(1));
  std::vector<std::string> binaries;
  for (size_t i = 2; i < parts.size(); ++i) binaries.push_back(read_file(folder + "/" + parts[i]));
  std::vector<opreg::triton::EmbeddedFile> files;
  for (size_t i = 2; i < parts.size(); ++i) {
    const std::string& binary = binaries[i - 2];
    files.push_back(
        {parts[i].c_str(), reinterpret_cast<const unsigned char*>(binary.data()), binary.size()});
  }
  opreg::triton::register_embedded_bundle(manifest.data(), manifest.size(), files.data(),
                                          files.size());
}

void run_step(const std::string& step) {
  const auto parts = split(step, ':');
  const std::string& action = parts.at(0);
  const std::string argument = step.size() > action.size() ? step.substr(action.size() + 1) : "";
  if (action == "def" || action == "rep") {
    define_plus("opreg_script::" + parts.at(1), std::stod(parts.at(2)), action == "rep");
  } else if (action == "defin") {
    define_plus(parts.at(1) + "::" + parts.at(2), std::stod(parts.at(3)), false);
  } else if (action == "undef") {
    opreg::undefine("opreg_script::" + argument);
  } else if (action == "devtype") {
    opreg::register_accelerated_device_type(argument);
  } else if (action == "wait") {
    for (int i = 0; i < 2000 && !std::ifstream(argument).good(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } else if (action == "sleep") {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(argument)));
  } else if (action == "loadlib") {
    opreg::load_library(argument);
  } else if (action == "dlopen") {
    dlopen(argument.c_str(), RTLD_NOW | RTLD_LOCAL);
  } else if (action == "bundle") {
    register_bundle(split(argument, ','));
  } else if (action == "touch") {
    std::ofstream(argument) << "here";
  } else if (action == "bad") {
    opreg::op("opreg_script::bad(Tensor x, Tensr y) -> Tensor")
        .fallback([](const at::Tensor& x) { return x; })
        .define();
  } else {  // a mistake in a test's script: the test must fail, not pass without the step
    std::fprintf(stderr, "scripted_ops: unknown step '%s'\n", step.c_str());
    std::abort();
  }
}

void run_script(const std::string& script) {
  for (const auto& step : split(script, ';')) {
    if (!step.empty()) run_step(step);
  }
}

const bool scripted = [] {
  const char* script = std::getenv("OPREG_SCRIPT_" OPREG_SCRIPT_NAME);
  if (script != nullptr) run_script(script);
  return script != nullptr;
}();

}  // namespace

// Runs a script outside any load (from ctypes): 0, or 1 when a step threw.
extern "C" __attribute__((visibility("default"))) int opreg_scripted_run(const char* script) {
  try {
    run_script(script);
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

// scripted_needy links scripted_dep and uses this symbol of it, so that the dynamic loader loads
// scripted_dep (running its script) before scripted_needy.
#if defined(OPREG_SCRIPT_IS_DEP)
extern "C" int opreg_scripted_dep_marker() { return 1; }
#elif defined(OPREG_SCRIPT_NEEDS_DEP)
extern "C" int opreg_scripted_dep_marker();
extern "C" int opreg_scripted_needy_marker() { return opreg_scripted_dep_marker(); }
#endif
