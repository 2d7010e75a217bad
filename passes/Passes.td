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
    concat) are strided DMA copies; reshape is free. A sum over leading dims
    (a column sum) reads its rows in place and sums them across partitions
    on TensorE: matmuls with a ones vector accumulating row tiles in PSUM.
    Loops keep the program size independent of tensor sizes.

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
    Option<"freeTileBytes", "free-tile-bytes", "int64_t", /*default=*/"8192",
           "Bytes per partition of one flat elementwise tile (DMA "
           "descriptors of >= 8 KiB per partition hide their overhead)">,
    Option<"streamSlots", "stream-slots", "int64_t", /*default=*/"4",
           "Most buffers a fused group's loaded or stored value rotates "
           "over: loads run up to stream-slots - 1 steps ahead of the "
           "compute and stores trail it (4: three loads in flight)">,
    Option<"streamSbufPercent", "stream-sbuf-percent", "int64_t",
           /*default=*/"50",
           "Share of SBUF (percent per partition) a fused group's streamed "
           "values may take before they give up slots (50: leaves room for "
           "the group's intermediates and other kernels' tiles)">,
    Option<"innerSbufPercent", "inner-sbuf-percent", "int64_t",
           /*default=*/"25",
           "Share of SBUF (percent per partition) within which a fused "
           "group's intermediates alternate between two tiles (25: beyond "
           "it, one tile each)">,
    Option<"gemmPanelSbufPercent", "gemm-panel-sbuf-percent", "int64_t",
           /*default=*/"50",
           "Share of SBUF (percent per partition) the two resident A^T "
           "panels of a GEMM's M block may take (50: the B stream and the "
           "staged outputs keep the rest; three quarters where this share "
           "holds a block of one M tile only)">,
    Option<"attentionLanes", "attention-lanes", "int64_t", /*default=*/"3",
           "Most query tiles a flash-attention kernel interleaves, PSUM "
           "permitting (3: one tile's softmax overlaps the others' matmuls)">,
    Option<"attentionSbufPercent", "attention-sbuf-percent", "int64_t",
           /*default=*/"75",
           "Share of SBUF (percent per partition) an attention kernel's "
           "resident operands may take: the forward's K^T, V (and Q^T) "
           "slots, the backward's key and query blocks (75: the score, "
           "probability and output tiles fit in the rest)">
  ];
}

def NeuronFuseElementwise : Pass<"neuron-fuse-elementwise", "mlir::ModuleOp"> {
  let summary = "Group elementwise ops, row reductions and broadcasts into neuron.fusion";
  let description = [{
    Chains of elementwise ops, reductions over the innermost dims and the
    broadcasts and reshapes between them become one `neuron.fusion`, which
    the lowering tiles as a whole: inputs are read from HBM once, outputs
    written once, intermediates stay in SBUF. Softmax, LayerNorm and RMSNorm
    each become one fusion. A group is tiled by rows when it reduces or
    broadcasts (each row of C elements in one tile, so C times the widest
    element must fit in `row-bytes` per partition, and the rows of all its
    values together in `group-bytes`), otherwise flat. Column sums (a sum of
    a transpose that keeps the source's innermost dim) stay out: lowered
    alone they read the source in place.

    Before:
    ```mlir
    %m = neuron.reduce max %x {count = 1} : tensor<64x32xf32> -> tensor<64xf32>
    %r = neuron.reshape %m : tensor<64xf32> -> tensor<64x1xf32>
    %b = neuron.broadcast %r : tensor<64x1xf32> -> tensor<64x32xf32>
    %d = neuron.binary sub %x, %b : ...
    ```
    After:
    ```mlir
    %d = neuron.fusion (%x) : (tensor<64x32xf32>) -> tensor<64x32xf32> {
    ^bb0(%a: tensor<64x32xf32>):
      %m = neuron.reduce max %a {count = 1} : ...
      ...
      neuron.yield %d : tensor<64x32xf32>
    }
    ```
  }];
  let dependentDialects = ["mlir::neuron::NeuronDialect"];
  let options = [
    Option<"rowBytes", "row-bytes", "int64_t", /*default=*/"16384",
           "Most bytes per partition one row of a row-tiled group may take">,
    Option<"groupBytes", "group-bytes", "int64_t", /*default=*/"196608",
           "Most bytes per partition the rows of every value of a row-tiled "
           "group (inputs, outputs, intermediates) may take together; the "
           "lowering holds them all in SBUF at once">
  ];
}

def NisaAllocate : Pass<"nisa-allocate", "mlir::ModuleOp"> {
  let summary = "Place every SBUF/PSUM tile at a byte address, reusing dead space";
  let description = [{
    Gives each on-chip `memref.alloc` of a kernel a `nisa.address`: its byte
    offset inside every partition. A tile is live from its alloc to its last
    use (a use inside a loop keeps it live to the end of that loop); tiles
    whose lifetimes overlap get disjoint byte ranges. A new tile takes
    never-used bytes first, then those freed longest ago, so its writes need
    not wait for the readers of the tile that just died at the same address;
    where that fragments memory so that some tile finds no room, the kernel
    is placed first-fit (lowest free address) instead. `nisa.reuse =
    "least_recent"` or `"lowest"` on a kernel asks for one of the two. PSUM
    tiles that fit in one bank never straddle two (a matmul accumulates
    within a bank). Tiles that already carry an address keep it. Fails,
    naming the tile, only when the tiles live at one point exceed the
    target's SBUF or PSUM bytes per partition.

    Before:
    ```mlir
    %a = memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
    %b = memref.alloc() : memref<128x512xf32, #nisa.mem<sbuf>>
    ```
    After:
    ```mlir
    %a = memref.alloc() {nisa.address = 0 : i64} : memref<128x512xf32, #nisa.mem<sbuf>>
    %b = memref.alloc() {nisa.address = 2048 : i64} : memref<128x512xf32, #nisa.mem<sbuf>>
    ```
  }];
  let dependentDialects = ["mlir::nisa::NisaDialect"];
}

def NisaInsertSync : Pass<"nisa-insert-sync", "mlir::ModuleOp"> {
  let summary = "Make every instruction wait for the ones whose data it needs";
  let description = [{
    Engines run their queues in order but independently of each other, and
    DMA transfers complete out of order, so an instruction that reads or
    overwrites bytes another instruction writes or reads (RAW, WAR, WAW)
    must wait for it on a semaphore. This pass numbers the instructions of
    each kernel (`nisa.id`, pre-order) and lists, in `nisa.waits`, the ids
    whose earlier instances must have completed before the instruction
    issues; the kernel gets `nisa.synchronized` and the emitted program
    `"sync": "explicit"`, which the timing model honours (and checks).

    Conflicts are found on physical storage: SBUF/PSUM byte ranges from
    `nisa.address` (run `nisa-allocate` first), HBM buffers by element
    ranges over all loop iterations. An instruction waits on one that
    precedes it in program order or in an earlier iteration of a loop they
    share. No wait is needed between compute instructions of one engine
    queue (in order); DMAs always need one.

    Before:
    ```mlir
    nisa.dma_copy %x, %t : ...
    nisa.activation exp %t, %u : ...
    ```
    After:
    ```mlir
    nisa.dma_copy %x, %t {nisa.id = 0 : i64} : ...
    nisa.activation exp %t, %u {nisa.id = 1 : i64, nisa.waits = array<i64: 0>} : ...
    ```
  }];
  let dependentDialects = ["mlir::nisa::NisaDialect"];
}

#endif // NEURON_PASSES
