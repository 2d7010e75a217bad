//===- Module.cpp - torchneuron._C: compiler pipeline and runtime ---------===//
//
// The Python side hands over FX graph documents and tensors as raw host
// pointers (contiguous, owned by Python for the duration of the call); it
// gets back compiled kernels that run on the engine model. No libtorch.
//
//===----------------------------------------------------------------------===//

#include "compiler/pipeline/Pipeline.h"
#include "runtime/exec/Executor.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>

namespace py = pybind11;
using namespace neuron;

namespace {

/// A graph that the pipeline could not compile; the message has the
/// diagnostics with the user's source lines.
struct CompileFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// torch dtype names (as the FX document writes them) <-> program dtypes.
const std::map<std::string, runtime::DType> &torchDTypes() {
  static const std::map<std::string, runtime::DType> names = {
      {"float32", runtime::DType::F32}, {"bfloat16", runtime::DType::BF16},
      {"float16", runtime::DType::F16}, {"int32", runtime::DType::I32},
      {"int64", runtime::DType::I64},   {"int8", runtime::DType::I8},
      {"uint8", runtime::DType::U8},    {"bool", runtime::DType::Bool}};
  return names;
}

std::string torchName(runtime::DType dtype) {
  for (auto &[name, d] : torchDTypes())
    if (d == dtype)
      return name;
  return runtime::dtypeName(dtype);
}

using Spec = std::pair<std::string, std::vector<int64_t>>;
using BufferArg = std::tuple<uintptr_t, std::string, std::vector<int64_t>>;

/// A verified program with its executor; what a compiled graph calls.
class Kernel {
public:
  Kernel(runtime::Program program, const target::Target &target)
      : program(std::move(program)), target(target) {
    // The executor verifies the program against the target.
    executor = std::make_unique<runtime::Executor>(this->program, target);
  }

  void run(const std::vector<BufferArg> &inputs,
           const std::vector<BufferArg> &outputs) {
    auto convert = [](const std::vector<BufferArg> &args) {
      std::vector<runtime::HostTensor> tensors;
      for (auto &[ptr, dtype, shape] : args) {
        auto it = torchDTypes().find(dtype);
        if (it == torchDTypes().end())
          throw runtime::Error("unsupported dtype " + dtype);
        tensors.push_back({reinterpret_cast<void *>(ptr), it->second, shape});
      }
      return tensors;
    };
    auto in = convert(inputs), out = convert(outputs);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mutex); // scratch memory is per kernel
    executor->run(in, out);
  }

  std::vector<Spec> specs(const std::vector<int64_t> &ids) const {
    std::vector<Spec> out;
    for (int64_t id : ids) {
      const runtime::Buffer *buffer = program.findBuffer(id);
      out.push_back({torchName(buffer->dtype), buffer->shape});
    }
    return out;
  }

  runtime::Program program;
  const target::Target &target;

private:
  std::unique_ptr<runtime::Executor> executor;
  std::mutex mutex;
};

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchNeuron compiler pipeline and engine-model runtime";
  py::register_exception<CompileFailure>(m, "CompileError",
                                         PyExc_RuntimeError);
  py::register_exception<runtime::Error>(m, "DeviceError", PyExc_RuntimeError);

  m.def("targets", &target::targetNames, "Names of the available targets.");

  m.def(
      "check_graph",
      [](const std::string &document) {
        py::gil_scoped_release release;
        return compiler::checkFxGraph(document);
      },
      py::arg("document"),
      "Node name -> why it cannot run on the device (empty: all can).");

  py::class_<Kernel>(m, "Kernel")
      .def_property_readonly("name",
                             [](const Kernel &k) { return k.program.name; })
      .def_property_readonly("target",
                             [](const Kernel &k) { return k.target.name; })
      .def_property_readonly(
          "input_specs",
          [](const Kernel &k) { return k.specs(k.program.inputs); })
      .def_property_readonly(
          "output_specs",
          [](const Kernel &k) { return k.specs(k.program.outputs); })
      .def_property_readonly(
          "num_instructions",
          [](const Kernel &k) { return k.program.numInstructions(); })
      .def_property_readonly(
          "program_json", [](const Kernel &k) { return k.program.toJson(); })
      .def("run", &Kernel::run, py::arg("inputs"), py::arg("outputs"),
           "Runs the kernel; each buffer is (data_ptr, dtype name, shape).");

  m.def(
      "compile_graph",
      [](const std::string &document, const std::string &targetName,
         const std::string &dumpDir) {
        const target::Target &target = target::getTarget(targetName);
        compiler::CompileResult result;
        {
          py::gil_scoped_release release;
          compiler::CompileOptions options;
          options.target = targetName;
          options.dumpDir = dumpDir;
          result = compiler::compileFxGraph(document, options);
        }
        if (!result.ok)
          throw CompileFailure(result.error);
        return std::make_unique<Kernel>(runtime::Program::parse(result.program),
                                        target);
      },
      py::arg("document"), py::arg("target") = "trn2",
      py::arg("dump_dir") = "",
      "Compiles an FX graph document into a kernel for `target`.");

  m.def(
      "load_program",
      [](const std::string &json, const std::string &targetName) {
        return std::make_unique<Kernel>(runtime::Program::parse(json),
                                        target::getTarget(targetName));
      },
      py::arg("program"), py::arg("target") = "trn2",
      "Loads and verifies a kernel program (JSON).");
}
