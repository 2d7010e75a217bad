//===- ProcessGroupCollectives.cpp - Collectives of compiled kernels ------===//

#include "runtime/distributed/ProcessGroupCollectives.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace neuron::distributed {

namespace {

namespace rt = neuron::runtime;

at::ScalarType scalarTypeOf(rt::DType dtype) {
  switch (dtype) {
  case rt::DType::F32:
    return at::kFloat;
  case rt::DType::BF16:
    return at::kBFloat16;
  case rt::DType::F16:
    return at::kHalf;
  case rt::DType::I32:
    return at::kInt;
  case rt::DType::I64:
    return at::kLong;
  case rt::DType::I8:
    return at::kChar;
  case rt::DType::U8:
    return at::kByte;
  default:
    throw std::invalid_argument(std::string("no collective of dtype ") +
                                rt::dtypeName(dtype));
  }
}

c10d::ReduceOp reduceOpOf(rt::AluOp op) {
  switch (op) {
  case rt::AluOp::Add:
    return c10d::ReduceOp(c10d::ReduceOp::SUM);
  case rt::AluOp::Max:
    return c10d::ReduceOp(c10d::ReduceOp::MAX);
  case rt::AluOp::Min:
    return c10d::ReduceOp(c10d::ReduceOp::MIN);
  default:
    throw std::invalid_argument(std::string("no collective reduction '") +
                                rt::aluOpName(op) + "'");
  }
}

void run(const rt::CollectiveCall &call) {
  c10::intrusive_ptr<c10d::ProcessGroup> group =
      c10d::resolve_process_group(call.group);
  if (group->getSize() != call.groupSize)
    throw std::invalid_argument("process group '" + std::string(call.group) +
                                "' has " + std::to_string(group->getSize()) +
                                " ranks; the kernel was compiled "
                                "for " +
                                std::to_string(call.groupSize));
  auto options = at::TensorOptions().dtype(scalarTypeOf(call.dtype));
  at::Tensor src =
      at::from_blob(const_cast<void *>(call.src), {call.srcElements}, options);
  at::Tensor dst = at::from_blob(call.dst, {call.dstElements}, options);
  switch (call.kind) {
  case rt::Collective::AllReduce: {
    if (dst.data_ptr() != src.data_ptr())
      dst.copy_(src);
    std::vector<at::Tensor> tensors{dst};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduceOpOf(call.reduce);
    group->allreduce(tensors, opts)->wait();
    return;
  }
  case rt::Collective::AllGather:
    group->_allgather_base(dst, src)->wait();
    return;
  case rt::Collective::ReduceScatter: {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduceOpOf(call.reduce);
    group->_reduce_scatter_base(dst, src, opts)->wait();
    return;
  }
  case rt::Collective::Broadcast:
  case rt::Collective::AllToAll:
  case rt::Collective::SendRecv:
  case rt::Collective::Barrier:
    break;
  }
  throw std::invalid_argument(std::string(rt::collectiveName(call.kind)) +
                              " is not a collective instruction");
}

int runCollective(void *, const rt::CollectiveCall *call, char *error,
                  size_t errorSize) {
  try {
    run(*call);
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(error, errorSize, "%s", e.what());
    return 1;
  }
}

} // namespace

const rt::CollectiveHandler &processGroupCollectives() {
  static const rt::CollectiveHandler handler = [] {
    rt::CollectiveHandler h;
    h.run = runCollective;
    return h;
  }();
  return handler;
}

} // namespace neuron::distributed
