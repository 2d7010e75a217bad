//===- Registration.cpp - the one registration point ----------------------===//
#include "compiler/Registration.h"

#include "dialects/neuron/NeuronDialect.h"
#include "dialects/nisa/NisaDialect.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void neuron::compiler::registerDialects(mlir::DialectRegistry &registry) {
  registry.insert<mlir::neuron::NeuronDialect, mlir::nisa::NisaDialect,
                  mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::scf::SCFDialect, mlir::memref::MemRefDialect>();
}

void neuron::compiler::registerPasses() {
  mlir::neuron::registerNeuronPasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
}
