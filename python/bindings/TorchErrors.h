//===- TorchErrors.h - c10 errors as Python exceptions ---------*- C++ -*-===//
//
// TORCH_CHECK failures in the libtorch-linked modules (_device,
// _distributed) reach Python as torch's own bindings raise them: the
// message without the C++ backtrace, as IndexError, ValueError, TypeError or
// NotImplementedError for those kinds of c10 error, else RuntimeError.
// pybind11 alone would show c10::Error::what(), which ends in a stack of C++
// frames. The translator is local to the module that registers it: torch's
// own bindings keep their translation.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_PYTHON_BINDINGS_TORCHERRORS_H
#define NEURON_PYTHON_BINDINGS_TORCHERRORS_H

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

namespace neuron::bindings {

inline void registerTorchErrors() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    if (!p)
      return;
    try {
      std::rethrow_exception(p);
    } catch (const c10::Error &e) {
      PyObject *kind = PyExc_RuntimeError;
      if (dynamic_cast<const c10::IndexError *>(&e))
        kind = PyExc_IndexError;
      else if (dynamic_cast<const c10::ValueError *>(&e))
        kind = PyExc_ValueError;
      else if (dynamic_cast<const c10::TypeError *>(&e))
        kind = PyExc_TypeError;
      else if (dynamic_cast<const c10::NotImplementedError *>(&e))
        kind = PyExc_NotImplementedError;
      PyErr_SetString(kind, e.what_without_backtrace());
    }
  });
}

} // namespace neuron::bindings

#endif // NEURON_PYTHON_BINDINGS_TORCHERRORS_H
