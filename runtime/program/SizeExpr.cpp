//===- SizeExpr.cpp - parse, evaluate and print size expressions ----------===//

#include "runtime/program/SizeExpr.h"

#include "runtime/program/Error.h"

#include <cctype>

namespace neuron::runtime {
namespace {

using Kind = SizeExpr::Kind;

SizeExpr node(Kind kind, std::vector<SizeExpr> operands) {
  SizeExpr e;
  e.kind = kind;
  e.operands = std::move(operands);
  return e;
}

/// Recursive descent over the grammar in SizeExpr.h; nesting is bounded so
/// a hostile document cannot exhaust the stack.
class Parser {
public:
  explicit Parser(std::string_view text) : text(text) {}

  SizeExpr parse() {
    SizeExpr e = expr(0);
    skipSpace();
    if (pos != text.size())
      fail("unexpected '" + std::string(1, text[pos]) + "'");
    return e;
  }

private:
  [[noreturn]] void fail(const std::string &why) {
    throw Error("size expression '" + std::string(text) + "': " + why);
  }
  void skipSpace() {
    while (pos < text.size() && std::isspace((unsigned char)text[pos]))
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
  SizeExpr expr(int depth) {
    if (depth > 64)
      fail("nested too deeply");
    SizeExpr e = term(depth);
    for (;;) {
      if (accept('+'))
        e = node(Kind::Add, {std::move(e), term(depth)});
      else if (accept('-'))
        e = node(Kind::Sub, {std::move(e), term(depth)});
      else
        return e;
    }
  }
  SizeExpr term(int depth) {
    SizeExpr e = factor(depth);
    while (accept('*'))
      e = node(Kind::Mul, {std::move(e), factor(depth)});
    return e;
  }
  SizeExpr factor(int depth) {
    if (depth > 64)
      fail("nested too deeply");
    skipSpace();
    if (pos == text.size())
      fail("unexpected end");
    char c = text[pos];
    if (accept('(')) {
      SizeExpr e = expr(depth + 1);
      expect(')');
      return e;
    }
    if (accept('-'))
      return node(Kind::Neg, {factor(depth + 1)});
    if (std::isdigit((unsigned char)c)) {
      int64_t v = 0;
      while (pos < text.size() && std::isdigit((unsigned char)text[pos])) {
        int digit = text[pos++] - '0';
        if (v > (INT64_MAX - digit) / 10)
          fail("integer overflows 64 bits");
        v = v * 10 + digit;
      }
      SizeExpr e;
      e.value = v;
      return e;
    }
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t start = pos;
      while (pos < text.size() &&
             (std::isalnum((unsigned char)text[pos]) || text[pos] == '_'))
        ++pos;
      std::string name(text.substr(start, pos - start));
      static const std::pair<const char *, Kind> functions[] = {
          {"floordiv", Kind::FloorDiv},
          {"ceildiv", Kind::CeilDiv},
          {"mod", Kind::Mod},
          {"min", Kind::Min},
          {"max", Kind::Max}};
      for (auto [fn, kind] : functions)
        if (name == fn) {
          expect('(');
          SizeExpr l = expr(depth + 1);
          expect(',');
          SizeExpr r = expr(depth + 1);
          expect(')');
          return node(kind, {std::move(l), std::move(r)});
        }
      SizeExpr e;
      e.kind = Kind::Param;
      e.name = std::move(name);
      return e;
    }
    fail("unexpected '" + std::string(1, c) + "'");
  }

  std::string_view text;
  size_t pos = 0;
};

int64_t checked(bool overflow, int64_t v) {
  if (overflow)
    throw Error("size expression overflows 64 bits");
  return v;
}

int64_t floorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

} // namespace

SizeExpr parseSizeExpr(std::string_view text) { return Parser(text).parse(); }

int64_t evaluate(const SizeExpr &e, const SizeEnv &env) {
  auto arg = [&](size_t i) { return evaluate(e.operands.at(i), env); };
  int64_t r = 0;
  switch (e.kind) {
  case Kind::Const:
    return e.value;
  case Kind::Param: {
    auto it = env.find(e.name);
    if (it == env.end())
      throw Error("size expression uses unknown size '" + e.name + "'");
    return it->second;
  }
  case Kind::Add:
    return checked(__builtin_add_overflow(arg(0), arg(1), &r), r);
  case Kind::Sub:
    return checked(__builtin_sub_overflow(arg(0), arg(1), &r), r);
  case Kind::Mul:
    return checked(__builtin_mul_overflow(arg(0), arg(1), &r), r);
  case Kind::Neg:
    return checked(__builtin_sub_overflow(int64_t(0), arg(0), &r), r);
  case Kind::FloorDiv:
  case Kind::CeilDiv:
  case Kind::Mod: {
    int64_t a = arg(0), b = arg(1);
    if (b <= 0)
      throw Error("size expression divides by " + std::to_string(b));
    if (e.kind == Kind::FloorDiv)
      return floorDiv(a, b);
    if (e.kind == Kind::CeilDiv)
      return -floorDiv(-a, b); // a > INT64_MIN: b > 0 keeps -a finite
    return a - floorDiv(a, b) * b;
  }
  case Kind::Min:
    return std::min(arg(0), arg(1));
  case Kind::Max:
    return std::max(arg(0), arg(1));
  }
  throw Error("size expression of an unknown kind");
}

std::string toString(const SizeExpr &e) {
  auto arg = [&](size_t i) { return toString(e.operands.at(i)); };
  auto call = [&](const char *fn) {
    return std::string(fn) + "(" + arg(0) + "," + arg(1) + ")";
  };
  switch (e.kind) {
  case Kind::Const:
    return e.value < 0 ? "(-" + std::to_string(-(e.value + 1)) + "-1)"
                       : std::to_string(e.value);
  case Kind::Param:
    return e.name;
  case Kind::Add:
    return "(" + arg(0) + "+" + arg(1) + ")";
  case Kind::Sub:
    return "(" + arg(0) + "-" + arg(1) + ")";
  case Kind::Mul:
    return "(" + arg(0) + "*" + arg(1) + ")";
  case Kind::Neg:
    return "(-" + arg(0) + ")";
  case Kind::FloorDiv:
    return call("floordiv");
  case Kind::CeilDiv:
    return call("ceildiv");
  case Kind::Mod:
    return call("mod");
  case Kind::Min:
    return call("min");
  case Kind::Max:
    return call("max");
  }
  return "?";
}

} // namespace neuron::runtime
