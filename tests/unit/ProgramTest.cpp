//===- ProgramTest.cpp - Program parsing, verification, rejection ---------===//

#include "runtime/program/Program.h"
#include "tests/unit/CatchCompat.h"
#include "tests/unit/TestUtil.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <unistd.h>

using namespace neuron::runtime;
using neuron::test::buffer;
using neuron::test::contains;
using neuron::test::errorOf;
using neuron::test::programJson;
using neuron::test::sampleProgram;
using neuron::test::trn2;
using neuron::test::view;

namespace {

/// A program touching most of the format: constants, loops with affine
/// offsets (of views and of an iota), every attribute kind, both operands
/// an activation may write and source locations.
std::string fullProgram() {
  float constData[4] = {1, 2, 3, 4};
  std::string buffers =
      buffer(0, "hbm", "input", "bf16", "[4, 8]") + "," +
      buffer(1, "hbm", "output", "f32", "[4, 8]") + "," +
      buffer(2, "sbuf", "scratch", "f32", "[4, 8]") + "," +
      buffer(3, "hbm", "constant", "f32", "[4, 1]",
             R"(, "data": ")" + neuron::test::base64(constData, 16) + "\"") +
      "," + buffer(4, "sbuf", "scratch", "f32", "[4, 1]") + "," +
      buffer(5, "hbm", "constant", "f32", "[2]",
             R"(, "splat": {"float": "-inf"})") +
      "," + buffer(6, "sbuf", "scratch", "f32", "[4, 1]");
  std::string body =
      R"({"loop": 0, "count": 2, "body": [
           {"op": "dma_copy", "engine": "sync", "loc": 0,
            "src": )" +
      view(0, "[4, 4]", "[8, 1]", 0, "[[0, 4]]") + R"(,
            "dst": )" +
      view(2, "[4, 4]", "[8, 1]", 0, "[[0, 4]]") + R"(}]},
         {"op": "dma_copy", "engine": "scalar",
          "src": )" +
      view(3, "[4, 1]", "[1, 1]") + R"(,
          "dst": )" +
      view(4, "[4, 1]", "[1, 1]") + R"(},
         {"op": "activation", "engine": "scalar", "loc": 1, "func": "gelu_tanh",
          "scale": 0.5, "bias_imm": {"float": "nan"},
          "src": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
          "dst": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
          "bias": )" +
      view(4, "[4, 1]", "[1, 1]") + R"(},
         {"op": "tensor_scalar", "engine": "vector", "alu_op": "subtract",
          "reverse": true, "src": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
          "dst": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
          "scalar": )" +
      view(4, "[4, 1]", "[1, 1]") + R"(},
         {"op": "iota", "engine": "gpsimd", "base": 1, "channel_multiplier": 8,
          "multipliers": [1], "dst": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(},
         {"loop": 1, "count": 2, "body": [
           {"op": "iota", "engine": "gpsimd", "base": 0,
            "channel_multiplier": 8, "multipliers": [1],
            "offset": {"const": 3, "terms": [[1, 16]]}, "dst": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(},
           {"op": "activation", "engine": "scalar", "func": "exp",
            "src": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
            "dst": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
            "scale_col": )" +
      view(4, "[4, 1]", "[1, 1]") + R"(,
            "reduce_res": )" +
      view(6, "[4, 1]", "[1, 1]") + R"(},
           {"op": "scalar_tensor_tensor", "engine": "vector",
            "alu_op0": "subtract", "alu_op1": "multiply", "a": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(, "b": )" + view(2, "[4, 8]", "[8, 1]") +
      R"(, "dst": )" + view(2, "[4, 8]", "[8, 1]") + R"(, "scalar": )" +
      view(6, "[4, 1]", "[1, 1]") + R"(},
           {"op": "scalar_tensor_tensor", "engine": "gpsimd",
            "alu_op0": "max", "alu_op1": "add", "imm": -1, "a": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(, "b": )" + view(2, "[4, 8]", "[8, 1]") +
      R"(, "dst": )" + view(2, "[4, 8]", "[8, 1]") + R"(}]},
         {"op": "dma_copy", "engine": "sync",
          "src": )" +
      view(2, "[4, 8]", "[8, 1]") + R"(,
          "dst": )" +
      view(1, "[4, 8]", "[8, 1]") + R"(})";
  return programJson(buffers, "0", "1", body, "trn2",
                     R"(["model.py:12", "model.py:13"])");
}

/// Checks that `json` is rejected (by parse or by verify on its target) and
/// that the message mentions `expected`.
void requireRejected(const std::string &json, const std::string &expected) {
  std::string message = errorOf([&] {
    Program program = Program::parse(json);
    program.verify(neuron::target::getTarget(program.target));
  });
  INFO("message: " << message);
  CHECK(contains(message, expected));
  CHECK(!contains(message, "<no error>"));
  CHECK(!contains(message, "<other exception"));
}

/// One-instruction program on trn2 with the given buffers and body.
std::string simple(const std::string &buffers, const std::string &body,
                   const std::string &inputs = "0",
                   const std::string &outputs = "1") {
  return programJson(buffers, inputs, outputs, body);
}

const std::string kInOut = buffer(0, "hbm", "input", "f32", "[4, 8]") + "," +
                           buffer(1, "hbm", "output", "f32", "[4, 8]");

std::string copyInOut(const std::string &srcView, const std::string &dstView) {
  return R"({"op": "dma_copy", "engine": "sync", "src": )" + srcView +
         R"(, "dst": )" + dstView + "}";
}

} // namespace

TEST_CASE("a full program parses and verifies", "[program]") {
  Program program = Program::parse(fullProgram());
  REQUIRE_NOTHROW(program.verify(trn2()));
  CHECK(program.name == "test");
  CHECK(program.target == "trn2");
  REQUIRE(program.buffers.size() == 7);
  CHECK(program.buffers[0].dtype == DType::BF16);
  CHECK(program.buffers[2].space == Space::SBUF);
  CHECK(program.buffers[2].kind == BufferKind::Scratch);
  CHECK(program.buffers[3].data.size() == 16);
  REQUIRE(program.buffers[5].splat);
  CHECK(std::isinf(*program.buffers[5].splat));
  CHECK(program.locations.size() == 2);
  CHECK(program.numInstructions() == 10);
  REQUIRE(program.body.size() == 7);
  const Node &loop = program.body[0];
  REQUIRE(loop.isLoop());
  CHECK(loop.count == 2);
  const Instruction &copy = loop.body[0].inst;
  CHECK(copy.op == Opcode::DmaCopy);
  CHECK(copy.engine == Engine::Sync);
  CHECK(copy.loc == 0);
  REQUIRE(copy.src);
  CHECK(copy.src->offset.terms ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 4}});
  const Instruction &act = program.body[2].inst;
  CHECK(act.func == ActFunc::GeluTanh);
  CHECK(act.scale == 0.5);
  CHECK(std::isnan(act.biasImm));
  CHECK(act.bias);
  const Instruction &ts = program.body[3].inst;
  CHECK(ts.aluOp == AluOp::Subtract);
  CHECK(ts.reverse);
  const Instruction &iota = program.body[4].inst;
  CHECK(iota.channelMultiplier == 8);
  CHECK(iota.multipliers == std::vector<double>{1});
  CHECK(!iota.offset);
  const Node &flash = program.body[5];
  REQUIRE(flash.isLoop());
  REQUIRE(flash.body.size() == 4);
  const Instruction &movingIota = flash.body[0].inst;
  REQUIRE(movingIota.offset);
  CHECK(movingIota.offset->constant == 3);
  CHECK(movingIota.offset->terms ==
        std::vector<std::pair<int64_t, int64_t>>{{1, 16}});
  const Instruction &sums = flash.body[1].inst;
  REQUIRE(sums.scaleCol);
  REQUIRE(sums.reduceRes);
  CHECK(sums.reduceRes->buffer == 6);
  // Written operands come first, both marked as writes.
  auto operands = sums.operands();
  REQUIRE(operands.size() == 4);
  CHECK(std::string(operands[0].first) == "dst");
  CHECK(std::string(operands[1].first) == "reduce_res");
  CHECK(Instruction::writes(operands[1].first));
  CHECK(!Instruction::writes("scale_col"));
  const Instruction &stt = flash.body[2].inst;
  CHECK(stt.op == Opcode::ScalarTensorTensor);
  CHECK(stt.aluOp == AluOp::Subtract);
  CHECK(stt.aluOp1 == AluOp::Multiply);
  CHECK(stt.scalar);
  CHECK(!stt.imm);
  const Instruction &sttImm = flash.body[3].inst;
  CHECK(sttImm.engine == Engine::GpSimd);
  REQUIRE(sttImm.imm);
  CHECK(*sttImm.imm == -1);
}

TEST_CASE("the instruction set's names round-trip", "[program][isa]") {
  // InstructionSet.def: every value has one name, parsed back to it.
  auto check = [](const auto &values, auto nameOf, auto parse) {
    std::set<std::string> names;
    for (auto value : values) {
      std::string name = nameOf(value);
      INFO(name);
      CHECK(parse(name) == value);
      CHECK(names.insert(name).second);
    }
  };
  check(kAllOpcodes, opcodeName, parseOpcode);
  check(kAllEngines, engineName, parseEngine);
  check(kAllSpaces, spaceName, parseSpace);
  check(kAllActFuncs, actFuncName, parseActFunc);
  check(kAllAluOps, aluOpName, parseAluOp);
  CHECK_FALSE(parseOpcode("nisa.matmul"));
  CHECK_FALSE(parseEngine("Tensor"));
  std::set<std::string> fields;
  for (const OperandField &field : kOperandFields) {
    INFO(field.name);
    CHECK(fields.insert(field.name).second);
    CHECK(Instruction::writes(field.name) == field.written);
  }
  CHECK_FALSE(Instruction::writes("alu_op"));
}

TEST_CASE("every instruction round-trips through toJson", "[program][isa]") {
  for (Opcode op : kAllOpcodes) {
    INFO(opcodeName(op));
    Engine engine =
        *std::find_if(std::begin(kAllEngines), std::end(kAllEngines),
                      [&](Engine e) { return canIssue(op, e); });
    Program program = Program::parse(sampleProgram(op, engineName(engine)));
    std::string json = program.toJson();
    Program again = Program::parse(json);
    again.verify(trn2());
    CHECK(again.toJson() == json);
    REQUIRE(again.body.size() == 1);
    CHECK(again.body[0].inst.op == op);
    CHECK(again.body[0].inst.operands().size() ==
          program.body[0].inst.operands().size());
  }
}

TEST_CASE("an engine issues exactly the instructions the table gives it",
          "[program][isa]") {
  for (Opcode op : kAllOpcodes)
    for (Engine engine : kAllEngines) {
      std::string name =
          std::string(opcodeName(op)) + " on " + engineName(engine);
      INFO(name);
      std::string error = errorOf([&] {
        Program::parse(sampleProgram(op, engineName(engine))).verify(trn2());
      });
      if (canIssue(op, engine))
        CHECK(error == "<no error>");
      else
        CHECK(contains(error, "' cannot issue " + std::string(opcodeName(op))));
    }
}

TEST_CASE("toJson round-trips", "[program]") {
  Program program = Program::parse(fullProgram());
  std::string once = program.toJson();
  Program again = Program::parse(once);
  REQUIRE_NOTHROW(again.verify(trn2()));
  CHECK(again.toJson() == once);
  CHECK(again.buffers[3].data == program.buffers[3].data);
}

TEST_CASE("dma_copy's DGE mode parses, round-trips and is checked",
          "[program][reject]") {
  std::string buffers = buffer(0, "hbm", "input", "f32", "[128, 64]") + "," +
                        buffer(1, "sbuf", "scratch", "f32", "[128, 64]");
  std::string src = view(0, "[128, 64]", "[64, 1]"),
              dst = view(1, "[128, 64]", "[64, 1]");
  auto copy = [&](const std::string &engine, const std::string &dge) {
    return programJson(buffers, "0", "",
                       R"({"op": "dma_copy", "engine": ")" + engine +
                           R"(", "dge": ")" + dge + R"(", "src": )" + src +
                           R"(, "dst": )" + dst + "}");
  };
  for (const char *engine : {"sync", "scalar"}) {
    Program hw = Program::parse(copy(engine, "hwdge"));
    REQUIRE_NOTHROW(hw.verify(trn2()));
    REQUIRE(hw.body.size() == 1);
    CHECK(hw.body[0].inst.hwdge);
    std::string once = hw.toJson();
    CHECK(contains(once, R"("dge":"hwdge")"));
    CHECK(Program::parse(once).toJson() == once);
  }
  // "none" is the default: not written back, so older programs read back
  // (and hash) unchanged.
  Program none = Program::parse(copy("sync", "none"));
  CHECK(!none.body[0].inst.hwdge);
  CHECK(!contains(none.toJson(), "dge"));
  requireRejected(copy("sync", "swdge"), "must be \"none\" or \"hwdge\"");
  requireRejected(copy("gpsimd", "hwdge"), "issued by sync or scalar");
}

TEST_CASE("loadFile reads programs and rejects missing or truncated files",
          "[program]") {
  auto dir = std::filesystem::temp_directory_path() /
             ("neuron-program-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string text = fullProgram();
  {
    std::ofstream(dir / "good.json") << text;
    std::ofstream(dir / "truncated.json") << text.substr(0, text.size() / 2);
    std::ofstream(dir / "empty.json");
  }
  Program program = Program::loadFile((dir / "good.json").string());
  CHECK(program.numInstructions() == 10);
  CHECK(contains(
      errorOf([&] { Program::loadFile((dir / "truncated.json").string()); }),
      "malformed"));
  CHECK(contains(
      errorOf([&] { Program::loadFile((dir / "empty.json").string()); }),
      "malformed"));
  CHECK(contains(
      errorOf([&] { Program::loadFile((dir / "missing.json").string()); }),
      "cannot open"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("malformed JSON is an Error", "[program][reject]") {
  for (const char *text :
       {"", "{", "null", "[]", "42", "\"x\"", "{\"format\": }", "\xff\xfe{",
        "{\"format\": \"torchneuron-kernel-program\", \"version\": 1"}) {
    INFO("text: " << text);
    std::string message = errorOf([&] { Program::parse(text); });
    CHECK(!contains(message, "<no error>"));
    CHECK(!contains(message, "<other exception"));
  }
}

TEST_CASE("every prefix and random corruption of a program is handled",
          "[program][reject]") {
  std::string text = fullProgram();
  for (size_t length = 0; length < text.size(); ++length) {
    std::string message =
        errorOf([&] { Program::parse(text.substr(0, length)).verify(trn2()); });
    REQUIRE(!contains(message, "<other exception"));
    REQUIRE(!contains(message, "<no error>"));
  }
  std::mt19937 rng(3);
  const std::string alphabet = "0123456789-[]{}\",:. abcefx";
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string mutated = text;
    int edits = 1 + round % 4;
    for (int e = 0; e < edits; ++e) {
      size_t at = rng() % mutated.size();
      mutated[at] = alphabet[rng() % alphabet.size()];
    }
    std::string message = errorOf([&] {
      Program program = Program::parse(mutated);
      program.verify(trn2());
    });
    REQUIRE(!contains(message, "<other exception"));
    accepted += message == "<no error>";
  }
  CHECK(accepted < 3000);
}

TEST_CASE("format, version and names are checked", "[program][reject]") {
  std::string good = fullProgram();
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string text = good;
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  requireRejected(replaced("torchneuron-kernel-program", "other-format"),
                  "format");
  requireRejected(replaced("\"version\": 1", "\"version\": 2"),
                  "unsupported version 2");
  requireRejected(replaced("\"version\": 1", "\"version\": \"1\""), "version");
  requireRejected(replaced("\"op\": \"iota\"", "\"op\": \"iota2\""),
                  "unknown op 'iota2'");
  requireRejected(replaced("\"engine\": \"gpsimd\"", "\"engine\": \"pool\""),
                  "unknown engine 'pool'");
  requireRejected(replaced("\"dtype\": \"bf16\"", "\"dtype\": \"bfloat16\""),
                  "unknown dtype 'bfloat16'");
  requireRejected(replaced("\"space\": \"sbuf\"", "\"space\": \"sram\""),
                  "unknown space 'sram'");
  requireRejected(replaced("\"kind\": \"output\"", "\"kind\": \"result\""),
                  "unknown kind 'result'");
  requireRejected(replaced("\"gelu_tanh\"", "\"swish\""),
                  "unknown activation function 'swish'");
  requireRejected(replaced("\"subtract\"", "\"sub\""), "unknown ALU op 'sub'");
  requireRejected(replaced("\"reverse\": true", "\"reverse\": 1"),
                  "expected a boolean");
  requireRejected(replaced("\"scale\": 0.5", "\"scael\": 0.5"),
                  "unknown field 'scael'");
  requireRejected(replaced("\"count\": 2", "\"count\": 2.5"),
                  "expected an integer");
  requireRejected(replaced("\"count\": 2", "\"count\": 18446744073709551615"),
                  "out of range");
  std::string forTrn3 =
      replaced("\"target\": \"trn2\"", "\"target\": \"trn3\"");
  CHECK(contains(errorOf([&] { Program::parse(forTrn3).verify(trn2()); }),
                 "program is for 'trn3', not 'trn2'"));
}

TEST_CASE("views must stay in bounds on every loop iteration",
          "[program][reject]") {
  // Four row-tiles of [1, 8] over a [4, 8] buffer: iv 0..3 fits, 0..4 does
  // not, and only the last iteration is out of bounds.
  auto tiled = [](int count, int64_t offset, int64_t coeff) {
    std::string terms = "[[0, " + std::to_string(coeff) + "]]";
    return simple(kInOut,
                  R"({"loop": 0, "count": )" + std::to_string(count) +
                      R"(, "body": [)" +
                      copyInOut(view(0, "[1, 8]", "[8, 1]", offset, terms),
                                view(1, "[1, 8]", "[8, 1]", offset, terms)) +
                      "]}");
  };
  REQUIRE_NOTHROW(Program::parse(tiled(4, 0, 8)).verify(trn2()));
  requireRejected(tiled(5, 0, 8), "out of bounds");
  // Descending tiles: offset 24 - 8 * iv is fine for 4 iterations, and goes
  // below zero on a fifth.
  REQUIRE_NOTHROW(Program::parse(tiled(4, 24, -8)).verify(trn2()));
  requireRejected(tiled(5, 24, -8), "out of bounds");
  // Strides alone can overrun.
  requireRejected(simple(kInOut, copyInOut(view(0, "[4, 8]", "[9, 1]"),
                                           view(1, "[4, 8]", "[8, 1]"))),
                  "out of bounds");
  // A term naming a loop that does not enclose the instruction.
  requireRejected(
      simple(kInOut, copyInOut(view(0, "[1, 8]", "[8, 1]", 0, "[[7, 8]]"),
                               view(1, "[1, 8]", "[8, 1]"))),
      "iv 7 is not an enclosing loop");
  requireRejected(simple(kInOut, copyInOut(view(0, "[4, 8]", "[8, -1]"),
                                           view(1, "[4, 8]", "[8, 1]"))),
                  "strides must be >= 0");
  requireRejected(simple(kInOut, copyInOut(view(9, "[4, 8]", "[8, 1]"),
                                           view(1, "[4, 8]", "[8, 1]"))),
                  "no buffer with id 9");
  // Huge offsets do not overflow the bounds arithmetic.
  requireRejected(
      simple(kInOut, R"({"loop": 0, "count": 9000000000000000000, "body": [)" +
                         copyInOut(view(0, "[1, 8]", "[8, 1]", 0,
                                        "[[0, 9000000000000000000]]"),
                                   view(1, "[1, 8]", "[8, 1]")) +
                         "]}"),
      "out of bounds");
}

TEST_CASE("partition dims and on-chip capacity are checked",
          "[program][reject]") {
  std::string io = buffer(0, "hbm", "input", "f32", "[129, 8]") + "," +
                   buffer(1, "hbm", "output", "f32", "[129, 8]");
  requireRejected(
      simple(io + "," + buffer(2, "sbuf", "scratch", "f32", "[129, 8]"),
             copyInOut(view(0, "[129, 8]", "[8, 1]"),
                       view(1, "[129, 8]", "[8, 1]"))),
      "partition dim 129");
  // A view with 129 partitions over a big enough buffer.
  requireRejected(
      simple(io + "," + buffer(2, "sbuf", "scratch", "f32", "[128, 16]"),
             copyInOut(view(0, "[129, 8]", "[8, 1]"),
                       view(2, "[129, 8]", "[8, 1]"))),
      "partition dim 129");
  // Exactly the usable SBUF of trn2 (212728 B = 53182 f32) fits; one more
  // element does not.
  auto sbuf = [](int64_t a, int64_t b) {
    return simple(
        kInOut + "," +
            buffer(2, "sbuf", "scratch", "f32",
                   "[128, " + std::to_string(a) + "]") +
            "," +
            buffer(3, "sbuf", "scratch", "bf16",
                   "[128, " + std::to_string(b) + "]"),
        copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]")));
  };
  REQUIRE_NOTHROW(Program::parse(sbuf(53000, 364)).verify(trn2()));
  requireRejected(sbuf(53000, 365), "SBUF scratch needs 212730 bytes");
  requireRejected(
      simple(
          kInOut + "," + buffer(2, "psum", "scratch", "f32", "[128, 4097]"),
          copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]"))),
      "PSUM scratch needs 16388 bytes");
  requireRejected(
      simple(
          kInOut + "," +
              buffer(2, "hbm", "internal", "f32", "[1000000, 1000000]"),
          copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]"))),
      "HBM buffers need");
  requireRejected(
      simple(
          kInOut + "," +
              buffer(2, "hbm", "internal", "f32", "[4611686018427387904, 4]"),
          copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]"))),
      "overflows");
}

TEST_CASE("shape, dtype, space and engine rules are checked",
          "[program][reject]") {
  std::string tiles = kInOut + "," +
                      buffer(2, "sbuf", "scratch", "f32", "[4, 8]") + "," +
                      buffer(3, "psum", "scratch", "f32", "[4, 8]") + "," +
                      buffer(4, "sbuf", "scratch", "i32", "[4, 8]");
  std::string t = view(2, "[4, 8]", "[8, 1]");
  std::string half = view(2, "[4, 4]", "[8, 1]");
  requireRejected(simple(tiles, R"({"op": "tensor_tensor", "engine": "vector",
      "alu_op": "add", "a": )" + t + R"(, "b": )" +
                                    half + R"(, "dst": )" + t + "}"),
                  "shape mismatch");
  requireRejected(simple(tiles, copyInOut(view(0, "[4, 8]", "[8, 1]"), half)),
                  "shape mismatch");
  // Compute engines cannot address HBM.
  requireRejected(simple(tiles, R"({"op": "copy", "engine": "vector",
      "src": )" + view(0, "[4, 8]", "[8, 1]") +
                                    R"(, "dst": )" + t + "}"),
                  "is in hbm");
  requireRejected(simple(tiles, R"({"op": "copy", "engine": "gpsimd",
      "src": )" + view(3, "[4, 8]", "[8, 1]") +
                                    R"(, "dst": )" + t + "}"),
                  "gpsimd cannot access psum");
  requireRejected(simple(tiles, R"({"op": "copy", "engine": "tensor",
      "src": )" + t + R"(, "dst": )" +
                                    t + "}"),
                  "cannot issue copy");
  requireRejected(simple(tiles, R"({"op": "activation", "engine": "vector",
      "func": "exp", "src": )" + t + R"(, "dst": )" +
                                    t + "}"),
                  "cannot issue activation");
  // Inputs and constants are read-only.
  requireRejected(simple(tiles, copyInOut(view(1, "[4, 8]", "[8, 1]"),
                                          view(0, "[4, 8]", "[8, 1]"))),
                  "read-only");
  // matmul: K mismatch, dst dtype/space, sizes.
  requireRejected(simple(tiles, R"({"op": "matmul", "engine": "tensor",
          "stationary": )" + view(2, "[4, 4]", "[8, 1]") +
                                    R"(, "moving": )" +
                                    view(2, "[3, 8]", "[8, 1]") +
                                    R"(, "dst": )" +
                                    view(3, "[4, 8]", "[8, 1]") + "}"),
                  "contraction mismatch");
  requireRejected(simple(tiles, R"({"op": "matmul", "engine": "tensor",
          "stationary": )" + view(2, "[4, 4]", "[8, 1]") +
                                    R"(, "moving": )" +
                                    view(2, "[4, 8]", "[8, 1]") +
                                    R"(, "dst": )" +
                                    view(2, "[4, 8]", "[8, 1]") + "}"),
                  "f32 psum");
  std::string big = kInOut + "," +
                    buffer(2, "sbuf", "scratch", "bf16", "[128, 1024]") + "," +
                    buffer(3, "psum", "scratch", "f32", "[128, 1024]");
  std::string bigMatmul = R"({"op": "matmul", "engine": "tensor",
      "stationary": )" + view(2, "[128, 128]", "[1024, 1]") +
                          R"(, "moving": )" +
                          view(2, "[128, 1024]", "[1024, 1]") + R"(, "dst": )" +
                          view(3, "[128, 1024]", "[1024, 1]") + "}";
  requireRejected(simple(big, bigMatmul), "moving free size 1024 exceeds 512");
  // trn3's PE array writes up to 4096 fp32 columns per matmul.
  REQUIRE_NOTHROW(Program::parse(programJson(big, "0", "1", bigMatmul, "trn3"))
                      .verify(neuron::target::getTarget("trn3")));
  // Gather indices must be integers.
  requireRejected(simple(tiles, R"({"op": "dma_gather", "engine": "gpsimd",
      "table": )" + view(0, "[4, 8]", "[8, 1]") +
                                    R"(, "indices": )" +
                                    view(2, "[4, 1]", "[8, 1]") +
                                    R"(, "dst": )" + t + "}"),
                  "integer dtype");
  // A scatter's source holds one row of the table's width per index.
  requireRejected(
      simple(tiles, R"({"op": "dma_scatter", "engine": "gpsimd",
      "src": )" + view(2, "[2, 8]", "[8, 1]") +
                        R"(, "indices": )" + view(4, "[4, 1]", "[8, 1]") +
                        R"(, "dst": )" + view(1, "[4, 8]", "[8, 1]") + "}"),
      "'src' must be [4, 8], got [2, 8]");
  // Disjoint scatters overwrite rows.
  requireRejected(
      simple(tiles, R"({"op": "dma_scatter", "engine": "gpsimd",
      "disjoint": true, "accumulate": true, "src": )" +
                        view(2, "[4, 8]", "[8, 1]") + R"(, "indices": )" +
                        view(4, "[4, 1]", "[8, 1]") + R"(, "dst": )" +
                        view(1, "[4, 8]", "[8, 1]") + "}"),
      "'disjoint' scatters overwrite rows");
  // tensor_scalar needs exactly one scalar source.
  requireRejected(simple(tiles, R"({"op": "tensor_scalar", "engine": "vector",
      "alu_op": "add", "src": )" + t +
                                    R"(, "dst": )" + t + "}"),
                  "exactly one of 'scalar' and 'imm'");
  requireRejected(simple(tiles, R"({"op": "tensor_scalar", "engine": "vector",
      "alu_op": "add", "imm": 1, "src": )" +
                                    t + R"(, "dst": )" + t + R"(, "scalar": )" +
                                    view(2, "[4, 1]", "[8, 1]") + "}"),
                  "exactly one of 'scalar' and 'imm'");
  requireRejected(simple(tiles, R"({"op": "tensor_scalar", "engine": "vector",
      "alu_op": "add", "src": )" + t +
                                    R"(, "dst": )" + t + R"(, "scalar": )" +
                                    view(2, "[4, 2]", "[8, 1]") + "}"),
                  "'scalar' must be [4, 1]");
  requireRejected(simple(tiles, R"({"op": "tensor_reduce", "engine": "vector",
      "alu_op": "subtract", "src": )" +
                                    t + R"(, "dst": )" +
                                    view(2, "[4, 1]", "[8, 1]") + "}"),
                  "not a reduction");
  requireRejected(simple(tiles, R"({"op": "iota", "engine": "gpsimd",
      "multipliers": [1, 2], "dst": )" +
                                    t + "}"),
                  "'multipliers' has 2 entries");
  // rand: an i32 [P, 2] seed per partition, a float destination.
  std::string seed = view(4, "[4, 2]", "[8, 1]");
  auto rand = [&](const std::string &seedView, const std::string &dst,
                  const std::string &extra = "") {
    return simple(tiles, R"({"op": "rand", "engine": "gpsimd", )" + extra +
                             R"("multipliers": [1], "seed": )" + seedView +
                             R"(, "dst": )" + dst + "}");
  };
  {
    Program ok = Program::parse(rand(seed, t, R"("stream": 3, )"));
    CHECK_NOTHROW(ok.verify(neuron::target::getTarget(ok.target)));
    CHECK(ok.body[0].inst.stream == 3);
  }
  requireRejected(rand(view(4, "[4, 1]", "[8, 1]"), t),
                  "'seed' must be [4, 2]");
  requireRejected(rand(view(2, "[4, 2]", "[8, 1]"), t), "'seed' must be i32");
  requireRejected(rand(seed, view(4, "[4, 8]", "[8, 1]")),
                  "'dst' must be f32, bf16 or f16");
  requireRejected(rand(seed, t, R"("stream": -1, )"), "'stream' must fit");
  requireRejected(simple(tiles, R"({"op": "rand", "engine": "gpsimd",
      "multipliers": [1], "dst": )" +
                                    t + "}"),
                  "missing field 'seed'");
  // n_gather: i32 indices, one per destination element, one dtype.
  auto nGather = [&](const std::string &src, const std::string &indices,
                     const std::string &dst) {
    return simple(tiles, R"({"op": "n_gather", "engine": "gpsimd", "src": )" +
                             src + R"(, "indices": )" + indices +
                             R"(, "dst": )" + dst + "}");
  };
  std::string picks = view(4, "[4, 4]", "[8, 1]");
  REQUIRE_NOTHROW(Program::parse(nGather(t, picks, half))
                      .verify(neuron::target::getTarget("trn2")));
  requireRejected(nGather(t, half, half), "'indices' must be i32");
  requireRejected(nGather(t, picks, t), "one element per element of 'dst'");
  requireRejected(nGather(t, picks, view(4, "[4, 4]", "[8, 1]")), "one dtype");
  requireRejected(nGather(view(2, "[2, 8]", "[8, 1]"), picks, half),
                  "one partition count");
  // An is_transpose matmul streams a square identity, nothing else.
  auto transpose = [&](const std::string &moving, const std::string &extra) {
    return simple(tiles, R"({"op": "matmul", "engine": "tensor", )" + extra +
                             R"("is_transpose": true, "stationary": )" +
                             view(2, "[4, 4]", "[8, 1]") + R"(, "moving": )" +
                             moving + R"(, "dst": )" +
                             view(3, "[4, 4]", "[8, 1]") + "}");
  };
  REQUIRE_NOTHROW(Program::parse(transpose(half, ""))
                      .verify(neuron::target::getTarget("trn2")));
  requireRejected(transpose(view(2, "[4, 8]", "[8, 1]"), ""),
                  "square moving identity");
  requireRejected(transpose(half, R"("accumulate": true, )"),
                  "without accumulate");
  requireRejected(simple(tiles, R"({"op": "memset", "engine": "vector",
      "dst": )" + t + "}"),
                  "missing field 'value'");
  requireRejected(simple(tiles, R"({"op": "memset", "engine": "vector",
      "value": 0, "loc": 3, "dst": )" +
                                    t + "}"),
                  "past the 0 locations");
}

TEST_CASE("activation columns, iota offsets and scalar_tensor_tensor are "
          "checked",
          "[program][reject]") {
  std::string tiles = kInOut + "," +
                      buffer(2, "sbuf", "scratch", "f32", "[4, 8]") + "," +
                      buffer(3, "sbuf", "scratch", "bf16", "[4, 8]") + "," +
                      buffer(4, "sbuf", "scratch", "f32", "[4, 1]");
  std::string t = view(2, "[4, 8]", "[8, 1]");
  std::string col = view(4, "[4, 1]", "[1, 1]");
  std::string bf16Col = view(3, "[4, 1]", "[8, 1]");
  auto activation = [&](const std::string &extra) {
    return R"({"op": "activation", "engine": "scalar", "func": "exp", "src": )" +
           t + R"(, "dst": )" + t + extra + "}";
  };
  REQUIRE_NOTHROW(
      Program::parse(simple(tiles, activation(R"(, "scale_col": )" + col +
                                              R"(, "reduce_res": )" + col)))
          .verify(trn2()));
  requireRejected(simple(tiles, activation(R"(, "scale_col": )" +
                                           view(2, "[4, 2]", "[8, 1]"))),
                  "operand 'scale_col' must be [4, 1], got [4, 2]");
  requireRejected(simple(tiles, activation(R"(, "reduce_res": )" +
                                           view(4, "[2, 1]", "[1, 1]"))),
                  "operand 'reduce_res' must be [4, 1], got [2, 1]");
  requireRejected(simple(tiles, activation(R"(, "scale_col": )" + bf16Col)),
                  "'scale_col' must be f32, got bf16");
  requireRejected(simple(tiles, activation(R"(, "reduce_res": )" + bf16Col)),
                  "'reduce_res' must be f32, got bf16");
  requireRejected(simple(tiles, activation(R"(, "reduce_res": )" +
                                           view(1, "[4, 1]", "[8, 1]"))),
                  "operand 'reduce_res' is in hbm");
  requireRejected(simple(tiles, activation(R"(, "reduce_res": 3)")),
                  "field 'reduce_res': expected an object");
  requireRejected(simple(tiles, activation(R"(, "reduce_res": )" +
                                           view(9, "[4, 1]", "[1, 1]"))),
                  "field 'reduce_res' field 'buf': no buffer with id 9");
  requireRejected(simple(tiles, R"({"op": "copy", "engine": "vector",
      "reduce_res": )" + col + R"(, "src": )" +
                                    t + R"(, "dst": )" + t + "}"),
                  "unknown field 'reduce_res'");

  auto iota = [&](const std::string &offset) {
    return R"({"loop": 0, "count": 4, "body": [{"op": "iota",
        "engine": "gpsimd", "multipliers": [1], "offset": )" +
           offset + R"(, "dst": )" + t + "}]}";
  };
  REQUIRE_NOTHROW(
      Program::parse(simple(tiles, iota(R"({"const": -3, "terms": [[0, 8]]})")))
          .verify(trn2()));
  requireRejected(simple(tiles, iota(R"({"const": 0, "terms": [[1, 8]]})")),
                  "field 'offset': iv 1 is not an enclosing loop");
  requireRejected(
      simple(tiles,
             iota(R"({"const": 0, "terms": [[0, 4611686018427387904]]})")),
      "field 'offset': its value leaves int64");
  requireRejected(
      simple(tiles,
             iota(R"({"const": 9223372036854775807, "terms": [[0, 1]]})")),
      "field 'offset': its value leaves int64");
  requireRejected(
      simple(tiles, iota(R"({"const": "x"})")),
      "field 'offset' field 'const': size expression 'x' in a program "
      "without size parameters' values");
  requireRejected(simple(tiles, iota(R"({"terms": [[0]]})")),
                  "a term is [iv, coeff]");
  requireRejected(simple(tiles, iota(R"({"step": 1})")),
                  "unknown field 'step'");
  requireRejected(simple(tiles, iota("[0]")),
                  "field 'offset': expected an object");

  auto stt = [&](const std::string &engine, const std::string &fields) {
    return R"({"op": "scalar_tensor_tensor", "engine": ")" + engine +
           R"(", "a": )" + t + R"(, "b": )" + t + R"(, "dst": )" + t + fields +
           "}";
  };
  const std::string ops = R"(, "alu_op0": "subtract", "alu_op1": "multiply")";
  REQUIRE_NOTHROW(
      Program::parse(
          simple(tiles, stt("vector", ops + R"(, "scalar": )" + col)))
          .verify(trn2()));
  REQUIRE_NOTHROW(
      Program::parse(simple(tiles, stt("gpsimd", ops + R"(, "imm": 2)")))
          .verify(trn2()));
  requireRejected(simple(tiles, stt("vector", ops)),
                  "exactly one of 'scalar' and 'imm'");
  requireRejected(
      simple(tiles, stt("vector", ops + R"(, "imm": 1, "scalar": )" + col)),
      "exactly one of 'scalar' and 'imm'");
  requireRejected(simple(tiles, stt("vector", ops + R"(, "scalar": )" +
                                                  view(2, "[4, 2]", "[8, 1]"))),
                  "operand 'scalar' must be [4, 1], got [4, 2]");
  requireRejected(simple(tiles, stt("scalar", ops + R"(, "imm": 1)")),
                  "engine 'scalar' cannot issue scalar_tensor_tensor");
  requireRejected(
      simple(tiles, stt("vector", R"(, "alu_op0": "add", "imm": 1)")),
      "missing field 'alu_op1'");
  requireRejected(simple(tiles, stt("vector", R"(, "alu_op0": "add",
                                    "alu_op1": "fma", "imm": 1)")),
                  "field 'alu_op1': unknown ALU op 'fma'");
  requireRejected(
      simple(tiles, stt("vector", ops + R"(, "alu_op": "add", "imm": 1)")),
      "unknown field 'alu_op'");
  requireRejected(simple(tiles, R"({"op": "scalar_tensor_tensor",
      "engine": "vector", "imm": 1, "a": )" +
                                    t + R"(, "b": )" +
                                    view(2, "[4, 4]", "[8, 1]") +
                                    R"(, "dst": )" + t + ops + "}"),
                  "shape mismatch");
}

TEST_CASE("MX matmuls are checked", "[program][reject]") {
  // fp8 [K, 4, F] operands with u8 [K / 8, F] scales, on trn3 (NC-v4) only.
  std::string tiles = kInOut + "," +
                      buffer(2, "sbuf", "scratch", "f8e4m3fn", "[128, 256]") +
                      "," + buffer(3, "psum", "scratch", "f32", "[64, 64]") +
                      "," + buffer(4, "sbuf", "scratch", "u8", "[32, 64]") +
                      "," + buffer(5, "sbuf", "scratch", "f32", "[16, 64]");
  auto mx = [&](const std::string &k, const std::string &scale,
                const std::string &moving) {
    std::string operand = view(2, "[" + k + ", 4, 64]", "[256, 1, 4]");
    std::string body = R"({"op": "matmul", "engine": "tensor",
        "stationary": )" + operand +
                       R"(, "moving": )" + operand + R"(, "dst": )" +
                       view(3, "[64, 64]", "[64, 1]") +
                       R"(, "stationary_scale": )" + scale + moving + "}";
    return [tiles, body](const std::string &target) {
      return programJson(tiles, "0", "1", body, target);
    };
  };
  std::string scales = view(4, "[16, 64]", "[64, 1]");
  std::string both = R"(, "moving_scale": )" + scales;
  REQUIRE_NOTHROW(Program::parse(mx("128", scales, both)("trn3"))
                      .verify(neuron::target::getTarget("trn3")));
  requireRejected(mx("128", scales, both)("trn2"),
                  "target 'trn2' has no MX matmul");
  requireRejected(mx("128", scales, "")("trn3"),
                  "takes both 'stationary_scale' and 'moving_scale'");
  requireRejected(mx("16", view(4, "[2, 64]", "[64, 1]"),
                     R"(, "moving_scale": )" + view(4, "[2, 64]", "[64, 1]"))(
                      "trn3"),
                  "multiple of 32 partitions, not 16");
  std::string f32Scales = view(5, "[16, 64]", "[64, 1]");
  requireRejected(
      mx("128", f32Scales, R"(, "moving_scale": )" + f32Scales)("trn3"),
      "'stationary_scale' must be a u8 sbuf buffer");
  std::string tall = view(4, "[32, 64]", "[64, 1]");
  requireRejected(mx("128", tall, R"(, "moving_scale": )" + tall)("trn3"),
                  "must be [16, 64] (a scale per 8 partitions)");
}

TEST_CASE("buffers, arguments and loops are checked", "[program][reject]") {
  std::string copy =
      copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]"));
  requireRejected(
      simple(kInOut + "," + buffer(1, "hbm", "internal", "f32", "[2]"), copy),
      "duplicate buffer id");
  requireRejected(simple(kInOut, copy, "1", "0"), "expected input");
  requireRejected(simple(kInOut, copy, "", "1"), "is not listed");
  requireRejected(simple(kInOut, copy, "0, 0", "1"), "listed twice");
  requireRejected(
      simple(kInOut + "," + buffer(2, "sbuf", "internal", "f32", "[4, 8]"),
             copy),
      "cannot live in sbuf");
  requireRejected(simple(kInOut + "," +
                             buffer(2, "hbm", "constant", "f32", "[4]",
                                    R"(, "data": "AAAA")"),
                         copy),
                  "3 bytes, expected 16");
  requireRejected(simple(kInOut + "," +
                             buffer(2, "hbm", "constant", "f32", "[4]",
                                    R"(, "data": "A!==")"),
                         copy),
                  "invalid base64");
  requireRejected(
      simple(kInOut + "," + buffer(2, "hbm", "constant", "f32", "[4]"), copy),
      "exactly one of 'data' and 'splat'");
  requireRejected(
      simple(kInOut + "," + buffer(2, "hbm", "internal", "f32", "[-1, 4]"),
             copy),
      "dimensions must be >= 0");
  // Empty HBM tensors are fine; empty tiles are not.
  REQUIRE_NOTHROW(
      Program::parse(
          simple(kInOut + "," + buffer(2, "hbm", "internal", "f32", "[0, 4]"),
                 copy))
          .verify(neuron::target::getTarget("trn2")));
  requireRejected(
      simple(kInOut + "," + buffer(2, "sbuf", "scratch", "f32", "[0, 4]"),
             copy),
      "dimensions must be >= 1");
  // Loops: a reused iv in a nested loop, a duplicate id, a zero count.
  requireRejected(simple(kInOut, R"({"loop": 0, "count": 2, "body": [
                      {"loop": 0, "count": 2, "body": [)" +
                                     copy + "]}]}"),
                  "already used by an enclosing loop");
  requireRejected(
      simple(kInOut, R"({"loop": 0, "count": 1, "body": [)" + copy +
                         R"(]}, {"loop": 0, "count": 1, "body": [)" + copy +
                         "]}"),
      "not unique");
  requireRejected(simple(kInOut, R"({"loop": 0, "count": 0, "body": []})"),
                  "must be >= 1");
  // Deep nesting is refused without exhausting the stack: by the loop check,
  // and beyond the JSON reader's depth limit by the reader.
  auto nested = [&](int depth) {
    std::string deep;
    for (int i = 0; i < depth; ++i)
      deep += R"({"loop": )" + std::to_string(i) + R"(, "count": 1, "body": [)";
    deep += copy;
    for (int i = 0; i < depth; ++i)
      deep += "]}";
    return simple(kInOut, deep);
  };
  requireRejected(nested(100), "nested deeper than");
  requireRejected(nested(5000), "too deep");
}

TEST_CASE("programs built in memory are verified too", "[program]") {
  Program program = Program::parse(fullProgram());
  REQUIRE_NOTHROW(program.verify(trn2()));
  Instruction &copy = program.body.back().inst;
  copy.src.reset();
  CHECK(contains(errorOf([&] { program.verify(trn2()); }),
                 "missing operand 'src'"));
  copy.src = copy.dst;
  copy.table = copy.dst;
  CHECK(contains(errorOf([&] { program.verify(trn2()); }),
                 "unexpected operand 'table'"));
  copy.table.reset();
  copy.offset = AffineExpr{0, {{7, 1}}};
  CHECK(contains(errorOf([&] { program.verify(trn2()); }),
                 "unexpected field 'offset'"));
}

//===----------------------------------------------------------------------===//
// Explicit synchronisation and on-chip addresses
//===----------------------------------------------------------------------===//

namespace {

using neuron::test::explicitSync;
using neuron::test::withWaits;

std::string address(int64_t bytes) {
  return R"(, "address": )" + std::to_string(bytes);
}

/// Load a tile into SBUF, copy it on VectorE, store the copy: instructions
/// 0, 1, 2, each waiting for its producer and for the previous iteration's
/// readers and writers of what it writes. Two tiles of different dtypes
/// share address 0.
std::string syncedProgram() {
  std::string buffers =
      kInOut + "," + buffer(2, "sbuf", "scratch", "f32", "[4, 8]", address(0)) +
      "," + buffer(3, "sbuf", "scratch", "bf16", "[4, 16]", address(0)) + "," +
      buffer(4, "sbuf", "scratch", "f32", "[4, 8]", address(64)) + "," +
      buffer(5, "psum", "scratch", "f32", "[4, 8]", address(2048));
  std::string tile = view(2, "[4, 8]", "[8, 1]");
  std::string body =
      R"({"loop": 0, "count": 2, "body": [)" +
      withWaits(copyInOut(view(0, "[4, 8]", "[8, 1]"), tile), "[0, 1]") + "," +
      withWaits(R"({"op": "copy", "engine": "vector", "src": )" + tile +
                    R"(, "dst": )" + view(4, "[4, 8]", "[8, 1]") + "}",
                "[0, 2]") +
      "," +
      withWaits(
          copyInOut(view(4, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]")),
          "[1, 2]") +
      "]}";
  return explicitSync(simple(buffers, body));
}

/// syncedProgram() with `from` replaced by `to` (which must occur).
std::string syncedWith(const std::string &from, const std::string &to) {
  std::string text = syncedProgram();
  size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

} // namespace

TEST_CASE("sync, waits and addresses parse and round-trip", "[program][sync]") {
  Program program = Program::parse(syncedProgram());
  REQUIRE_NOTHROW(program.verify(trn2()));
  CHECK(program.explicitSync);
  REQUIRE(program.buffers.size() == 6);
  CHECK(!program.buffers[0].address);
  CHECK(program.buffers[2].address == 0);
  CHECK(program.buffers[4].address == 64);
  CHECK(program.buffers[5].address == 2048);
  const std::vector<Node> &loop = program.body[0].body;
  REQUIRE(loop.size() == 3);
  CHECK(loop[0].inst.waits == std::vector<int64_t>{0, 1});
  CHECK(loop[1].inst.waits == std::vector<int64_t>{0, 2});
  CHECK(loop[2].inst.waits == std::vector<int64_t>{1, 2});

  std::string once = program.toJson();
  CHECK(contains(once, R"("sync":"explicit")"));
  CHECK(contains(once, R"("waits":[1,2])"));
  CHECK(contains(once, R"("address":2048)"));
  Program again = Program::parse(once);
  REQUIRE_NOTHROW(again.verify(trn2()));
  CHECK(again.toJson() == once);
  CHECK(again.explicitSync);
  CHECK(again.buffers[4].address == 64);
  CHECK(again.body[0].body[2].inst.waits == std::vector<int64_t>{1, 2});

  // Derived sync and no addresses write none of the fields.
  std::string plain = Program::parse(fullProgram()).toJson();
  CHECK(!contains(plain, "\"sync\":"));
  CHECK(!contains(plain, "\"waits\":"));
  CHECK(!contains(plain, "\"address\":"));
  CHECK(!Program::parse(plain).explicitSync);
}

TEST_CASE("sync and waits are checked", "[program][sync][reject]") {
  requireRejected(syncedWith(R"("sync": "explicit")", R"("sync": "derived")"),
                  "field 'sync': expected \"explicit\"");
  requireRejected(syncedWith(R"("sync": "explicit")", R"("sync": true)"),
                  "field 'sync': expected a string");
  requireRejected(syncedWith(R"("waits": [0, 2])", R"("waits": [-1])"),
                  "field 'waits'[0]: must be a non-negative instruction index");
  requireRejected(syncedWith(R"("waits": [0, 2])", R"("waits": [0.5])"),
                  "field 'waits'[0]: expected an integer");
  requireRejected(syncedWith(R"("waits": [0, 2])", R"("waits": 0)"),
                  "field 'waits': expected an array");
  // Indices are static instruction indices: this program has 3 (0..2).
  REQUIRE_NOTHROW(
      Program::parse(syncedWith(R"("waits": [0, 2])", R"("waits": [2, 1])"))
          .verify(trn2()));
  requireRejected(syncedWith(R"("waits": [0, 2])", R"("waits": [3])"),
                  "field 'waits': 3 is not an instruction index (the "
                  "program's 3 instructions are numbered from 0");
  requireRejected(syncedWith(R"("waits": [1, 2])", R"("waits": [2, 1, 2])"),
                  "field 'waits': instruction 2 is listed twice");
  // An instruction may wait for its own earlier instances.
  REQUIRE_NOTHROW(
      Program::parse(syncedWith(R"("waits": [0, 2])", R"("waits": [1, 0, 2])"))
          .verify(trn2()));
  requireRejected(syncedWith(R"("sync": "explicit", )", ""),
                  R"(field 'waits': waits need "sync": "explicit")");
  // Programs built in memory get the same checks.
  Program program = Program::parse(syncedProgram());
  program.body[0].body[1].inst.waits = {-1};
  CHECK(contains(errorOf([&] { program.verify(trn2()); }),
                 "-1 is not an instruction index"));
  program.body[0].body[1].inst.waits = {0, 2};
  program.explicitSync = false;
  CHECK(contains(errorOf([&] { program.verify(trn2()); }),
                 R"(waits need "sync": "explicit")"));
}

TEST_CASE("on-chip addresses are checked", "[program][sync][reject]") {
  requireRejected(syncedWith(address(64), R"(, "address": -64)"),
                  "field 'address': must be a non-negative byte offset");
  requireRejected(syncedWith(address(64), R"(, "address": "64")"),
                  "field 'address': expected an integer");
  // All on-chip buffers or none.
  requireRejected(syncedWith(address(64), ""),
                  "either every on-chip buffer has an 'address' or none does; "
                  "buffers[2] ('b2', id 2) has one, buffers[4] ('b4', id 4) "
                  "has none");
  requireRejected(
      syncedWith(R"("kind": "input", "dtype": "f32", "shape": [4, 8])",
                 R"("kind": "input", "dtype": "f32", "shape": [4, 8],
                    "address": 0)"),
      "buffers[0] ('b0', id 0) field 'address': only sbuf and psum buffers "
      "have an address");

  // Each buffer fits on its own: trn2 has 212728 SBUF and 16384 PSUM bytes
  // per partition; [4, 1024] f32 is 4096 bytes per partition.
  auto placed = [](const std::string &space, int64_t at) {
    return simple(
        kInOut + "," +
            buffer(2, space, "scratch", "f32", "[4, 1024]", address(at)),
        copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]")));
  };
  REQUIRE_NOTHROW(Program::parse(placed("sbuf", 212728 - 4096)).verify(trn2()));
  requireRejected(placed("sbuf", 212728 - 4095),
                  "buffers[2] ('b2', id 2) field 'address': bytes [208633, "
                  "212729) per partition do not fit the 212728 bytes of SBUF "
                  "per partition of trn2");
  REQUIRE_NOTHROW(Program::parse(placed("psum", 16384 - 4096)).verify(trn2()));
  requireRejected(placed("psum", 16384 - 4095),
                  "bytes [12289, 16385) per partition do not fit the 16384 "
                  "bytes of PSUM");

  // Buffers may share addresses, so together they may exceed the capacity;
  // without addresses the sum still may not.
  auto twoBig = [](const std::string &extraA, const std::string &extraB) {
    return simple(
        kInOut + "," +
            buffer(2, "sbuf", "scratch", "f32", "[128, 40000]", extraA) + "," +
            buffer(3, "sbuf", "scratch", "bf16", "[128, 80000]", extraB),
        copyInOut(view(0, "[4, 8]", "[8, 1]"), view(1, "[4, 8]", "[8, 1]")));
  };
  REQUIRE_NOTHROW(
      Program::parse(twoBig(address(0), address(0))).verify(trn2()));
  REQUIRE_NOTHROW(
      Program::parse(twoBig(address(0), address(40000))).verify(trn2()));
  requireRejected(twoBig(address(0), address(52729)),
                  "bytes [52729, 212729) per partition do not fit");
  requireRejected(twoBig("", ""), "SBUF scratch needs 320000 bytes");
}

TEST_CASE("size parameters are checked", "[program][sizes][reject]") {
  auto generic = [](const std::string &params, const std::string &shape,
                    const std::string &count = "1") {
    std::string json =
        programJson(buffer(0, "hbm", "input", "f32", shape) + "," +
                        buffer(1, "hbm", "output", "f32", shape),
                    "0", "1",
                    R"({"loop": 0, "count": )" + count + R"(, "body": [
             {"op": "dma_copy", "engine": "sync", "src": )" +
                        view(0, "[1, 4]", "[4, 1]") + R"(, "dst": )" +
                        view(1, "[1, 4]", "[4, 1]") + "}]}");
    return params.empty() ? json
                          : json.insert(1, R"("params": )" + params + ", ");
  };
  const std::string one = R"([{"name": "s0", "min": 2, "max": 8}])";
  SizeEnv four = {{"s0", 4}};

  Program program =
      Program::parse(generic(one, R"(["s0", 4])", R"("s0 - 3")"), &four);
  CHECK(program.buffers[0].shape == std::vector<int64_t>{4, 4});
  CHECK(program.body[0].count == 1);
  REQUIRE(program.params.size() == 1);
  CHECK(program.params[0].max == 8);
  program.verify(trn2());
  // The instance serializes as a static program.
  CHECK(Program::parse(program.toJson()).buffers[0].shape ==
        std::vector<int64_t>{4, 4});
  CHECK(Program::readParams(generic(one, R"(["s0", 4])"))[0].min == 2);
  CHECK(Program::readParams(generic("", "[4, 4]")).empty());

  auto rejected = [&](const std::string &json, const SizeEnv *sizes) {
    return errorOf([&] { Program::parse(json, sizes); });
  };
  std::string shaped = generic(one, R"(["s0", 4])");
  CHECK(contains(rejected(shaped, nullptr),
                 "size expression 's0' in a program without size parameters' "
                 "values"));
  SizeEnv none;
  CHECK(contains(rejected(shaped, &none), "no value for size parameter 's0'"));
  SizeEnv big = {{"s0", 9}};
  CHECK(contains(rejected(shaped, &big), "'s0' = 9 is outside [2, 8]"));
  SizeEnv extra = {{"s0", 4}, {"s1", 1}};
  CHECK(contains(rejected(shaped, &extra), "no size parameter 's1'"));
  CHECK(contains(rejected(generic("", "[4, 4]"), &four),
                 "without size parameters"));
  CHECK(contains(rejected(generic(R"([{"name": "min"}])", "[4, 4]"), &four),
                 "'min' is not a name"));
  CHECK(contains(
      rejected(generic(R"([{"name": "s0"}, {"name": "s0"}])", "[4, 4]"), &four),
      "duplicate 's0'"));
  CHECK(contains(
      rejected(generic(R"([{"name": "s0", "min": 5, "max": 4}])", "[4, 4]"),
               &four),
      "max is below min"));
  CHECK(contains(rejected(generic(one, R"(["s0 +", 4])"), &four),
                 "buffers[0] field 'shape'[0]: size expression 's0 +'"));
  CHECK(
      contains(rejected(generic(one, R"x(["floordiv(4, s0 - 4)", 4])x"), &four),
               "not positive"));
  std::string onChip = programJson(
      buffer(0, "sbuf", "scratch", "f32", R"(["s0", 4])"), "", "", "");
  CHECK(
      contains(rejected(onChip.insert(1, R"("params": )" + one + ", "), &four),
               "an on-chip buffer's shape is static"));
}

TEST_CASE("a wait with a size expression holds where it is positive",
          "[program][sizes][sync]") {
  std::string copy = R"({"op": "dma_copy", "engine": "sync", "src": )" +
                     view(0, "[1, 4]", "[4, 1]") + R"(, "dst": )" +
                     view(1, "[1, 4]", "[4, 1]");
  // #2 waits on #0 at every size, on #1 where s0 is odd.
  auto programWith = [&](const std::string &waits) {
    std::string json = explicitSync(programJson(
        buffer(0, "hbm", "input", "f32", "[4, 4]") + "," +
            buffer(1, "hbm", "output", "f32", "[4, 4]"),
        "0", "1",
        copy + "}, " + copy + "}, " + copy + R"(, "waits": )" + waits + "}"));
    json.insert(1, R"("params": [{"name": "s0", "min": 1}], )");
    return json;
  };
  std::string json = programWith(R"j([0, {"on": 1, "when": "mod(s0, 2)"}])j");
  SizeEnv odd = {{"s0", 3}}, even = {{"s0", 4}};
  CHECK(Program::parse(json, &odd).body[2].inst.waits ==
        std::vector<int64_t>{0, 1});
  CHECK(Program::parse(json, &even).body[2].inst.waits ==
        std::vector<int64_t>{0});
  // Only size-generic programs have them; the entry's fields are checked.
  CHECK(contains(errorOf([&] { Program::parse(json); }),
                 "size expression 'mod(s0, 2)' in a program without size "
                 "parameters' values"));
  CHECK(contains(
      errorOf([&] { Program::parse(programWith(R"([{"on": 1}])"), &odd); }),
      "'when'"));
  CHECK(contains(errorOf([&] {
                   Program::parse(programWith(R"([{"on": -1, "when": "1"}])"),
                                  &odd);
                 }),
                 "must be a non-negative instruction index"));
  CHECK(contains(errorOf([&] {
                   Program::parse(
                       programWith(R"([{"on": 1, "when": "1", "if": 2}])"),
                       &odd);
                 }),
                 "if"));
}

TEST_CASE("an instance drops the loops it runs zero times and renumbers waits",
          "[program][sizes][sync]") {
  std::string copy = R"({"op": "dma_copy", "engine": "sync", "src": )" +
                     view(0, "[1, 4]", "[4, 1]") + R"(, "dst": )" +
                     view(1, "[1, 4]", "[4, 1]");
  // Instructions #0, #1 (in a loop of s0 - 2 iterations), #2 (waits on both).
  std::string body = copy + "}, " +
                     R"({"loop": 0, "count": "s0 - 2", "body": [)" + copy +
                     R"(, "waits": [0]}]}, )" + copy + R"(, "waits": [0, 1]})";
  std::string json = explicitSync(
      programJson(buffer(0, "hbm", "input", "f32", "[4, 4]") + "," +
                      buffer(1, "hbm", "output", "f32", "[4, 4]"),
                  "0", "1", body));
  json.insert(1, R"("params": [{"name": "s0", "min": 2}], )");

  SizeEnv three = {{"s0", 3}};
  Program running = Program::parse(json, &three);
  CHECK(running.numInstructions() == 3);
  CHECK(running.body[2].inst.waits == std::vector<int64_t>{0, 1});
  running.verify(trn2());

  SizeEnv two = {{"s0", 2}};
  Program empty = Program::parse(json, &two);
  REQUIRE(empty.body.size() == 2);
  CHECK(empty.numInstructions() == 2);
  CHECK(empty.body[1].inst.waits == std::vector<int64_t>{0});
  empty.verify(trn2());
  // A static program's loops still run at least once.
  std::string zero = programJson(
      buffer(0, "hbm", "input", "f32", "[4, 4]") + "," +
          buffer(1, "hbm", "output", "f32", "[4, 4]"),
      "0", "1", R"({"loop": 0, "count": 0, "body": [)" + copy + "}]}");
  CHECK(contains(errorOf([&] { Program::parse(zero).verify(trn2()); }),
                 "field 'count': must be >= 1, got 0"));
}
