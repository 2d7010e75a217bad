//===- ProcessGroupCollectives.h - Collectives of compiled kernels -*- C++
//-*-===//
//
// The collective handler (runtime/exec/CollectiveHandler.h) that compiled
// kernels run their collective instructions through: the instruction's
// group name resolves to the c10d process group torch registered under it
// (what functional collectives name), and the bytes move through that
// group on CPU tensors aliasing the kernel's buffers (device memory is
// host memory), so the group's CPU backend (Gloo) carries them. The
// kernel's timeline already holds the collective's modeled time, so
// nothing is placed on the device timeline here.
//
//===----------------------------------------------------------------------===//

#ifndef NEURON_RUNTIME_DISTRIBUTED_PROCESSGROUPCOLLECTIVES_H
#define NEURON_RUNTIME_DISTRIBUTED_PROCESSGROUPCOLLECTIVES_H

#include "runtime/exec/CollectiveHandler.h"

namespace neuron::distributed {

/// The handler; it lives for the process.
const runtime::CollectiveHandler &processGroupCollectives();

} // namespace neuron::distributed

#endif // NEURON_RUNTIME_DISTRIBUTED_PROCESSGROUPCOLLECTIVES_H
