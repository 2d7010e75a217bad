//===- SizeExpr.cpp - Integer expressions over size parameters ------------===//

#include "runtime/program/SizeExpr.h"

#include "runtime/program/Error.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>

namespace neuron::runtime {

SizeExpr SizeExpr::constant(int64_t value) {
  SizeExpr e;
  e.kind = Kind::Const;
  e.value = value;
  return e;
}

SizeExpr SizeExpr::param(std::string name) {
  SizeExpr e;
  e.kind = Kind::Param;
  e.name = std::move(name);
  return e;
}

SizeExpr SizeExpr::binary(Kind kind, SizeExpr lhs, SizeExpr rhs) {
  SizeExpr e;
  e.kind = kind;
  e.operands.push_back(std::move(lhs));
  e.operands.push_back(std::move(rhs));
  return e;
}

namespace {

using Kind = SizeExpr::Kind;

/// The functions written `name(a, b)`.
constexpr std::pair<const char *, Kind> kFunctions[] = {
    {"floordiv", Kind::FloorDiv}, {"ceildiv", Kind::CeilDiv},
    {"mod", Kind::Mod},           {"min", Kind::Min},
    {"max", Kind::Max},
};

class Parser {
public:
  explicit Parser(std::string_view text) : text(text) {}

  SizeExpr parseAll() {
    SizeExpr e = expr();
    skipSpace();
    if (pos != text.size())
      fail("unexpected '" + std::string(1, text[pos]) + "'");
    return e;
  }

private:
  std::string_view text;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string &what) const {
    throw Error("size expression '" + std::string(text) + "': " + what +
                " at position " + std::to_string(pos));
  }

  void skipSpace() {
    while (pos < text.size() &&
           std::isspace(static_cast<unsigned char>(text[pos])))
      ++pos;
  }

  bool accept(char c) {
    skipSpace();
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!accept(c))
      fail(std::string("expected '") + c + "'");
  }

  SizeExpr expr() {
    SizeExpr lhs = term();
    while (true) {
      if (accept('+'))
        lhs = SizeExpr::binary(Kind::Add, std::move(lhs), term());
      else if (accept('-'))
        lhs = SizeExpr::binary(Kind::Sub, std::move(lhs), term());
      else
        return lhs;
    }
  }

  SizeExpr term() {
    SizeExpr lhs = factor();
    while (accept('*'))
      lhs = SizeExpr::binary(Kind::Mul, std::move(lhs), factor());
    return lhs;
  }

  SizeExpr factor() {
    skipSpace();
    if (pos == text.size())
      fail("unexpected end");
    char c = text[pos];
    if (accept('(')) {
      SizeExpr e = expr();
      expect(')');
      return e;
    }
    if (accept('-')) {
      SizeExpr e;
      e.kind = Kind::Neg;
      e.operands.push_back(factor());
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t value = 0;
      while (pos < text.size() &&
             std::isdigit(static_cast<unsigned char>(text[pos]))) {
        if (__builtin_mul_overflow(value, int64_t(10), &value) ||
            __builtin_add_overflow(value, int64_t(text[pos] - '0'), &value))
          fail("integer does not fit int64");
        ++pos;
      }
      return SizeExpr::constant(value);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos;
      while (pos < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[pos])) ||
              text[pos] == '_'))
        ++pos;
      std::string name(text.substr(start, pos - start));
      if (!accept('('))
        return SizeExpr::param(std::move(name));
      auto fn = std::find_if(std::begin(kFunctions), std::end(kFunctions),
                             [&](const auto &f) { return name == f.first; });
      if (fn == std::end(kFunctions))
        fail("unknown function '" + name + "'");
      SizeExpr lhs = expr();
      expect(',');
      SizeExpr rhs = expr();
      expect(')');
      return SizeExpr::binary(fn->second, std::move(lhs), std::move(rhs));
    }
    fail("unexpected '" + std::string(1, c) + "'");
  }
};

[[noreturn]] void overflow(const SizeExpr &expr) {
  throw Error("size expression '" + toString(expr) + "' overflows int64");
}

int64_t floorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

/// Binding strength for printing: sums, products, then everything else.
int precedence(Kind kind) {
  switch (kind) {
  case Kind::Add:
  case Kind::Sub:
    return 1;
  case Kind::Mul:
    return 2;
  default:
    return 3;
  }
}

void print(const SizeExpr &e, std::string &out) {
  auto operand = [&](const SizeExpr &child, int minPrecedence) {
    bool parens = precedence(child.kind) < minPrecedence ||
                  (child.kind == Kind::Const && child.value < 0);
    if (parens)
      out += '(';
    print(child, out);
    if (parens)
      out += ')';
  };
  switch (e.kind) {
  case Kind::Const:
    out += std::to_string(e.value);
    return;
  case Kind::Param:
    out += e.name;
    return;
  case Kind::Neg:
    out += '-';
    operand(e.operands[0], 3);
    return;
  case Kind::Add:
  case Kind::Sub:
    operand(e.operands[0], 1);
    out += e.kind == Kind::Add ? " + " : " - ";
    operand(e.operands[1], 2); // a - (b + c) keeps its parentheses
    return;
  case Kind::Mul:
    operand(e.operands[0], 2);
    out += '*';
    operand(e.operands[1], 3);
    return;
  case Kind::FloorDiv:
  case Kind::CeilDiv:
  case Kind::Mod:
  case Kind::Min:
  case Kind::Max:
    for (const auto &[name, kind] : kFunctions)
      if (kind == e.kind)
        out += name;
    out += '(';
    print(e.operands[0], out);
    out += ", ";
    print(e.operands[1], out);
    out += ')';
    return;
  }
}

void collectParams(const SizeExpr &e, std::vector<std::string> &names) {
  if (e.kind == Kind::Param &&
      std::find(names.begin(), names.end(), e.name) == names.end())
    names.push_back(e.name);
  for (const SizeExpr &child : e.operands)
    collectParams(child, names);
}

} // namespace

SizeExpr parseSizeExpr(std::string_view text) {
  return Parser(text).parseAll();
}

int64_t evaluate(const SizeExpr &expr, const SizeEnv &sizes) {
  switch (expr.kind) {
  case Kind::Const:
    return expr.value;
  case Kind::Param: {
    auto it = sizes.find(expr.name);
    if (it == sizes.end())
      throw Error("no value for size parameter '" + expr.name + "'");
    return it->second;
  }
  case Kind::Neg: {
    int64_t v = evaluate(expr.operands[0], sizes), r = 0;
    if (__builtin_sub_overflow(int64_t(0), v, &r))
      overflow(expr);
    return r;
  }
  default:
    break;
  }
  int64_t a = evaluate(expr.operands[0], sizes);
  int64_t b = evaluate(expr.operands[1], sizes);
  int64_t r = 0;
  switch (expr.kind) {
  case Kind::Add:
    if (__builtin_add_overflow(a, b, &r))
      overflow(expr);
    return r;
  case Kind::Sub:
    if (__builtin_sub_overflow(a, b, &r))
      overflow(expr);
    return r;
  case Kind::Mul:
    if (__builtin_mul_overflow(a, b, &r))
      overflow(expr);
    return r;
  case Kind::FloorDiv:
  case Kind::CeilDiv:
  case Kind::Mod: {
    if (b <= 0)
      throw Error("size expression '" + toString(expr) + "': divisor " +
                  std::to_string(b) + " is not positive");
    int64_t q = floorDiv(a, b);
    if (expr.kind == Kind::FloorDiv)
      return q;
    int64_t rem = a - q * b; // in [0, b): no overflow
    if (expr.kind == Kind::Mod)
      return rem;
    return rem == 0 ? q : q + 1;
  }
  case Kind::Min:
    return std::min(a, b);
  case Kind::Max:
    return std::max(a, b);
  case Kind::Const:
  case Kind::Param:
  case Kind::Neg:
    break;
  }
  return 0; // unreachable: every kind returned above
}

std::string toString(const SizeExpr &expr) {
  std::string out;
  print(expr, out);
  return out;
}

bool isSizeParamName(std::string_view name) {
  if (name.empty() ||
      !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_'))
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
      return false;
  return std::none_of(std::begin(kFunctions), std::end(kFunctions),
                      [&](const auto &f) { return name == f.first; });
}

std::vector<std::string> paramsOf(const SizeExpr &expr) {
  std::vector<std::string> names;
  collectParams(expr, names);
  return names;
}

} // namespace neuron::runtime
