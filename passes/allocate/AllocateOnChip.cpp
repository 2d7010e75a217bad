//===- AllocateOnChip.cpp - byte addresses for SBUF/PSUM tiles ------------===//
//
// Linear scan over tile lifetimes in program order: a tile is live from its
// alloc to the end of the outermost op, in the alloc's block, that holds its
// last use, directly or through a view of it. Each new tile takes, of the
// byte ranges not used by a live tile of the same memory, the one whose
// earlier tiles died longest ago (never-used bytes first): a load into a new
// tile then does not wait for the instructions still reading the tile that
// just died there (a Mixtral block's grouped GEMMs loaded each expert's rows
// only once the previous expert's last matmul had read its own). When that
// leaves no room (fragmentation), the lowest free range instead, which packs
// tighter. A kernel's `nisa.reuse` ("least_recent", "lowest") asks for one.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"

#include "dialects/nisa/NisaDialect.h"
#include "runtime/target/Target.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::neuron {
#define GEN_PASS_DEF_NISAALLOCATE
#include "passes/Passes.h.inc"
} // namespace mlir::neuron

using namespace mlir;
using nisa::MemorySpace;

namespace {

struct Tile {
  memref::AllocOp alloc;
  MemorySpace space;
  int64_t bytes, align;
  int64_t start, end; // program positions, inclusive
  int64_t address = -1;
};

/// Pre-order position of every op of `func`, and the last position inside
/// each op (its own position when it has no regions).
struct ProgramOrder {
  llvm::DenseMap<Operation *, int64_t> position, last;
  explicit ProgramOrder(func::FuncOp func) {
    int64_t next = 0;
    func.walk<WalkOrder::PreOrder>(
        [&](Operation *op) { position[op] = next++; });
    func.walk<WalkOrder::PostOrder>([&](Operation *op) {
      last[op] = next - 1;
      int64_t end = position[op];
      for (Region &r : op->getRegions())
        for (Block &b : r)
          if (!b.empty())
            end = std::max(end, last[&b.back()]);
      last[op] = end;
    });
  }
};

/// A byte range of one memory and the program position where the last tile
/// that held it died.
struct Freed {
  int64_t begin, end, when;
};

class Allocator {
public:
  Allocator(const ::neuron::target::Target &target) : target(target) {}

  /// Where `tile` fits beside the live `others`, or -1: the lowest such
  /// address, or with `freed` the one whose bytes were freed longest ago
  /// (never-used bytes first), the lowest of those on a tie.
  int64_t place(const Tile &tile, ArrayRef<const Tile *> others,
                const std::vector<Freed> *freed = nullptr) const {
    int64_t capacity = tile.space == MemorySpace::sbuf
                           ? target.sbufBytesPerPartition
                           : target.psumBytesPerPartition;
    SmallVector<int64_t> candidates{0};
    for (const Tile *o : others)
      candidates.push_back(o->address + o->bytes);
    if (freed)
      for (const Freed &f : *freed) {
        candidates.push_back(f.begin);
        candidates.push_back(f.end);
      }
    llvm::sort(candidates);
    candidates.erase(std::unique(candidates.begin(), candidates.end()),
                     candidates.end());
    int64_t best = -1, bestWhen = 0;
    for (int64_t c : candidates) {
      int64_t addr = llvm::alignTo(c, tile.align);
      addr = keepInBank(tile, addr);
      if (addr + tile.bytes > capacity)
        continue;
      bool clash = llvm::any_of(others, [&](const Tile *o) {
        return addr < o->address + o->bytes && o->address < addr + tile.bytes;
      });
      if (clash)
        continue;
      if (!freed)
        return addr;
      int64_t when = -1;
      for (const Freed &f : *freed)
        if (addr < f.end && f.begin < addr + tile.bytes)
          when = std::max(when, f.when);
      if (best < 0 || when < bestWhen || (when == bestWhen && addr < best)) {
        best = addr;
        bestWhen = when;
      }
    }
    return best;
  }

private:
  /// A PSUM tile that fits in one bank starts where it does not straddle two.
  int64_t keepInBank(const Tile &tile, int64_t addr) const {
    int64_t bank = target.psumBankBytes;
    if (tile.space != MemorySpace::psum || bank <= 0)
      return addr;
    if (tile.bytes > bank)
      return llvm::alignTo(addr, bank);
    if (addr / bank != (addr + tile.bytes - 1) / bank)
      return llvm::alignTo(addr, bank);
    return addr;
  }
  const ::neuron::target::Target &target;
};

struct NisaAllocatePass
    : public mlir::neuron::impl::NisaAllocateBase<NisaAllocatePass> {
  using NisaAllocateBase::NisaAllocateBase;

  LogicalResult allocate(func::FuncOp func,
                         const ::neuron::target::Target &target);

  void runOnOperation() override {
    ModuleOp module = getOperation();
    const auto *target = nisa::lookupTarget(module);
    if (!target)
      return signalPassFailure();
    for (auto func : module.getOps<func::FuncOp>())
      if (func->hasAttr("nisa.kernel") && failed(allocate(func, *target)))
        return signalPassFailure();
  }
};

/// The tile of `place` that found no room, and the live tiles it met.
struct NoRoom {
  const Tile *tile = nullptr;
  SmallVector<const Tile *> live;
};

/// The on-chip tiles of `func` in program order, each live from its alloc
/// to the last op (of the alloc's block) that uses it or a view of it;
/// failure, with a diagnostic, on a tile of no static shape.
FailureOr<std::vector<Tile>> collectTiles(func::FuncOp func) {
  ProgramOrder order(func);
  std::vector<Tile> tiles;
  WalkResult walk = func.walk<WalkOrder::PreOrder>([&](memref::AllocOp alloc) {
    MemRefType type = alloc.getType();
    MemorySpace space = nisa::getMemorySpace(type);
    if (space == MemorySpace::hbm)
      return WalkResult::advance();
    if (!type.hasStaticShape() || type.getRank() < 1) {
      alloc.emitOpError("on-chip tiles need a static [partitions, free...] "
                        "shape");
      return WalkResult::interrupt();
    }
    Tile tile{alloc,
              space,
              nisa::bytesPerPartition(type),
              std::max<int64_t>(1, type.getElementTypeBitWidth() / 8),
              order.position[alloc],
              order.position[alloc]};
    // Instructions use a tile through views of it as often as directly
    // (any operand: an activation's accumulate column is used like its
    // dst), and a view may be taken before the loop that uses it.
    Block *block = alloc->getBlock();
    SmallVector<Value> uses{alloc.getResult()};
    while (!uses.empty())
      for (Operation *user : uses.pop_back_val().getUsers()) {
        if (auto view = dyn_cast<memref::ReinterpretCastOp>(user))
          uses.push_back(view.getResult());
        if (Operation *holder = block->findAncestorOpInBlock(*user))
          tile.end = std::max(tile.end, order.last[holder]);
      }
    if (auto fixed = alloc->getAttrOfType<IntegerAttr>(nisa::kAddressAttrName))
      tile.address = fixed.getInt();
    tiles.push_back(tile);
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  return tiles;
}

/// The error of a tile that does not fit beside the live ones.
LogicalResult noRoom(const Tile &tile, ArrayRef<const Tile *> sameSpace) {
  int64_t used = 0;
  for (const Tile *t : sameSpace)
    used += t->bytes;
  return tile.alloc->emitOpError("needs ")
         << tile.bytes << " bytes per partition of "
         << nisa::stringifyMemorySpace(tile.space) << " but "
         << sameSpace.size() << " live tiles already use " << used
         << " (the lowering must split this work into smaller tiles)";
}

/// Addresses for `tiles` (those without one), each taking the range freed
/// longest ago (`leastRecent`) or the lowest; on failure, the tile that
/// found no room.
std::optional<NoRoom> place(std::vector<Tile> &tiles,
                            const ::neuron::target::Target &target,
                            bool leastRecent) {
  Allocator allocator(target);
  // Per memory: when each byte range was last freed (newer ranges replace
  // the older ones they cover, so the list stays about as long as the
  // number of distinct tile placements).
  llvm::DenseMap<unsigned, std::vector<Freed>> freed;
  std::vector<const Tile *> live;
  for (Tile &tile : tiles) {
    llvm::erase_if(live, [&](const Tile *t) {
      if (t->end >= tile.start)
        return false;
      if (leastRecent) {
        std::vector<Freed> &f = freed[static_cast<unsigned>(t->space)];
        Freed dead{t->address, t->address + t->bytes, t->end};
        llvm::erase_if(f, [&](const Freed &o) {
          return dead.begin <= o.begin && o.end <= dead.end &&
                 o.when <= dead.when;
        });
        f.push_back(dead);
      }
      return true;
    });
    SmallVector<const Tile *> sameSpace;
    for (const Tile *t : live)
      if (t->space == tile.space)
        sameSpace.push_back(t);
    if (tile.address < 0) {
      tile.address = allocator.place(
          tile, sameSpace,
          leastRecent ? &freed[static_cast<unsigned>(tile.space)] : nullptr);
      if (tile.address < 0)
        return NoRoom{&tile, sameSpace};
    }
    live.push_back(&tile);
  }
  return std::nullopt;
}

LogicalResult
NisaAllocatePass::allocate(func::FuncOp func,
                           const ::neuron::target::Target &target) {
  FailureOr<std::vector<Tile>> collected = collectTiles(func);
  if (failed(collected))
    return failure();
  auto reuse = func->getAttrOfType<StringAttr>(nisa::kReuseAttrName);
  SmallVector<bool, 2> policies; // least recent, then lowest
  if (!reuse || reuse.getValue() == "least_recent")
    policies.push_back(true);
  if (!reuse || reuse.getValue() == "lowest")
    policies.push_back(false);
  std::vector<Tile> tiles;
  std::optional<NoRoom> failure;
  for (bool leastRecent : policies) {
    tiles = *collected;
    failure = place(tiles, target, leastRecent);
    if (failure)
      continue;
    for (const Tile &tile : tiles)
      tile.alloc->setAttr(
          nisa::kAddressAttrName,
          IntegerAttr::get(IntegerType::get(&getContext(), 64), tile.address));
    return success();
  }
  return noRoom(*failure->tile, failure->live);
}

} // namespace
