#include "engine/kernel_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "engine/errors.h"
#include "tests/test_support.h"

namespace tileops::engine {
namespace {

using testing::text_of;

// The owner lock the cache expects callers to hold; the GIL plays this part in Python.
class MutexOwner final : public OwnerLock {
 public:
  explicit MutexOwner(std::mutex& mutex) : mutex_(mutex) {}
  void unlock() override { mutex_.unlock(); }
  void lock() override { mutex_.lock(); }

 private:
  std::mutex& mutex_;
};

std::vector<int64_t> key_for(int64_t rows) {
  KeyBuffer key;
  key.set_device(1, -1);
  const int64_t shape[] = {rows, 64};
  key.add_tensor(7, shape);
  key.add_absent();
  return {key.view().begin(), key.view().end()};
}

Handle kernel(std::string name) { return std::make_shared<std::string>(std::move(name)); }

class KernelCacheTest : public ::testing::Test {
 protected:
  void TearDown() override { KernelCache::set_capacity(KernelCache::kDefaultCapacity); }
  std::mutex owner_mutex;
};

TEST_F(KernelCacheTest, ASignatureIsBuiltOnceAndThenFound) {
  KernelCache cache("Op");
  std::lock_guard owner_lock(owner_mutex);
  MutexOwner owner(owner_mutex);
  int builds = 0;
  auto key = key_for(4);
  EXPECT_EQ(cache.find(key), nullptr);
  Handle first = cache.get_or_build(
      key, 0,
      [&] {
        ++builds;
        return kernel("k4");
      },
      owner);
  Handle again = cache.get_or_build(
      key, 0,
      [&] {
        ++builds;
        return kernel("other");
      },
      owner);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(first, again);
  const Handle* found = cache.find(key);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(text_of(*found), "k4");
  EXPECT_EQ(cache.stats().builds, 1u);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
}

TEST_F(KernelCacheTest, AFailedBuildLeavesNothingBehind) {
  KernelCache cache("Op");
  std::lock_guard owner_lock(owner_mutex);
  MutexOwner owner(owner_mutex);
  auto key = key_for(4);
  EXPECT_THROW(
      cache.get_or_build(key, 0, []() -> Handle { throw std::runtime_error("bad"); }, owner), std::runtime_error);
  EXPECT_EQ(cache.find(key), nullptr);
  EXPECT_EQ(cache.size(), 0u);
  Handle built = cache.get_or_build(key, 0, [] { return kernel("ok"); }, owner);
  EXPECT_EQ(text_of(built), "ok");
}

TEST_F(KernelCacheTest, TheLeastRecentlyUsedKernelIsEvictedAndReleased) {
  KernelCache::set_capacity(2);
  KernelCache cache("Op");
  std::lock_guard owner_lock(owner_mutex);
  MutexOwner owner(owner_mutex);
  std::weak_ptr<void> first;
  {
    Handle k1 = cache.get_or_build(key_for(1), 0, [] { return kernel("1"); }, owner);
    first = k1;
  }
  cache.get_or_build(key_for(2), 0, [] { return kernel("2"); }, owner);
  ASSERT_NE(cache.find(key_for(2)), nullptr);  // 2 is now more recent than 1
  cache.get_or_build(key_for(3), 0, [] { return kernel("3"); }, owner);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.find(key_for(1)), nullptr);
  EXPECT_TRUE(first.expired());
  EXPECT_EQ(cache.stats().evictions, 1u);
}

TEST_F(KernelCacheTest, ConcurrentFirstCallsBuildOnceAndAllGetThatKernel) {
  KernelCache cache("Op");
  std::atomic<int> builds{0};
  constexpr int kThreads = 8;
  std::vector<Handle> results(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::lock_guard owner_lock(owner_mutex);
      MutexOwner owner(owner_mutex);
      results[static_cast<size_t>(i)] = cache.get_or_build(
          key_for(8), 0,
          [&] {
            ++builds;
            // Let the other threads arrive while this build is in flight.
            owner.unlock();
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            owner.lock();
            return kernel("shared");
          },
          owner);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(builds.load(), 1);
  for (const auto& r : results) EXPECT_EQ(r, results.front());
}

TEST_F(KernelCacheTest, ABuilderWaitingOnItsOwnKeyIsAnErrorNotADeadlock) {
  KernelCache cache("RMSNormFwdOp");
  std::lock_guard owner_lock(owner_mutex);
  MutexOwner owner(owner_mutex);
  auto key = key_for(2);
  try {
    cache.get_or_build(
        key, 0, [&] { return cache.get_or_build(key, 0, [] { return kernel("inner"); }, owner); }, owner);
    FAIL();
  } catch (const EngineError& error) {
    EXPECT_NE(std::string(error.what()).find("RMSNormFwdOp"), std::string::npos);
  }
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(KernelCacheTest, AChildForkedDuringABuildBuildsTheKeyItself) {
  KernelCache cache("Op");
  std::atomic<bool> building{false}, release{false};
  std::thread builder([&] {
    std::lock_guard owner_lock(owner_mutex);
    MutexOwner owner(owner_mutex);
    cache.get_or_build(
        key_for(5), 0,
        [&] {
          owner.unlock();  // like a Python builder letting the GIL go
          building = true;
          while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          owner.lock();
          return kernel("parent");
        },
        owner);
  });
  while (!building) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t child = fork();
  if (child == 0) {
    // The builder thread does not exist here: waiting for it would hang forever.
    alarm(10);
    std::lock_guard owner_lock(owner_mutex);
    MutexOwner owner(owner_mutex);
    Handle built = cache.get_or_build(key_for(5), 0, [] { return kernel("child"); }, owner);
    _exit(text_of(built) == "child" ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  release = true;
  builder.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(Signature, KeysDecodeToDeviceAndSlotsInOrder) {
  KeyBuffer key;
  key.set_device(2, 1);
  key.add_absent();
  const int64_t shape[] = {3, 4};
  key.add_tensor(9, shape);
  auto decoded = decode_key(key.view());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->device_type, 2);
  EXPECT_EQ(decoded->device_index, 1);
  ASSERT_EQ(decoded->slots.size(), 2u);
  EXPECT_FALSE(decoded->slots[0].has_value());
  EXPECT_EQ(decoded->slots[1]->shape, (std::vector<int64_t>{3, 4}));
}

TEST(Signature, LongKeysSpillToTheHeapAndStayEqual) {
  KeyBuffer a, b;
  a.set_device(1, -1);
  b.set_device(1, -1);
  std::vector<int64_t> shape(100, 2);
  a.add_tensor(1, shape);
  b.add_tensor(1, shape);
  EXPECT_EQ(a.view().size(), 104u);
  EXPECT_TRUE(KeyEqual{}(a.view(), b.view()));
  EXPECT_EQ(KeyHash{}(a.view()), KeyHash{}(b.view()));
}

}  // namespace
}  // namespace tileops::engine
