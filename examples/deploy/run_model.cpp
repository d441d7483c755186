// examples/deploy/run_model.cpp: runs an AOTInductor package of a model that calls opreg ops in a
// C++ process without Python. It loads the op libraries (opreg's shipped ops, then each
// --library), runs the package on inputs saved by Python's torch.save, and saves the outputs for
// torch.load, printing which implementation served each opreg call of the first run. With --time N
// it also prints the median latency of N runs.
//
//   run_model PACKAGE INPUTS OUTPUTS [--library PATH]... [--time N]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <opreg/registry.h>
#include <opreg/trace.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>

namespace {

struct Arguments {
  std::string package, inputs, outputs;
  std::vector<std::string> libraries;
  int timed_runs = 0;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--library" || arg == "--time") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--library") {
        args.libraries.push_back(value);
      } else {
        size_t used = 0;
        int runs = -1;
        try {
          runs = std::stoi(value, &used);
        } catch (const std::exception&) {
        }
        if (used != value.size() || runs < 1) {
          throw std::invalid_argument("--time takes a number of runs (1 or more), got '" + value +
                                      "'");
        }
        args.timed_runs = runs;
      }
    } else if (arg.rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option or missing value: " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 3) {
    throw std::invalid_argument("expected PACKAGE INPUTS OUTPUTS, got " +
                                std::to_string(positional.size()) + " paths");
  }
  args.package = positional[0];
  args.inputs = positional[1];
  args.outputs = positional[2];
  return args;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

// The tensors of a list saved by torch.save([tensor, ...], path).
std::vector<at::Tensor> load_tensors(const std::string& path) {
  const c10::IValue value = torch::jit::pickle_load(read_file(path));
  if (!value.isList()) throw std::runtime_error(path + " does not hold a list of tensors");
  std::vector<at::Tensor> tensors;
  for (const c10::IValue& item : value.toListRef()) {
    if (!item.isTensor()) throw std::runtime_error(path + " holds a list item that is no tensor");
    tensors.push_back(item.toTensor());
  }
  return tensors;
}

void save_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  // A tuple of tensors, which torch.load reads with weights_only (a typed list it would not).
  std::vector<c10::IValue> items(tensors.begin(), tensors.end());
  for (c10::IValue& item : items) item = item.toTensor().cpu();
  const std::vector<char> data =
      torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
  std::ofstream file(path, std::ios::binary);
  file.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!file) throw std::runtime_error("cannot write " + path);
}

// Whether the Python runtime is mapped into this process (libpython, or torch's Python bindings).
bool python_in_process() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libpython") != std::string::npos ||
        line.find("libtorch_python") != std::string::npos) {
      return true;
    }
  }
  return false;
}

double median_ms_per_run(torch::inductor::AOTIModelPackageLoader& loader,
                         const std::vector<at::Tensor>& inputs, int runs) {
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto outputs = loader.run(inputs);
    if (outputs.front().is_cuda()) outputs.front().cpu();  // waits for the device
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Arguments args = parse(argc, argv);
    // 1. The ops the package calls: they must be defined before it runs.
    opreg::load_library(OPREG_OPS_LIBRARY);
    for (const std::string& library : args.libraries) opreg::load_library(library);

    // 2. Run the package and save what it returns.
    torch::inductor::AOTIModelPackageLoader loader(args.package);
    const std::vector<at::Tensor> inputs = load_tensors(args.inputs);
    std::vector<at::Tensor> outputs;
    {
      opreg::TraceScope trace;  // which implementation served each opreg call
      outputs = loader.run(inputs);
      for (const opreg::TraceRecord& call : trace.records()) {
        std::cout << "run_model: " << call.op << " on " << call.device << ": " << call.impl << "\n";
      }
    }
    save_tensors(args.outputs, outputs);
    std::cout << "run_model: " << outputs.size() << " outputs written to " << args.outputs
              << "; Python in this process: " << (python_in_process() ? "yes" : "no") << "\n";

    if (args.timed_runs > 0) {
      std::cout << "run_model: median " << median_ms_per_run(loader, inputs, args.timed_runs)
                << " ms per run over " << args.timed_runs << " runs\n";
    }
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "run_model: " << error.what_without_backtrace() << "\n";
    if (error.msg().find("Could not find schema") != std::string::npos) {
      std::cerr << "run_model: the package calls an op no loaded library defines; load the "
                   "library that defines it with --library PATH\n";
    }
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "run_model: " << error.what() << "\n";
    return 1;
  }
}
