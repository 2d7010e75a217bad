//===- TestUtil.h - Helpers for runtime unit tests --------------*- C++ -*-===//

#ifndef NEURON_TESTS_UNIT_TESTUTIL_H
#define NEURON_TESTS_UNIT_TESTUTIL_H

#include "runtime/exec/Executor.h"
#include "runtime/exec/Numerics.h"
#include "runtime/program/Program.h"
#include "runtime/target/Target.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace neuron::test {

/// Runs fn and returns the message of the neuron::runtime::Error it throws,
/// "<no error>" if it returns normally, or "<other exception: ...>" for any
/// other exception type (which tests treat as a failure).
template <typename Fn> std::string errorOf(Fn &&fn) {
  try {
    fn();
  } catch (const neuron::runtime::Error &e) {
    return e.what();
  } catch (const std::exception &e) {
    return std::string("<other exception: ") + e.what() + ">";
  } catch (...) {
    return "<other exception>";
  }
  return "<no error>";
}

inline bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

/// Wraps buffers/inputs/outputs/body (JSON fragments) into a program.
inline std::string programJson(const std::string &buffers,
                               const std::string &inputs,
                               const std::string &outputs,
                               const std::string &body,
                               const std::string &target = "trn2",
                               const std::string &locations = "[]") {
  return R"({"format": "torchneuron-kernel-program", "version": 1,
             "name": "test", "target": ")" +
         target + R"(", "buffers": [)" + buffers + R"(], "inputs": [)" +
         inputs + R"(], "outputs": [)" + outputs + R"(], "locations": )" +
         locations + R"(, "body": [)" + body + "]}";
}

/// `program` (a programJson document) with "sync": "explicit".
inline std::string explicitSync(const std::string &program) {
  return "{\"sync\": \"explicit\", " + program.substr(1);
}

/// `program` (a programJson document) with "groups": `groups` (a JSON
/// array of {"name", "ranks"}).
inline std::string withGroups(const std::string &program,
                              const std::string &groups) {
  return "{\"groups\": " + groups + ", " + program.substr(1);
}

/// `inst` (an instruction JSON object) with "waits": `waits` (a JSON array).
inline std::string withWaits(const std::string &inst,
                             const std::string &waits) {
  return "{\"waits\": " + waits + ", " + inst.substr(1);
}

/// A view JSON fragment: {"buf": b, "offset": {...}, "shape": s,
/// "strides": t}. `terms` is a JSON array of [iv, coeff] pairs.
inline std::string view(int buf, const std::string &shape,
                        const std::string &strides, int64_t offset = 0,
                        const std::string &terms = "[]") {
  return R"({"buf": )" + std::to_string(buf) + R"(, "offset": {"const": )" +
         std::to_string(offset) + R"(, "terms": )" + terms + R"(}, "shape": )" +
         shape + R"(, "strides": )" + strides + "}";
}

inline std::string buffer(int id, const std::string &space,
                          const std::string &kind, const std::string &dtype,
                          const std::string &shape,
                          const std::string &extra = "") {
  return R"({"id": )" + std::to_string(id) + R"(, "name": "b)" +
         std::to_string(id) + R"(", "space": ")" + space + R"(", "kind": ")" +
         kind + R"(", "dtype": ")" + dtype + R"(", "shape": )" + shape + extra +
         "}";
}

inline std::string base64(const void *data, size_t size) {
  static const char chars[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto *bytes = static_cast<const uint8_t *>(data);
  std::string out;
  for (size_t i = 0; i < size; i += 3) {
    uint32_t word = bytes[i] << 16;
    if (i + 1 < size)
      word |= bytes[i + 1] << 8;
    if (i + 2 < size)
      word |= bytes[i + 2];
    out += chars[(word >> 18) & 63];
    out += chars[(word >> 12) & 63];
    out += i + 1 < size ? chars[(word >> 6) & 63] : '=';
    out += i + 2 < size ? chars[word & 63] : '=';
  }
  return out;
}

template <typename T>
neuron::runtime::HostTensor host(std::vector<T> &data,
                                 neuron::runtime::DType dtype,
                                 std::vector<int64_t> shape) {
  return neuron::runtime::HostTensor{data.data(), dtype, std::move(shape)};
}

inline std::vector<uint16_t> toBf16(const std::vector<float> &values) {
  std::vector<uint16_t> out;
  for (float v : values)
    out.push_back(neuron::runtime::f32ToBf16Bits(v));
  return out;
}

inline const neuron::target::Target &trn2() {
  return neuron::target::getTarget("trn2");
}

/// Parses, verifies and runs a program once.
inline void
runProgram(const std::string &json,
           const std::vector<neuron::runtime::HostTensor> &inputs,
           const std::vector<neuron::runtime::HostTensor> &outputs) {
  neuron::runtime::Program program = neuron::runtime::Program::parse(json);
  neuron::runtime::Executor executor(program,
                                     neuron::target::getTarget(program.target));
  executor.run(inputs, outputs);
}

/// A trn2 program of one valid instruction of `op` issued by `engine`, for
/// tests over the whole instruction set. The switch has no default: a new
/// opcode needs a sample here.
inline std::string sampleProgram(neuron::runtime::Opcode op,
                                 const std::string &engine) {
  using neuron::runtime::Opcode;
  auto full = [](int buf) { return view(buf, "[128, 64]", "[64, 1]"); };
  const std::string column = view(4, "[128, 1]", "[1, 1]");
  const std::string indices = view(5, "[128, 1]", "[2, 1]");
  const std::string seed = view(5, "[128, 2]", "[2, 1]");
  std::string fields;
  switch (op) {
  case Opcode::DmaCopy:
    fields = R"("src": )" + full(0) + R"(, "dst": )" + full(1);
    break;
  case Opcode::DmaGather:
    fields = R"("table": )" + full(0) + R"(, "indices": )" + indices +
             R"(, "dst": )" + full(1);
    break;
  case Opcode::DmaScatter:
    fields = R"("src": )" + full(1) + R"(, "indices": )" + indices +
             R"(, "dst": )" + full(7);
    break;
  case Opcode::Matmul:
    fields = R"("accumulate": false, "stationary": )" + full(1) +
             R"(, "moving": )" + full(2) + R"(, "dst": )" +
             view(6, "[64, 64]", "[64, 1]");
    break;
  case Opcode::Activation:
    fields = R"("func": "exp", "src": )" + full(1) + R"(, "dst": )" + full(3);
    break;
  case Opcode::TensorTensor:
    fields = R"("alu_op": "add", "a": )" + full(1) + R"(, "b": )" + full(2) +
             R"(, "dst": )" + full(3);
    break;
  case Opcode::ScalarTensorTensor:
    fields = R"("alu_op0": "multiply", "alu_op1": "add", "imm": 2, "a": )" +
             full(1) + R"(, "b": )" + full(2) + R"(, "dst": )" + full(3);
    break;
  case Opcode::TensorScalar:
    fields = R"("alu_op": "add", "imm": 1, "src": )" + full(1) +
             R"(, "dst": )" + full(3);
    break;
  case Opcode::TensorReduce:
    fields = R"("alu_op": "add", "src": )" + full(1) + R"(, "dst": )" + column;
    break;
  case Opcode::BnStats:
    fields = R"("src": )" + full(1) + R"(, "dst": )" +
             view(3, "[128, 6]", "[64, 1]");
    break;
  case Opcode::BnAggr:
    fields = R"("src": )" + view(1, "[128, 6]", "[64, 1]") + R"(, "dst": )" +
             view(3, "[128, 2]", "[64, 1]");
    break;
  case Opcode::Select:
    fields = R"("pred": )" + full(1) + R"(, "on_true": )" + full(2) +
             R"(, "on_false": )" + full(2) + R"(, "dst": )" + full(3);
    break;
  case Opcode::Iota:
    fields = R"("base": 0, "channel_multiplier": 64, "multipliers": [1], )"
             R"("dst": )" +
             full(3);
    break;
  case Opcode::Memset:
    fields = R"("value": 0, "dst": )" + full(3);
    break;
  case Opcode::Copy:
    fields = R"("src": )" + full(1) + R"(, "dst": )" + full(3);
    break;
  case Opcode::Rand:
    fields = R"("channel_multiplier": 64, "multipliers": [1], "seed": )" +
             seed + R"(, "dst": )" + full(3);
    break;
  case Opcode::NGather:
    fields = R"("src": )" + full(1) + R"(, "indices": )" + seed +
             R"(, "dst": )" + view(3, "[128, 2]", "[64, 1]");
    break;
  case Opcode::Collective:
    fields = R"("kind": "all_reduce", "alu_op": "add", "group": 0, "src": )" +
             full(0) + R"(, "dst": )" + full(7);
    break;
  }
  std::string buffers = buffer(0, "hbm", "input", "f32", "[128, 64]") + "," +
                        buffer(1, "sbuf", "scratch", "f32", "[128, 64]") + "," +
                        buffer(2, "sbuf", "scratch", "f32", "[128, 64]") + "," +
                        buffer(3, "sbuf", "scratch", "f32", "[128, 64]") + "," +
                        buffer(4, "sbuf", "scratch", "f32", "[128, 1]") + "," +
                        buffer(5, "sbuf", "scratch", "i32", "[128, 2]") + "," +
                        buffer(6, "psum", "scratch", "f32", "[128, 64]") + "," +
                        buffer(7, "hbm", "internal", "f32", "[128, 64]");
  std::string inst = R"({"op": ")" +
                     std::string(neuron::runtime::opcodeName(op)) +
                     R"(", "engine": ")" + engine + R"(", )" + fields + "}";
  return withGroups(programJson(buffers, "0", "", inst),
                    R"([{"name": "0", "ranks": [0, 1]}])");
}

} // namespace neuron::test

#endif // NEURON_TESTS_UNIT_TESTUTIL_H
