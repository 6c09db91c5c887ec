// The tables a backend writes at import time: detectors per target, builders per
// (op, target), the process default target and the record of backends that failed to
// load. One backend's import is a transaction: everything it registered is rolled back
// if the import fails midway, so no half-registered target remains.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/handle.h"

namespace tileops::engine {

// The process default: none (device detection), BUILTIN (in-tree kernels), or a name.
struct DefaultTarget {
  enum class Kind { kNone, kBuiltin, kNamed };
  Kind kind = Kind::kNone;
  std::string name;

  static DefaultTarget none() { return {}; }
  static DefaultTarget builtin() { return {Kind::kBuiltin, {}}; }
  static DefaultTarget named(std::string target) { return {Kind::kNamed, std::move(target)}; }
  bool operator==(const DefaultTarget&) const = default;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Throws EngineError(kBackend) when the target already has a detector.
  void register_detector(const std::string& target, NamedHandle detector);
  // Throws EngineError(kBackend) — a misinstall — when (op, target) already has a builder.
  void register_builder(const std::string& op, const std::string& target, NamedHandle builder);

  // Every target with a detector or a builder, sorted.
  std::vector<std::string> targets() const;
  // Targets with a builder for `op`, sorted.
  std::vector<std::string> targets_for_op(const std::string& op) const;
  bool knows(const std::string& target) const;
  // Every (op, target) with a builder, sorted: op names as registered, declared or not.
  std::vector<std::pair<std::string, std::string>> builder_keys() const;

  // Detectors in target order: what device detection asks, one by one.
  std::vector<std::pair<std::string, NamedHandle>> detectors() const;
  std::optional<NamedHandle> detector(const std::string& target) const;
  std::optional<NamedHandle> builder(const std::string& op, const std::string& target) const;

  // Throws EngineError(kUnknownTarget) for a name nobody registered.
  void set_default(DefaultTarget target);
  DefaultTarget default_target() const;

  void add_load_failure(std::string line);
  std::vector<std::string> load_failures() const;
  // The B9 note for target-choice errors; empty when every backend loaded.
  std::string failure_note() const;

  // One backend's import. Nested transactions are not allowed: imports run one at a time.
  void begin_transaction();
  void commit_transaction();
  void rollback_transaction();
  bool in_transaction() const;

  // Forget everything (tests, and tileops.backend's reset for fresh discovery).
  void clear();

 private:
  struct Tables {
    std::map<std::string, NamedHandle> detectors;
    std::map<std::pair<std::string, std::string>, NamedHandle> builders;  // (op, target)
    DefaultTarget default_target;
  };

  mutable std::mutex mutex_;
  Tables tables_;
  std::vector<std::string> load_failures_;
  std::optional<Tables> snapshot_;  // set while a backend's import is in progress
};

}  // namespace tileops::engine
