//===- SizeExprTest.cpp - Size expressions --------------------------------===//
//
// The grammar, evaluator and printer of runtime/program/SizeExpr.h on their
// own (ProgramTest.cpp checks programs that use them).
//
//===----------------------------------------------------------------------===//

#include "runtime/program/SizeExpr.h"
#include "tests/unit/CatchCompat.h"
#include "tests/unit/TestUtil.h"

#include <limits>

using neuron::runtime::evaluate;
using neuron::runtime::parseSizeExpr;
using neuron::runtime::SizeEnv;
using neuron::runtime::SizeExpr;
using neuron::test::contains;
using neuron::test::errorOf;

namespace {

int64_t eval(const char *text, const SizeEnv &sizes = {}) {
  return evaluate(parseSizeExpr(text), sizes);
}

} // namespace

TEST_CASE("size expressions follow the usual precedence", "[sizeexpr]") {
  SizeEnv sizes = {{"s0", 300}, {"s1", 7}};
  CHECK(eval("1 + 2*3") == 7);
  CHECK(eval("(1 + 2)*3") == 9);
  CHECK(eval("10 - 4 - 3") == 3);
  CHECK(eval("-s1 + 2", sizes) == -5);
  CHECK(eval("16*s0 + s1", sizes) == 4807);
  CHECK(eval("ceildiv(s0, 128)", sizes) == 3);
  CHECK(eval("floordiv(s0, 128)", sizes) == 2);
  CHECK(eval("mod(s0, 128)", sizes) == 44);
  CHECK(eval("min(128, s0 - 256)", sizes) == 44);
  CHECK(eval("max(s1, 2*s1)", sizes) == 14);
}

TEST_CASE("division rounds toward negative infinity", "[sizeexpr]") {
  CHECK(eval("floordiv(-7, 2)") == -4);
  CHECK(eval("ceildiv(-7, 2)") == -3);
  CHECK(eval("mod(-7, 2)") == 1);
  CHECK(eval("ceildiv(8, 2)") == 4);
  CHECK(eval("ceildiv(0, 128)") == 0);
}

TEST_CASE("printing parses back to the same value", "[sizeexpr]") {
  SizeEnv sizes = {{"s0", 1000}, {"s1", 3}};
  for (const char *text :
       {"s0 - (s1 + 1)", "s0*(s1*2)", "-(s0 - 1)", "ceildiv(s0 - 1, 128)*128",
        "min(s0, 4096) - mod(s0 + s1, 7)", "s0 - s1 - 1", "2*(s0 + 1)"}) {
    SizeExpr e = parseSizeExpr(text);
    std::string printed = toString(e);
    CAPTURE(text, printed);
    CHECK(evaluate(parseSizeExpr(printed), sizes) == evaluate(e, sizes));
    CHECK(toString(parseSizeExpr(printed)) == printed);
  }
  CHECK(toString(parseSizeExpr("(s0)*( 2 )+1")) == "s0*2 + 1");
  CHECK(neuron::runtime::paramsOf(parseSizeExpr("s1 + 2*s0 - s1")) ==
        std::vector<std::string>{"s1", "s0"});
}

TEST_CASE("bad size expressions are errors, never crashes", "[sizeexpr]") {
  CHECK(contains(errorOf([] { parseSizeExpr(""); }), "unexpected end"));
  CHECK(contains(errorOf([] { parseSizeExpr("s0 +"); }), "unexpected end"));
  CHECK(contains(errorOf([] { parseSizeExpr("(s0"); }), "expected ')'"));
  CHECK(contains(errorOf([] { parseSizeExpr("s0 s1"); }), "unexpected 's'"));
  CHECK(contains(errorOf([] { parseSizeExpr("pow(s0, 2)"); }),
                 "unknown function 'pow'"));
  CHECK(contains(errorOf([] { parseSizeExpr("99999999999999999999"); }),
                 "does not fit int64"));
  CHECK(contains(errorOf([] { parseSizeExpr("s0 / 2"); }), "unexpected '/'"));
  CHECK(contains(errorOf([] { eval("s0 + 1"); }),
                 "no value for size parameter 's0'"));
  CHECK(contains(errorOf([] { eval("floordiv(4, 0)"); }), "not positive"));
  CHECK(contains(errorOf([] { eval("mod(4, -2)"); }), "not positive"));
  CHECK(contains(errorOf([] { eval("9223372036854775807 + 1"); }),
                 "overflows int64"));
  CHECK(contains(errorOf([] { eval("-(0 - 9223372036854775807 - 1)"); }),
                 "overflows int64"));
  SizeEnv big = {{"s0", std::numeric_limits<int64_t>::max()}};
  CHECK(contains(errorOf([&] { eval("2*s0", big); }), "overflows int64"));
}
