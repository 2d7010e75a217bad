//===- Error.h - Runtime error type -----------------------------*- C++ -*-===//
//
// Every failure the runtime reports (bad program, bad target file, bad call
// arguments, runtime faults such as an out-of-range gather index) is thrown as
// neuron::runtime::Error (or a subclass), so callers need exactly one catch
// clause.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_PROGRAM_ERROR_H
#define NEURON_RUNTIME_PROGRAM_ERROR_H

#include <stdexcept>
#include <string>

namespace neuron::runtime {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

/// An index outside its table (a gather's or scatter's row): Python reads it
/// as an IndexError too, as eager PyTorch raises one for the same index.
class IndexError : public Error {
public:
  using Error::Error;
};

} // namespace neuron::runtime

#endif // NEURON_RUNTIME_PROGRAM_ERROR_H
