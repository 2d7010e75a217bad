//===- FuzzFxImport.cpp - libFuzzer target: FX graph documents ------------===//
//
// A document is checked (which nodes the importer can lower) and, when every
// node can, compiled through the whole pipeline. Both report bad input in
// their results (the check's reasons, CompileResult::error); an exception
// that escapes, a crash or a sanitizer report is a bug.
//
//===----------------------------------------------------------------------===//

#include "compiler/pipeline/Pipeline.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string document(reinterpret_cast<const char *>(data), size);
  auto unsupported = neuron::compiler::checkFxGraph(document);
  if (unsupported.empty())
    neuron::compiler::compileFxGraph(document, {});
  return 0;
}
