#include "engine/registry.h"

#include <gtest/gtest.h>

#include "engine/errors.h"
#include "tests/test_support.h"

namespace tileops::engine {
namespace {

using testing::named;

TEST(Registry, ListsEveryTargetWithADetectorOrABuilderSorted) {
  Registry registry;
  registry.register_detector("zeta", named("z.detect"));
  registry.register_builder("RMSNormFwdOp", "alpha", named("a.build"));
  EXPECT_EQ(registry.targets(), (std::vector<std::string>{"alpha", "zeta"}));
  EXPECT_EQ(registry.targets_for_op("RMSNormFwdOp"), (std::vector<std::string>{"alpha"}));
  EXPECT_TRUE(registry.targets_for_op("SoftmaxFwdOp").empty());
}

TEST(Registry, ListsEveryBuilderKeyAsRegisteredSortedByOpThenTarget) {
  Registry registry;
  registry.register_builder("GemmOp", "zeta", named("z.build"));
  registry.register_builder("GemmFwdOp", "zeta", named("z.build2"));
  registry.register_builder("GemmFwdOp", "alpha", named("a.build"));
  using Key = std::pair<std::string, std::string>;
  EXPECT_EQ(registry.builder_keys(),
            (std::vector<Key>{{"GemmFwdOp", "alpha"}, {"GemmFwdOp", "zeta"}, {"GemmOp", "zeta"}}));
}

TEST(Registry, ASecondDetectorForATargetNamesBothFunctions) {
  Registry registry;
  registry.register_detector("acme", named("first.detect"));
  try {
    registry.register_detector("acme", named("second.detect"));
    FAIL() << "a duplicate detector was accepted";
  } catch (const EngineError& error) {
    EXPECT_EQ(error.kind(), EngineError::Kind::kBackend);
    EXPECT_NE(std::string(error.what()).find("first.detect"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("second.detect"), std::string::npos);
  }
}

TEST(Registry, ASecondBuilderForAnOpAndTargetIsAMisinstall) {
  Registry registry;
  registry.register_builder("GemmFwdOp", "acme", named("pkg_a.build"));
  try {
    registry.register_builder("GemmFwdOp", "acme", named("pkg_a.build"));
    FAIL() << "a duplicate builder was accepted";
  } catch (const EngineError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("misinstall"), std::string::npos) << text;
    EXPECT_NE(text.find("GemmFwdOp"), std::string::npos) << text;
  }
}

TEST(Registry, RollingBackATransactionRemovesEverythingItRegistered) {
  Registry registry;
  registry.register_detector("kept", named("kept.detect"));
  registry.begin_transaction();
  registry.register_detector("half", named("half.detect"));
  registry.register_builder("RMSNormFwdOp", "half", named("half.build"));
  registry.set_default(DefaultTarget::named("half"));
  registry.rollback_transaction();
  EXPECT_EQ(registry.targets(), (std::vector<std::string>{"kept"}));
  EXPECT_EQ(registry.default_target(), DefaultTarget::none());
  EXPECT_FALSE(registry.in_transaction());
}

TEST(Registry, CommittingATransactionKeepsItsRegistrations) {
  Registry registry;
  registry.begin_transaction();
  registry.register_detector("acme", named("acme.detect"));
  registry.commit_transaction();
  EXPECT_TRUE(registry.knows("acme"));
}

TEST(Registry, RollbackReleasesTheHandlesItDropped) {
  Registry registry;
  std::weak_ptr<void> watched;
  registry.begin_transaction();
  {
    NamedHandle detector = named("gone.detect");
    watched = detector.object;
    registry.register_detector("gone", std::move(detector));
  }
  EXPECT_FALSE(watched.expired());
  registry.rollback_transaction();
  EXPECT_TRUE(watched.expired());
}

TEST(Registry, AnUnknownDefaultTargetIsRejectedWithTheKnownOnes) {
  Registry registry;
  registry.register_detector("torch_cpu", named("cpu.detect"));
  try {
    registry.set_default(DefaultTarget::named("nope"));
    FAIL();
  } catch (const EngineError& error) {
    EXPECT_EQ(error.kind(), EngineError::Kind::kUnknownTarget);
    EXPECT_STREQ(error.what(), "no backend registered target 'nope'; known targets: ['torch_cpu']");
  }
}

TEST(Registry, LoadFailuresAddTheNoteToTargetErrors) {
  Registry registry;
  EXPECT_EQ(registry.failure_note(), "");
  registry.add_load_failure("broken (broken_mod): ImportError: no");
  EXPECT_EQ(registry.failure_note(), " (1 backend(s) failed to load; see tileops.backend.load_failures())");
  EXPECT_EQ(registry.load_failures().size(), 1u);
}

TEST(Messages, PythonReprQuotesLikePython) {
  EXPECT_EQ(py_repr("abc"), "'abc'");
  EXPECT_EQ(py_repr("it's"), "\"it's\"");
  EXPECT_EQ(py_list({}), "[]");
  EXPECT_EQ(py_list({"a", "b"}), "['a', 'b']");
}

TEST(Messages, NoBuilderTextIsTheSpecsWordForWord) {
  EXPECT_EQ(messages::no_builder("torch_cpu", "SoftmaxFwdOp", {}),
            "target 'torch_cpu' registers no kernel builder for SoftmaxFwdOp; targets that do: "
            "[]. There is no fall back to the in-tree implementation: those kernels do not run "
            "on this target's devices.");
  EXPECT_EQ(messages::not_wired("torch_cpu", "GemmOp", "gemm_kernel"),
            "target 'torch_cpu' serves GemmOp, but its 'gemm_kernel' call site does not hand "
            "over the tensors a builder is described with; that op is not wired to external "
            "targets yet");
}

}  // namespace
}  // namespace tileops::engine
