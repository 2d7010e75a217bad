//===- EmbeddedTargets.h - Target files compiled into the library -*- C++ -*-//
//
// The definitions are generated at build time by EmbedTargets.cmake from the
// *.json files in this directory.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_TARGET_EMBEDDEDTARGETS_H
#define NEURON_RUNTIME_TARGET_EMBEDDEDTARGETS_H

#include <cstddef>

namespace neuron::target::detail {

struct EmbeddedTarget {
  const char *name;
  const char *json;
};

extern const EmbeddedTarget kEmbeddedTargets[];
extern const size_t kNumEmbeddedTargets;

} // namespace neuron::target::detail

#endif // NEURON_RUNTIME_TARGET_EMBEDDEDTARGETS_H
