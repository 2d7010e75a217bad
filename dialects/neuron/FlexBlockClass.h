//===- FlexBlockClass.h - FlexAttention block-class codes -------*- C++ -*-===//
//
// The codes of a neuron.flex_attention op's `blocks` (the BlockMask's block
// classes): defined once here, where the op's verifier, the flex lowering
// and the Python bindings (the codes flex.py and sdpa.py read) all see them.
//
//===----------------------------------------------------------------------===//

#ifndef DIALECTS_NEURON_FLEXBLOCKCLASS_H
#define DIALECTS_NEURON_FLEXBLOCKCLASS_H

#include <cstdint>

namespace mlir::neuron::flex {

/// A block of the score matrix: no key of it is kept, some are (mask_mod
/// decides per element), or all are.
enum class Kind : int8_t { masked = 0, partial = 1, full = 2 };

/// The codes in ascending order: a `blocks` value is valid when it lies
/// between the first and the last.
inline constexpr Kind kFirstKind = Kind::masked, kLastKind = Kind::full;

} // namespace mlir::neuron::flex

#endif // DIALECTS_NEURON_FLEXBLOCKCLASS_H
