// RUN: neuron-opt %s --neuron-lower-to-nisa --canonicalize --cse | FileCheck %s

// neuron.conv2d as a direct convolution: the weights load as rows of
// [O, C * kh * kw] and go to [C, O] per tap group by TensorE transposes; the
// image, zero padded, stays in SBUF, and each tap group is a matmul of its
// weights by the window it sees, a [K, images, rows, columns] access pattern.
//
// 64 channels: two copies of the image on the partitions, copy 1 one tap
// column further back (a plane of 1 + 8 * 8 elements: one element of lead),
// so a matmul contracts taps (i, 0) and (i, 1) on 128 partitions and tap
// (i, 2) alone on 64; the weights are reordered on GpSimd to [o, i, j, c]
// so that a group's taps are one run. Both 6 x 6 images share one PSUM tile
// (72 positions).

// CHECK-LABEL: func.func @conv(
// CHECK-DAG: memref.alloc() : memref<128x384xbf16, #nisa.mem<sbuf>>
// CHECK-DAG: %[[IMG:.*]] = memref.alloc() : memref<128x130xbf16, #nisa.mem<sbuf>>
// CHECK-DAG: %[[LOADED:.*]] = memref.alloc() : memref<128x72xbf16, #nisa.mem<sbuf>>
// The border: before the first row, between rows, after the last.
// CHECK: %[[B0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c0], sizes: [128, 2, 10], strides: [130, 65, 1]
// CHECK: nisa.memset %[[B0]], 0.000000e+00 {engine = #nisa.engine<gpsimd>}
// CHECK: memref.reinterpret_cast %[[IMG]] to offset: [%c16], sizes: [128, 2, 5, 2], strides: [130, 65, 8, 1]
// CHECK: memref.reinterpret_cast %[[IMG]] to offset: [%c56], sizes: [128, 2, 9], strides: [130, 65, 1]
// CHECK: %[[RAW:.*]] = memref.alloc() : memref<128x576xbf16, #nisa.mem<sbuf>>
// CHECK: %[[ORDERED:.*]] = memref.alloc() : memref<128x576xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<64x576xbf16, strided<[576, 1], offset: ?>>, memref<64x576xbf16
// CHECK: nisa.copy %{{.*}}, %{{.*}} {engine = #nisa.engine<gpsimd>} : memref<64x3x3x64xbf16, strided<[576, 3, 1, 9], offset: ?>, #nisa.mem<sbuf>>, memref<64x3x3x64xbf16, strided<[576, 192, 64, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: %[[PAIR:.*]] = memref.reinterpret_cast %[[ORDERED]] to offset: [%c0], sizes: [64, 128], strides: [576, 1]
// CHECK: nisa.matmul %[[PAIR]], %{{.*}}, %{{.*}} {is_transpose} : {{.*}}, memref<128x64xf32
// CHECK: %[[X:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [64, 2, 36], strides: [36, 2304, 1]
// CHECK: nisa.dma_copy %[[X]], %{{.*}} : memref<64x2x36xbf16
// CHECK: %[[INTERIOR:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c10], sizes: [64, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: nisa.copy %{{.*}}, %[[INTERIOR]] {engine = #nisa.engine<gpsimd>}
// CHECK: %[[COPY1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c8320], sizes: [64, 2, 64], strides: [130, 65, 1]
// CHECK: %[[COPY0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c1], sizes: [64, 2, 64], strides: [130, 65, 1]
// CHECK: nisa.dma_copy %[[COPY0]], %[[COPY1]]
// CHECK: %[[SUMS:.*]] = memref.reinterpret_cast %{{.*}} to offset: [%c0], sizes: [64, 72], strides: [2048, 1]
// CHECK: %[[WIN0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c1], sizes: [128, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: nisa.matmul %{{.*}}, %[[WIN0]], %[[SUMS]] : memref<128x64xbf16, strided<[384, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: %[[WIN1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c3], sizes: [64, 2, 6, 6], strides: [130, 65, 8, 1]
// CHECK: nisa.matmul %{{.*}}, %[[WIN1]], %[[SUMS]] {accumulate}
// CHECK-COUNT-4: nisa.matmul {{.*}} {accumulate}
// CHECK: nisa.copy %[[SUMS]], %{{.*}} :
// CHECK: %[[OUT:.*]] = memref.reinterpret_cast %arg2 to offset: [%c0], sizes: [64, 2, 6, 6], strides: [36, 2304, 6, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[OUT]] {engine = #nisa.engine<scalar>}
func.func @conv(%x: tensor<2x64x6x6xbf16>, %w: tensor<64x64x3x3xbf16>) -> tensor<2x64x6x6xbf16> {
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<2x64x6x6xbf16>, tensor<64x64x3x3xbf16> -> tensor<2x64x6x6xbf16>
  return %0 : tensor<2x64x6x6xbf16>
}

// 192 channels in two tiles (128 and 64), 200 outputs in two; stride 2,
// no padding: the image loads straight into its tile, each window strides
// two rows (22 elements) and two columns; one transpose per tap.

// CHECK-LABEL: func.func @conv_strided(
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %{{.*}} {is_transpose} : memref<128x128xf32, strided<[1728, 9], offset: ?>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<128x1x99xf32, strided<[99, 19008, 1], offset: ?>>, memref<128x1x99xf32, strided<[198, 198, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} : memref<64x1x99xf32, strided<[99, 19008, 1], offset: ?>>, memref<64x1x99xf32, strided<[198, 198, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[S:.*]] : memref<128x128xf32, {{.*}}>, memref<128x1x4x5xf32, strided<[198, 198, 22, 2], offset: ?>, #nisa.mem<sbuf>>, memref<128x20xf32
// CHECK-COUNT-8: nisa.matmul {{.*}}, %[[S]] {accumulate} : memref<128x128xf32
// CHECK-COUNT-9: nisa.matmul {{.*}}, %[[S]] {accumulate} : memref<64x128xf32
// CHECK: nisa.matmul {{.*}} : memref<128x72xf32, {{.*}}>, memref<128x1x4x5xf32, {{.*}}>, memref<72x20xf32
func.func @conv_strided(%x: tensor<1x192x9x11xf32>, %w: tensor<200x192x3x3xf32>) -> tensor<1x200x4x5xf32> {
  %0 = neuron.conv2d %x, %w stride [2, 2] padding [0, 0] dilation [1, 1] : tensor<1x192x9x11xf32>, tensor<200x192x3x3xf32> -> tensor<1x200x4x5xf32>
  return %0 : tensor<1x200x4x5xf32>
}

// A ResNet-style stem (3 channels, 7 x 7, stride 2, padding 3): the kernel
// rows stack, copy (r, q) holding only the rows kernel row r reads (row
// 2 * y + r - 3 of the image on plane row y), shifted back q columns, loaded
// from HBM in runs of one image row, on partitions (q * 7 + r) * 8: each
// copy takes a DMA engine's 8 partitions (zeros past its 3 channels, the
// tiles zeroed whole on GpSimd and VectorE in turn). Two column shifts fit
// (112 partitions): one matmul contracts kernel columns 0-1, 2-3, 4-5, then
// 6 alone on 56 partitions.

// CHECK-LABEL: func.func @stem(
// CHECK: %[[IMG:.*]] = memref.alloc() : memref<128x352xbf16, #nisa.mem<sbuf>>
// CHECK: %[[IMG1:.*]] = memref.alloc() : memref<128x352xbf16, #nisa.mem<sbuf>>
// CHECK: nisa.memset %[[IMG]], 0.000000e+00 {engine = #nisa.engine<gpsimd>}
// CHECK: nisa.memset %[[IMG1]], 0.000000e+00 :
// CHECK: nisa.copy %{{.*}}, %{{.*}} {engine = #nisa.engine<gpsimd>} : memref<8x7x7x3xbf16, strided<[147, 1, 7, 49], offset: ?>, #nisa.mem<sbuf>>, memref<8x7x7x3xbf16, strided<[392, 56, 8, 1], offset: ?>, #nisa.mem<sbuf>>
// CHECK-COUNT-3: nisa.matmul {{.*}} {is_transpose} : memref<8x112xbf16
// CHECK: nisa.matmul {{.*}} {is_transpose} : memref<8x56xbf16
// CHECK: %[[R0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c47], sizes: [3, 2, 6, 16], strides: [352, 176, 22, 1]
// CHECK: %[[X0:.*]] = memref.reinterpret_cast %arg0 to offset: [%c16], sizes: [3, 2, 6, 16], strides: [256, 768, 32, 1]
// CHECK: nisa.dma_copy %[[X0]], %[[R0]]
// CHECK: %[[R1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c2841], sizes: [3, 2, 7, 16], strides: [352, 176, 22, 1]
// CHECK: %[[X1:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [3, 2, 7, 16], strides: [256, 768, 32, 1]
// CHECK: nisa.dma_copy %[[X1]], %[[R1]]
// CHECK-COUNT-5: nisa.dma_copy
// CHECK: %[[Q1:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c19758], sizes: [3, 2, 6, 16], strides: [352, 176, 22, 1]
// CHECK: nisa.dma_copy %[[X0]], %[[Q1]]
// CHECK-COUNT-6: nisa.dma_copy
// CHECK: %[[WIN:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c0], sizes: [112, 2, 8, 8], strides: [352, 176, 22, 2]
// CHECK: nisa.matmul %{{.*}}, %[[WIN]], %[[SUMS:.*]] : memref<112x8xbf16
// CHECK-COUNT-2: nisa.matmul {{.*}}, %[[SUMS]] {accumulate} : memref<112x8xbf16
// CHECK: nisa.matmul {{.*}}, %[[SUMS]] {accumulate} : memref<56x8xbf16
func.func @stem(%x: tensor<2x3x16x16xbf16>, %w: tensor<8x3x7x7xbf16>) -> tensor<2x8x8x8xbf16> {
  %0 = neuron.conv2d %x, %w stride [2, 2] padding [3, 3] dilation [1, 1] : tensor<2x3x16x16xbf16>, tensor<8x3x7x7xbf16> -> tensor<2x8x8x8xbf16>
  return %0 : tensor<2x8x8x8xbf16>
}

// With a bias, each output tile's is loaded once as an fp32 column (the
// DMA widens it) and added to the sums as they leave PSUM: on VectorE as a
// per-partition scalar, on ScalarE as the activation's bias.

// CHECK-LABEL: func.func @conv_bias(
// CHECK: %[[COLS:.*]] = memref.alloc() : memref<128x2xf32, #nisa.mem<sbuf>>
// CHECK: %[[B0:.*]] = memref.reinterpret_cast %[[COLS]] to offset: [%c0], sizes: [128, 1], strides: [2, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[B0]] : memref<128x1xbf16, strided<[1, 1], offset: ?>>, memref<128x1xf32
// CHECK: %[[B1:.*]] = memref.reinterpret_cast %[[COLS]] to offset: [%c1], sizes: [72, 1], strides: [2, 1]
// CHECK: nisa.dma_copy %{{.*}}, %[[B1]] : memref<72x1xbf16, strided<[1, 1], offset: ?>>, memref<72x1xf32
// CHECK: nisa.tensor_scalar  add %{{.*}}, %{{.*}} scalar %[[B0]] : memref<128x64xf32
// CHECK: nisa.activation identity %{{.*}}, %{{.*}} bias %[[B1]] : memref<72x64xf32
func.func @conv_bias(%x: tensor<1x64x8x8xbf16>, %w: tensor<200x64x3x3xbf16>, %b: tensor<200xbf16>) -> tensor<1x200x8x8xbf16> {
  %0 = neuron.conv2d %x, %w bias %b stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x64x8x8xbf16>, tensor<200x64x3x3xbf16>, tensor<200xbf16> -> tensor<1x200x8x8xbf16>
  return %0 : tensor<1x200x8x8xbf16>
}

// An image too large for SBUF (two 130 x 300 bf16 planes per slot beside
// the weights) goes through in three bands of 44, 44 and 42 output rows.
// A band's plane holds the 46 padded rows its windows read (column borders
// zeroed once per slot); band 0 zeroes its top row of padding, the last
// band its bottom one, each loads its image rows in one run per channel
// (rows 0-44, 43-88, 87-129), and band 1's outputs store from row 44.

// CHECK-LABEL: func.func @conv_bands(
// CHECK: %[[IMG:.*]] = memref.alloc() : memref<128x13892xbf16, #nisa.mem<sbuf>>
// CHECK: %[[LOADED:.*]] = memref.alloc() : memref<128x13800xbf16, #nisa.mem<sbuf>>
// CHECK: %[[TOP:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c0], sizes: [128, 1, 302], strides: [13892, 13892, 1]
// CHECK: nisa.memset %[[TOP]], 0.000000e+00
// CHECK: %[[B0:.*]] = memref.reinterpret_cast %arg0 to offset: [%c0], sizes: [128, 1, 13500], strides: [39000, 4992000, 1]
// CHECK: nisa.dma_copy %[[B0]], %{{.*}} : memref<128x1x13500xbf16
// CHECK: %[[IN0:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c303], sizes: [128, 1, 45, 300], strides: [13892, 13892, 302, 1]
// CHECK: nisa.copy %{{.*}}, %[[IN0]] {engine = #nisa.engine<gpsimd>}
// CHECK: %[[B1:.*]] = memref.reinterpret_cast %arg0 to offset: [%c12900], sizes: [128, 1, 13800], strides: [39000, 4992000, 1]
// CHECK: nisa.dma_copy %[[B1]], %{{.*}} : memref<128x1x13800xbf16
// CHECK: scf.for
// CHECK: %[[BOTTOM:.*]] = memref.reinterpret_cast %[[IMG]] to offset: [%c12986], sizes: [128, 1, 302], strides: [13892, 13892, 1]
// CHECK: nisa.memset %[[BOTTOM]], 0.000000e+00
// CHECK: %[[B2:.*]] = memref.reinterpret_cast %arg0 to offset: [%c26100], sizes: [128, 1, 12900], strides: [39000, 4992000, 1]
// CHECK: nisa.dma_copy %[[B2]], %{{.*}} : memref<128x1x12900xbf16
// CHECK: scf.for
// CHECK: arith.addi %{{.*}}, %c13200 : index
// CHECK: nisa.dma_copy %{{.*}}, %{{.*}} {engine = #nisa.engine<scalar>} : memref<128x1x1x300xbf16
func.func @conv_bands(%x: tensor<1x128x130x300xbf16>, %w: tensor<128x128x3x3xbf16>) -> tensor<1x128x130x300xbf16> {
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] : tensor<1x128x130x300xbf16>, tensor<128x128x3x3xbf16> -> tensor<1x128x130x300xbf16>
  return %0 : tensor<1x128x130x300xbf16>
}

// Depthwise (each channel its own 3 x 3): the stationary of a tap group is
// diagonal, copy u's block (rows 32u on) w[channel, tap (i, u)] times the
// identity's block at row and column 32u; w's rows (a channel's nine taps
// along the free axis) load once onto each copy's partitions. The windows
// and matmuls are the dense kernel's.

// CHECK-LABEL: func.func @conv_depthwise(
// CHECK: %[[W:.*]] = memref.alloc() : memref<128x96xbf16, #nisa.mem<sbuf>>
// CHECK: %[[RAW:.*]] = memref.alloc() : memref<128x9xbf16, #nisa.mem<sbuf>>
// CHECK: %[[ID:.*]] = memref.alloc() : memref<128x128xbf16, #nisa.mem<sbuf>>
// CHECK: %[[TAPS:.*]] = memref.reinterpret_cast %arg1 to offset: [%c0], sizes: [32, 9], strides: [9, 1]
// CHECK: nisa.dma_copy %[[TAPS]], %{{.*}} : memref<32x9xbf16
// CHECK: %[[COPY1:.*]] = memref.reinterpret_cast %[[RAW]] to offset: [%c288], sizes: [32, 9], strides: [9, 1]
// CHECK: nisa.dma_copy %[[TAPS]], %[[COPY1]]
// CHECK: %[[W00:.*]] = memref.reinterpret_cast %[[RAW]] to offset: [%c0], sizes: [32, 1], strides: [9, 1]
// CHECK: %[[B0:.*]] = memref.reinterpret_cast %[[W]] to offset: [%c0], sizes: [32, 32], strides: [96, 1]
// CHECK: %[[I0:.*]] = memref.reinterpret_cast %[[ID]] to offset: [%c0], sizes: [32, 32], strides: [128, 1]
// CHECK: nisa.tensor_scalar multiply %[[I0]], %[[B0]] scalar %[[W00]]
// CHECK: %[[W01:.*]] = memref.reinterpret_cast %[[RAW]] to offset: [%c289], sizes: [32, 1], strides: [9, 1]
// CHECK: %[[B1:.*]] = memref.reinterpret_cast %[[W]] to offset: [%c3072], sizes: [32, 32], strides: [96, 1]
// CHECK: %[[I1:.*]] = memref.reinterpret_cast %[[ID]] to offset: [%c4128], sizes: [32, 32], strides: [128, 1]
// CHECK: nisa.tensor_scalar multiply %[[I1]], %[[B1]] scalar %[[W01]] {engine = #nisa.engine<gpsimd>}
// CHECK-COUNT-7: nisa.tensor_scalar multiply
// CHECK: nisa.matmul %{{.*}}, %{{.*}}, %[[S:.*]] : memref<96x32xbf16, strided<[96, 1], offset: ?>, #nisa.mem<sbuf>>, memref<96x1x6x6xbf16
// CHECK-COUNT-2: nisa.matmul {{.*}}, %[[S]] {accumulate} : memref<96x32xbf16
func.func @conv_depthwise(%x: tensor<1x32x6x6xbf16>, %w: tensor<32x1x3x3xbf16>) -> tensor<1x32x6x6xbf16> {
  %0 = neuron.conv2d %x, %w stride [1, 1] padding [1, 1] dilation [1, 1] {depthwise} : tensor<1x32x6x6xbf16>, tensor<32x1x3x3xbf16> -> tensor<1x32x6x6xbf16>
  return %0 : tensor<1x32x6x6xbf16>
}

// An epilogue folded in (a BatchNorm in eval mode and a ReLU): the sums
// leave PSUM as relu(sums * scale + bias), per output channel, in one
// ScalarE activation; on VectorE as one scalar_tensor_tensor (the bias
// column read at every position: a zero stride) into the staged tile, then
// max(0, .) there.

// CHECK-LABEL: func.func @conv_epilogue(
// CHECK: nisa.scalar_tensor_tensor multiply, add %{{.*}}, %{{.*}}, %[[PART:.*]] scalar %{{.*}} : memref<64x504xf32, strided<[2048, 1], offset: ?>, #nisa.mem<psum>>, memref<64x504xf32, strided<[1, ?], offset: ?>, #nisa.mem<sbuf>>, memref<64x504xbf16
// CHECK: nisa.tensor_scalar max %[[PART]], %[[PART]] : memref<64x504xbf16
// CHECK: nisa.activation relu %{{.*}}, %{{.*}} bias %{{.*}} scale_col %{{.*}} : memref<64x72xf32, strided<[2048, 1], offset: ?>, #nisa.mem<psum>>, memref<64x72xbf16
func.func @conv_epilogue(%x: tensor<1x64x24x24xbf16>, %w: tensor<64x64x3x3xbf16>, %b: tensor<64xf32>, %s: tensor<64xf32>) -> tensor<1x64x24x24xbf16> {
  %0 = neuron.conv2d %x, %w bias %b scale %s stride [1, 1] padding [1, 1] dilation [1, 1] {relu} : tensor<1x64x24x24xbf16>, tensor<64x64x3x3xbf16>, tensor<64xf32>, tensor<64xf32> -> tensor<1x64x24x24xbf16>
  return %0 : tensor<1x64x24x24xbf16>
}
