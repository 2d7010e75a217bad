//===- SizeExpr.h - Integer expressions over size parameters ----*- C++ -*-===//
//
// A size-generic kernel program (docs/PROGRAM_FORMAT.md, "Size parameters")
// writes loop counts, view extents and offsets as expressions over named
// sizes, such as "ceildiv(s0, 128)"; the FX graph document writes symbolic
// shapes the same way. This is their one grammar, parser and evaluator, shared
// by the compiler's importer and emitter and by the runtime (no MLIR):
//
//   expr   := term (('+' | '-') term)*
//   term   := factor ('*' factor)*
//   factor := INT | NAME | '(' expr ')' | '-' factor
//           | ('floordiv' | 'ceildiv' | 'mod' | 'min' | 'max') '(' expr ','
//           expr ')'
//
// Division and modulo round toward negative infinity and need a positive
// divisor; every operation checks int64 overflow.
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

/// The value of each size parameter, by name.
using SizeEnv = std::map<std::string, int64_t, std::less<>>;

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
  int64_t value = 0;              // Const
  std::string name;               // Param
  std::vector<SizeExpr> operands; // one for Neg, two for the others

  static SizeExpr constant(int64_t value);
  static SizeExpr param(std::string name);
  static SizeExpr binary(Kind kind, SizeExpr lhs, SizeExpr rhs);
};

/// Parses `text`; throws Error naming the position of a syntax error or an
/// integer that does not fit int64.
SizeExpr parseSizeExpr(std::string_view text);

/// Evaluates `expr` with the parameters' values; throws Error on a parameter
/// `sizes` does not give, int64 overflow, or a divisor that is not positive.
int64_t evaluate(const SizeExpr &expr, const SizeEnv &sizes);

/// The expression in the grammar above, with no redundant parentheses;
/// parseSizeExpr(toString(e)) gives back e.
std::string toString(const SizeExpr &expr);

/// Whether `name` can name a size parameter: an identifier that is not one
/// of the grammar's functions.
bool isSizeParamName(std::string_view name);

/// The parameter names `expr` uses, each once, in first-use order.
std::vector<std::string> paramsOf(const SizeExpr &expr);

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_PROGRAM_SIZEEXPR_H
