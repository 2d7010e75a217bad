//===- Module.cpp - torchneuron._C: compiler pipeline and runtime ---------===//
//
// The Python side hands over FX graph documents and tensors as raw host
// pointers (contiguous, owned by Python for the duration of the call); it
// gets back compiled kernels that run on the engine model. No libtorch.
//
//===----------------------------------------------------------------------===//

#include "compiler/importer/FxImporter.h"
#include "compiler/pipeline/Pipeline.h"
#include "passes/flex_attention/FlexAttentionLowering.h"
#include "runtime/exec/CollectiveHandler.h"
#include "runtime/exec/Executor.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"
#include "runtime/timing/TimingModel.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

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
      {"float32", runtime::DType::F32},
      {"bfloat16", runtime::DType::BF16},
      {"float16", runtime::DType::F16},
      {"int32", runtime::DType::I32},
      {"int64", runtime::DType::I64},
      {"int8", runtime::DType::I8},
      {"uint8", runtime::DType::U8},
      {"bool", runtime::DType::Bool},
      {"float8_e4m3fn", runtime::DType::F8E4M3FN},
      {"float8_e5m2", runtime::DType::F8E5M2}};
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

/// A verified program with its executor; what a compiled graph calls. The
/// executor (its buffers: most of a load's time, zero-filled pages) is made at
/// the first run, so a program loaded from the compile cache is ready sooner
/// and one never run holds no buffers.
class Kernel {
public:
  Kernel(runtime::Program program, const target::Target &target)
      : program(std::move(program)), target(target) {
    this->program.verify(this->target);
  }

  void run(const std::vector<BufferArg> &inputs,
           const std::vector<BufferArg> &outputs,
           const std::optional<py::capsule> &collectives) {
    const runtime::CollectiveHandler *handler = nullptr;
    if (collectives) {
      if (std::string(collectives->name()) !=
          runtime::CollectiveHandler::kCapsuleName)
        throw py::type_error("collectives: not a CollectiveHandler capsule");
      handler = collectives->get_pointer<runtime::CollectiveHandler>();
    }
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
    if (!executor)
      executor = std::make_unique<runtime::Executor>(program, target);
    executor->run(in, out, handler);
  }

  /// The modeled timeline, computed on first use: runs that are not
  /// profiled never pay for it.
  const runtime::Timeline &timeline(bool withEvents) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!cachedTimeline || (withEvents && !cachedHasEvents)) {
      cachedTimeline = runtime::simulate(program, target, withEvents);
      cachedHasEvents = withEvents;
    }
    return *cachedTimeline;
  }

  /// Op names of the static instructions, in pre-order (the timeline's
  /// `node` indexes this list).
  std::vector<std::string> instructionNames() const {
    std::vector<std::string> names;
    std::function<void(const std::vector<runtime::Node> &)> walk =
        [&](const std::vector<runtime::Node> &nodes) {
          for (const runtime::Node &n : nodes) {
            if (n.isLoop())
              walk(n.body);
            else
              names.push_back(runtime::opcodeName(n.inst.op));
          }
        };
    walk(program.body);
    return names;
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
  std::optional<runtime::Timeline> cachedTimeline;
  bool cachedHasEvents = false;
};

/// A size-generic program (docs/PROGRAM_FORMAT.md, "Size parameters"): one
/// compile serving every size in its params' ranges. Each tuple of sizes gets
/// its own Kernel, parsed from the program's text; the caller keeps the ones it
/// reuses (each holds an executor's scratch memory).
class GenericKernel {
public:
  GenericKernel(std::string json, std::vector<runtime::SizeParam> params,
                const target::Target &target)
      : json(std::move(json)), params(std::move(params)), target(target) {}

  std::shared_ptr<Kernel> instance(const runtime::SizeEnv &sizes) const {
    runtime::Program program;
    {
      py::gil_scoped_release release;
      program = runtime::Program::parse(json, &sizes);
    }
    return std::make_shared<Kernel>(std::move(program), target);
  }

  const std::string json;
  const std::vector<runtime::SizeParam> params;
  const target::Target &target;
};

/// A Kernel, or a GenericKernel when the program has size parameters.
py::object loadKernel(std::string json, const target::Target &target) {
  // Most programs are static: look for the field before parsing for it.
  std::vector<runtime::SizeParam> params;
  if (json.find("\"params\"") != std::string::npos)
    params = runtime::Program::readParams(json);
  if (params.empty())
    return py::cast(
        std::make_shared<Kernel>(runtime::Program::parse(json), target));
  return py::cast(std::make_shared<GenericKernel>(std::move(json),
                                                  std::move(params), target));
}

py::dict timelineSummary(const runtime::Timeline &t) {
  py::dict d;
  d["device_ns"] = t.totalNs;
  d["engine_busy_ns"] = t.engineBusyNs;
  d["bound"] = t.bound;
  d["flops"] = t.flops;
  d["hbm_bytes"] = t.hbmBytes;
  d["hbm_bytes_read"] = t.hbmBytesRead;
  d["hbm_bytes_written"] = t.hbmBytesWritten;
  d["dma_bytes"] = t.dmaBytes;
  d["instructions"] = t.instructions;
  d["psum_eviction_ns"] = t.psumEvictionNs;
  d["tensor_throttle_ns"] = t.tensorThrottleNs;
  d["activation_table_ns"] = t.activationTableNs;
  return d;
}

/// Runs `compile` for `targetName` without the GIL and loads its program (a
/// Kernel or GenericKernel); a failed compile raises CompileFailure with its
/// diagnostics.
py::object compileToKernel(const std::string &targetName,
                           const std::string &dumpDir,
                           const std::function<compiler::CompileResult(
                               const compiler::CompileOptions &)> &compile) {
  const target::Target &target = target::getTarget(targetName);
  compiler::CompileResult result;
  {
    py::gil_scoped_release release;
    compiler::CompileOptions options;
    options.target = targetName;
    options.dumpDir = dumpDir;
    result = compile(options);
  }
  if (!result.ok)
    throw CompileFailure(result.error);
  return loadKernel(std::move(result.program), target);
}

} // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchNeuron compiler pipeline and engine-model runtime";
  py::register_exception<CompileFailure>(m, "CompileError", PyExc_RuntimeError);
  auto deviceError = py::register_exception<runtime::Error>(m, "DeviceError",
                                                            PyExc_RuntimeError);
  // Registered after its base, so that it is the translation tried first.
  py::register_exception<runtime::IndexError>(
      m, "DeviceIndexError",
      py::make_tuple(deviceError, py::handle(PyExc_IndexError)));

  m.def("targets", &target::targetNames, "Names of the available targets.");
  m.def(
      "target_peaks",
      [](const std::string &name) {
        const target::Target &t = target::getTarget(name);
        py::dict d;
        d["flops"] = t.peakFlopsPerSecond();
        d["fp8_flops"] = t.peakFlopsPerSecond() * t.matmulFp8KFactor();
        if (int64_t mx = t.matmulMxKFactor())
          d["mxfp8_flops"] = t.peakFlopsPerSecond() * mx;
        d["hbm_bytes"] = t.peakHbmBytesPerSecond();
        return d;
      },
      py::arg("target"),
      "Peak bf16 (and fp8, MXFP8 where the chip has it) FLOP/s and HBM "
      "bytes/s of one core.");

  m.def(
      "target_memory",
      [](const std::string &name) {
        const target::Target &t = target::getTarget(name);
        py::dict d;
        d["partitions"] = t.partitions;
        d["sbuf_bytes_per_partition"] = t.sbufBytesPerPartition;
        d["psum_bytes_per_partition"] = t.psumBytesPerPartition;
        d["psum_bank_bytes"] = t.psumBankBytes;
        return d;
      },
      py::arg("target"),
      "On-chip memory of one core: partitions and SBUF/PSUM bytes per "
      "partition a program may allocate.");

  // The attention kernels' block classes, for the Python front end
  // (torchneuron.attention_blocks): one definition, the kernels'. (Their
  // unit is the target's partitions: target_memory.)
  namespace flex = mlir::neuron::flex;
  py::dict blockClasses;
  blockClasses["masked"] = static_cast<int>(flex::Kind::masked);
  blockClasses["partial"] = static_cast<int>(flex::Kind::partial);
  blockClasses["full"] = static_cast<int>(flex::Kind::full);
  m.attr("FLEX_BLOCK_CLASSES") = blockClasses;
  // The importer's limits on top-k and sort (torchneuron.decompositions).
  py::dict maxSelect;
  maxSelect["row"] = compiler::kMaxSelectRow;
  maxSelect["work"] = compiler::kMaxSelectWork;
  m.attr("MAX_SELECT") = maxSelect;

  m.def(
      "check_graph",
      [](const std::string &document) {
        py::gil_scoped_release release;
        return compiler::checkFxGraph(document);
      },
      py::arg("document"),
      "Node name -> why it cannot run on the device (empty: all can).");

  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel")
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
      .def_property_readonly("program_json",
                             [](const Kernel &k) { return k.program.toJson(); })
      .def("run", &Kernel::run, py::arg("inputs"), py::arg("outputs"),
           py::arg("collectives") = py::none(),
           "Runs the kernel; each buffer is (data_ptr, dtype name, shape). "
           "Collective instructions run through `collectives` (a "
           "CollectiveHandler capsule, torchneuron._distributed).")
      .def_property_readonly(
          "has_collectives",
          [](const Kernel &k) { return k.program.hasCollectives(); })
      .def_property_readonly(
          "locations", [](const Kernel &k) { return k.program.locations; },
          "Python source lines (file:line) instructions came from.")
      .def_property_readonly("instruction_names", &Kernel::instructionNames)
      .def(
          "timeline",
          [](Kernel &k) {
            py::gil_scoped_release release;
            const runtime::Timeline &t = k.timeline(false);
            py::gil_scoped_acquire acquire;
            return timelineSummary(t);
          },
          "Modeled device time of one run and why (computed once).")
      .def(
          "timeline_events",
          [](Kernel &k) {
            const runtime::Timeline *t;
            {
              py::gil_scoped_release release;
              t = &k.timeline(true);
            }
            py::list events;
            for (const runtime::InstructionTiming &e : t->events)
              events.append(py::make_tuple(
                  e.node, runtime::timingUnitName(e.unit), e.queue,
                  e.queueCount, e.startNs, e.endNs, e.loc));
            return events;
          },
          "(node, unit, queue, queue_count, start_ns, end_ns, loc) per "
          "event of one run, in program order.");

  py::class_<GenericKernel, std::shared_ptr<GenericKernel>>(m, "GenericKernel")
      .def_property_readonly(
          "params",
          [](const GenericKernel &k) {
            py::list out;
            for (const runtime::SizeParam &p : k.params)
              out.append(py::make_tuple(p.name, p.min, p.max));
            return out;
          },
          "(name, min, max or None) of each size parameter.")
      .def_property_readonly(
          "target", [](const GenericKernel &k) { return k.target.name; })
      .def_property_readonly("program_json",
                             [](const GenericKernel &k) { return k.json; })
      .def("instance", &GenericKernel::instance, py::arg("sizes"),
           "The Kernel of the program at `sizes` (name -> value), verified; "
           "DeviceError when a size is missing or outside its range.");

  m.def(
      "compile_graph",
      [](const std::string &document, const std::string &targetName,
         const std::string &dumpDir) {
        return compileToKernel(
            targetName, dumpDir, [&](const compiler::CompileOptions &options) {
              return compiler::compileFxGraph(document, options);
            });
      },
      py::arg("document"), py::arg("target") = "trn2", py::arg("dump_dir") = "",
      "Compiles an FX graph document into a kernel for `target`.");

  m.def(
      "compile_kernel",
      [](const std::string &text, const std::string &name,
         const std::string &targetName, const std::string &dumpDir) {
        return compileToKernel(
            targetName, dumpDir, [&](const compiler::CompileOptions &options) {
              return compiler::compileKernelText(text, name, options);
            });
      },
      py::arg("text"), py::arg("name") = "kernel", py::arg("target") = "trn2",
      py::arg("dump_dir") = "",
      "Compiles a `nisa` kernel module (MLIR text, e.g. a traced NKI kernel) "
      "from allocation on into a kernel for `target`.");

  m.def(
      "load_program",
      [](std::string json, const std::string &targetName) {
        return loadKernel(std::move(json), target::getTarget(targetName));
      },
      py::arg("program"), py::arg("target") = "trn2",
      "Loads and verifies a kernel program (JSON): a Kernel, or a "
      "GenericKernel when it has size parameters.");
}
