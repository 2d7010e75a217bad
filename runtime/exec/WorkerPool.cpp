//===- WorkerPool.cpp - Host threads for large instructions ---------------===//

#include "runtime/exec/WorkerPool.h"
#include "runtime/program/Error.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NEURON_SPIN_PAUSE() _mm_pause()
#else
#define NEURON_SPIN_PAUSE() std::this_thread::yield()
#endif

namespace neuron::runtime {

namespace {

/// How long a worker keeps polling for the next task before it sleeps: a
/// little more than the gap between two large instructions.
constexpr std::chrono::microseconds kSpinTime{200};

/// How many pauses the caller spins for its workers' last chunks before it
/// yields its core (a few microseconds: a chunk is tens of microseconds).
constexpr int kWaitSpins = 1 << 12;

} // namespace

struct WorkerPool::State {
  std::vector<std::thread> workers;
  pid_t owner = getpid();

  // The task in flight. Chunks are claimed under `mutex`, so a worker that
  // wakes late finds every chunk taken (next == count) and claims nothing:
  // the caller never waits for a worker to show up, only for chunks a
  // worker has claimed and not finished (on a loaded machine a worker may
  // not be scheduled for milliseconds).
  const std::function<void(int64_t)> *fn = nullptr;
  int64_t count = 0;
  int64_t next = 0;
  std::atomic<int64_t> done{0};

  std::atomic<uint64_t> generation{0};
  std::mutex mutex; // guards the task, wake-ups and `stopping`
  std::condition_variable wake;
  bool stopping = false;

  std::atomic<bool> running{false}; // one run() at a time

  /// Runs chunks of the current task until none is left to claim.
  void work() {
    while (true) {
      const std::function<void(int64_t)> *task;
      int64_t i;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (next >= count)
          return;
        i = next++;
        task = fn;
      }
      (*task)(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }

  void workerLoop() {
    uint64_t seen = 0;
    while (true) {
      auto changed = [&] {
        return generation.load(std::memory_order_acquire) != seen;
      };
      auto deadline = std::chrono::steady_clock::now() + kSpinTime;
      while (!changed() && std::chrono::steady_clock::now() < deadline)
        for (int i = 0; i < 64 && !changed(); ++i)
          NEURON_SPIN_PAUSE();
      if (!changed()) {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stopping || changed(); });
        if (stopping)
          return;
      }
      seen = generation.load(std::memory_order_acquire);
      work();
    }
  }
};

int parseHostThreads(const char *value) {
  char *end = nullptr;
  long threads = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || threads < 1 || threads > 1024)
    throw Error(std::string("TORCHNEURON_HOST_THREADS must be a positive "
                            "integer, got '") +
                value + "'");
  return static_cast<int>(threads);
}

WorkerPool &WorkerPool::shared() {
  static WorkerPool pool([] {
    if (const char *value = std::getenv("TORCHNEURON_HOST_THREADS"))
      return parseHostThreads(value);
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }());
  return pool;
}

WorkerPool::WorkerPool(int threads)
    : numThreads(std::max(1, threads)), state(std::make_unique<State>()) {
  for (int i = 1; i < numThreads; ++i)
    state->workers.emplace_back([s = state.get()] { s->workerLoop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->stopping = true;
  }
  state->wake.notify_all();
  for (std::thread &worker : state->workers)
    worker.join();
}

void WorkerPool::run(int64_t count, const std::function<void(int64_t)> &fn) {
  State &s = *state;
  if (numThreads == 1 || count < 2 || getpid() != s.owner ||
      s.running.exchange(true, std::memory_order_acquire)) {
    for (int64_t i = 0; i < count; ++i)
      fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.fn = &fn;
    s.count = count;
    s.next = 0;
    s.done.store(0, std::memory_order_relaxed);
    s.generation.fetch_add(1, std::memory_order_release);
  }
  s.wake.notify_all();
  s.work();
  // Only chunks a worker has claimed can still be running. A worker the
  // system has preempted may hold one for a whole time slice: after a short
  // spin, give up the core, which may be the one it waits for.
  for (int spins = 0; s.done.load(std::memory_order_acquire) != count;
       ++spins) {
    if (spins < kWaitSpins)
      NEURON_SPIN_PAUSE();
    else
      std::this_thread::yield();
  }
  s.running.store(false, std::memory_order_release);
}

} // namespace neuron::runtime
