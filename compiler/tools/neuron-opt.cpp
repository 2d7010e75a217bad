//===- neuron-opt.cpp - run TorchNeuron passes on MLIR files --------------===//
#include "compiler/Registration.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  neuron::compiler::registerDialects(registry);
  neuron::compiler::registerPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "TorchNeuron optimizer driver\n", registry));
}
