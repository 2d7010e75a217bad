//===- CatchCompat.h - Catch2 v2/v3 include shim ----------------*- C++ -*-===//
//
// Debian 12 ships Catch2 v2 (single header), Debian 13 ships v3 (split
// headers). CMake defines NEURON_CATCH2_MAJOR from the package it found; the
// __has_include fallback covers builds that do not.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_TESTS_UNIT_CATCHCOMPAT_H
#define NEURON_TESTS_UNIT_CATCHCOMPAT_H

#if defined(NEURON_CATCH2_MAJOR)
#if NEURON_CATCH2_MAJOR >= 3
#define NEURON_USE_CATCH2_V3 1
#endif
#elif __has_include(<catch2/catch_test_macros.hpp>)
#define NEURON_USE_CATCH2_V3 1
#endif

#ifdef NEURON_USE_CATCH2_V3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif

#endif // NEURON_TESTS_UNIT_CATCHCOMPAT_H
