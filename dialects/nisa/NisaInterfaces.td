//===- NisaInterfaces.td - what passes ask of an instruction -*- tablegen -*-===//
//
// Every engine instruction implements InstructionOpInterface: its program
// opcode, the queue that issues it, whether it is a DMA, and the memref
// operands it writes (from the MemWrite effects its operands declare in
// NisaOps.td), and its operands by name. nisa-insert-sync and the program
// emitter ask it instead of switching over the ops.
//
//===----------------------------------------------------------------------===//

#ifndef NISA_INTERFACES
#define NISA_INTERFACES

include "mlir/IR/OpBase.td"

def Nisa_InstructionOpInterface : OpInterface<"InstructionOpInterface"> {
  let cppNamespace = "::mlir::nisa";
  let description = [{
    An engine instruction of runtime/program/InstructionSet.def: one
    `nisa.<mnemonic>` op per opcode.
  }];
  let methods = [
    StaticInterfaceMethod<
      "The instruction's opcode in the program (InstructionSet.def).",
      "::neuron::runtime::Opcode", "getOpcode", (ins), [{}], [{
        return ::mlir::nisa::OpcodeOf<ConcreteOp>::value;
      }]>,
    InterfaceMethod<
      "The queue that runs the instruction (for a DMA, triggers it): its "
      "`engine` attribute, or the one engine that may issue it.",
      "::mlir::nisa::Engine", "getIssuingEngine", (ins), [{}], [{
        return ::mlir::nisa::detail::issuingEngine<ConcreteOp>($_op);
      }]>,
    StaticInterfaceMethod<
      "Whether the instruction is a DMA (completes asynchronously).",
      "bool", "isDma", (ins), [{}], [{
        return ::neuron::runtime::isDma(ConcreteOp::getOpcode());
      }]>,
    InterfaceMethod<
      "The memref operands the instruction writes (MemWrite in NisaOps.td), "
      "in operand order; every other memref operand is read.",
      "::llvm::SmallVector<::mlir::Value, 2>", "getWrittenOperands", (ins),
      [{}], [{
        return ::mlir::nisa::detail::writtenOperands($_op.getOperation());
      }]>,
    InterfaceMethod<
      "The operands present, each with its ODS name, in operand order: the "
      "program emitter writes a memref under the InstructionSet.def operand "
      "of that name and an index operand as the attribute it is the source "
      "of, so a new instruction needs no emitter code.",
      "::llvm::SmallVector<std::pair<::llvm::StringRef, ::mlir::Value>, 4>",
      "getNamedOperands", (ins), [{}], [{
        ::llvm::SmallVector<std::pair<::llvm::StringRef, ::mlir::Value>, 4>
            named;
        unsigned index = 0; // ODS operand groups skip the attributes
        for (::llvm::StringRef name : ConcreteOp::getArgumentNames()) {
          if (::llvm::is_contained(ConcreteOp::getAttributeNames(), name))
            continue;
          for (::mlir::Value value : $_op.getODSOperands(index))
            named.push_back({name, value});
          ++index;
        }
        return named;
      }]>,
  ];
}

#endif // NISA_INTERFACES
