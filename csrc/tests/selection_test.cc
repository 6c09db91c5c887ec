#include "engine/selection.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "engine/errors.h"
#include "tests/test_support.h"

namespace tileops::engine {
namespace {

using testing::named;
using testing::text_of;

// Detectors named "<target>.yes" claim the device, "<target>.raise" throw, others decline.
AskDetector scripted() {
  return [](const NamedHandle& detector) {
    const std::string& name = text_of(detector.object);
    if (name.ends_with(".raise")) throw std::runtime_error("driver missing");
    return name.ends_with(".yes");
  };
}

TEST(Selection, TheConstructorsTargetWinsOverTheDefaultAndDetection) {
  Registry registry;
  registry.register_detector("a", named("a.yes"));
  registry.register_detector("b", named("b.no"));
  registry.set_default(DefaultTarget::named("a"));
  EXPECT_EQ(settle_target(registry, TargetChoice::named("b"), "cpu", scripted()), TargetChoice::named("b"));
}

TEST(Selection, TheProcessDefaultWinsOverDetection) {
  Registry registry;
  registry.register_detector("a", named("a.yes"));
  registry.set_default(DefaultTarget::builtin());
  EXPECT_EQ(settle_target(registry, TargetChoice::detect(), "cpu", scripted()), TargetChoice::builtin());
}

TEST(Selection, ExactlyOneClaimantIsChosen) {
  Registry registry;
  registry.register_detector("a", named("a.no"));
  registry.register_detector("b", named("b.yes"));
  EXPECT_EQ(settle_target(registry, TargetChoice::detect(), "cpu", scripted()), TargetChoice::named("b"));
}

TEST(Selection, NoClaimantMeansTheInTreeKernels) {
  Registry registry;
  registry.register_detector("a", named("a.no"));
  EXPECT_EQ(settle_target(registry, TargetChoice::detect(), "cpu", scripted()), TargetChoice::builtin());
}

TEST(Selection, TwoClaimantsAreAmbiguousAndNamedInOrder) {
  Registry registry;
  registry.register_detector("zeta", named("zeta.yes"));
  registry.register_detector("alpha", named("alpha.yes"));
  try {
    settle_target(registry, TargetChoice::detect(), "cpu", scripted());
    FAIL();
  } catch (const EngineError& error) {
    EXPECT_EQ(error.kind(), EngineError::Kind::kAmbiguousTarget);
    const std::string text = error.what();
    EXPECT_NE(text.find("['alpha', 'zeta']"), std::string::npos) << text;
    EXPECT_NE(text.find("target="), std::string::npos) << text;
  }
}

TEST(Selection, ARaisingDetectorIsABackendErrorNestingTheCause) {
  Registry registry;
  registry.register_detector("flaky", named("flaky.raise"));
  try {
    settle_target(registry, TargetChoice::detect(), "cpu", scripted());
    FAIL();
  } catch (const EngineError& error) {
    EXPECT_EQ(error.kind(), EngineError::Kind::kBackend);
    EXPECT_NE(std::string(error.what()).find("flaky.raise"), std::string::npos);
    try {
      std::rethrow_if_nested(error);
      FAIL() << "no nested cause";
    } catch (const std::runtime_error& cause) {
      EXPECT_STREQ(cause.what(), "driver missing");
    }
  }
}

TEST(Selection, AnUnknownRequestedTargetListsTheKnownOnesWithTheFailureNote) {
  Registry registry;
  registry.register_detector("torch_cpu", named("cpu.no"));
  registry.add_load_failure("x (y): ImportError: z");
  try {
    check_requested(registry, TargetChoice::named("nope"));
    FAIL();
  } catch (const EngineError& error) {
    EXPECT_EQ(error.kind(), EngineError::Kind::kUnknownTarget);
    EXPECT_STREQ(error.what(),
                 "no backend registered target 'nope'; known targets: ['torch_cpu'] (1 "
                 "backend(s) failed to load; see tileops.backend.load_failures())");
  }
}

TEST(Selection, DetectionAsksEveryDetectorInTargetOrder) {
  Registry registry;
  registry.register_detector("c", named("c.no"));
  registry.register_detector("a", named("a.no"));
  registry.register_detector("b", named("b.no"));
  std::vector<std::string> asked;
  settle_target(registry, TargetChoice::detect(), "cpu", [&](const NamedHandle& d) {
    asked.push_back(d.name);
    return false;
  });
  EXPECT_EQ(asked, (std::vector<std::string>{"a.no", "b.no", "c.no"}));
}

}  // namespace
}  // namespace tileops::engine
