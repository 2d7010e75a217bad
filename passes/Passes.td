//===- Passes.td - TorchNeuron compiler passes -------------*- tablegen -*-===//
#ifndef NEURON_PASSES
#define NEURON_PASSES

include "mlir/Pass/PassBase.td"

def NeuronLowerToNisa : Pass<"neuron-lower-to-nisa", "mlir::ModuleOp"> {
  let summary = "Tile every `neuron` op into `nisa` engine instructions";
  let description = [{
    Turns each `func.func` on tensors into a kernel on memrefs: tensor
    arguments become HBM input buffers, results become trailing HBM output
    buffers (destination-passing), and every `neuron` op becomes `scf.for`
    loops over tiles of at most the target's partition count: DMA loads into
    SBUF, TensorE matmuls accumulating in PSUM over K tiles, ScalarE/VectorE
    instructions, and DMA stores. Layout ops (transpose, broadcast, slice,
    concat) are strided DMA copies; reshape is free. Loops keep the program
    size independent of tensor sizes.

    Before:
    ```mlir
    func.func @f(%x: tensor<256x64xf32>) -> tensor<256x64xf32> {
      %y = neuron.unary exp %x : tensor<256x64xf32> -> tensor<256x64xf32>
      return %y : tensor<256x64xf32>
    }
    ```
    After (abridged):
    ```mlir
    func.func @f(%x: memref<256x64xf32>, %out: memref<256x64xf32>)
        attributes {nisa.kernel, nisa.num_inputs = 1 : i64} {
      %t = memref.alloc() : memref<128x128xf32, #nisa.mem<sbuf>>
      nisa.dma_copy %xv, %t : ...
      nisa.activation exp %t, %u : ...
      nisa.dma_copy %u, %outv : ...
      return
    }
    ```
  }];
  let dependentDialects = ["mlir::nisa::NisaDialect", "mlir::scf::SCFDialect",
                           "mlir::memref::MemRefDialect",
                           "mlir::arith::ArithDialect"];
  let options = [
    Option<"target", "target", "std::string", /*default=*/"\"\"",
           "Target chip (trn2, trn3); default: the module's nisa.target "
           "attribute, else trn2">,
    Option<"freeTileBytes", "free-tile-bytes", "int64_t", /*default=*/"2048",
           "Bytes per partition of one elementwise/reduction tile (DMA "
           "transfers of >= 2 KiB per partition run near peak)">
  ];
}

#endif // NEURON_PASSES
