//===- SizeExpr.h - integer expressions over size parameters ----*- C++ -*-===//
//
// The one grammar of sizes in FX documents and kernel programs (issue #16):
//
//   expr   := term (('+' | '-') term)*
//   term   := factor ('*' factor)*
//   factor := INT | NAME | '(' expr ')' | '-' factor
//           | ('floordiv' | 'ceildiv' | 'mod' | 'min' | 'max') '(' expr ','
//           expr ')'
//
// NAME is a size parameter (s0, s1, ... as Dynamo names them); floordiv,
// ceildiv and mod use floor semantics. MLIR-free: the importer, the emitter
// and the runtime share it.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_PROGRAM_SIZEEXPR_H
#define NEURON_RUNTIME_PROGRAM_SIZEEXPR_H

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace neuron::runtime {

struct SizeExpr {
  enum class Kind {
    Const,
    Param,
    Add,
    Sub,
    Mul,
    Neg,
    FloorDiv,
    CeilDiv,
    Mod,
    Min,
    Max
  };
  Kind kind = Kind::Const;
  int64_t value = 0;
  std::string name;
  std::vector<SizeExpr> operands;
};

using SizeEnv = std::map<std::string, int64_t, std::less<>>;

/// Throws Error on a malformed expression.
SizeExpr parseSizeExpr(std::string_view text);
/// Throws Error on an unknown name, an overflow or a divisor <= 0.
int64_t evaluate(const SizeExpr &e, const SizeEnv &env);
/// Canonical text, which parses back to the same expression.
std::string toString(const SizeExpr &e);

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_PROGRAM_SIZEEXPR_H
