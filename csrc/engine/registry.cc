#include "engine/registry.h"

#include <algorithm>
#include <set>

#include "engine/errors.h"

namespace tileops::engine {

void Registry::register_detector(const std::string& target, NamedHandle detector) {
  std::lock_guard lock(mutex_);
  if (auto it = tables_.detectors.find(target); it != tables_.detectors.end()) {
    throw EngineError(EngineError::Kind::kBackend,
                      messages::duplicate_detector(target, it->second.name, detector.name));
  }
  tables_.detectors.emplace(target, std::move(detector));
}

void Registry::register_builder(const std::string& op, const std::string& target, NamedHandle builder) {
  std::lock_guard lock(mutex_);
  auto key = std::make_pair(op, target);
  if (auto it = tables_.builders.find(key); it != tables_.builders.end()) {
    throw EngineError(EngineError::Kind::kBackend,
                      messages::duplicate_builder(op, target, it->second.name, builder.name));
  }
  tables_.builders.emplace(std::move(key), std::move(builder));
}

std::vector<std::string> Registry::targets() const {
  std::lock_guard lock(mutex_);
  std::set<std::string> names;
  for (const auto& [target, _] : tables_.detectors) names.insert(target);
  for (const auto& [key, _] : tables_.builders) names.insert(key.second);
  return {names.begin(), names.end()};
}

std::vector<std::string> Registry::targets_for_op(const std::string& op) const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [key, _] : tables_.builders) {
    if (key.first == op) names.push_back(key.second);
  }
  return names;  // std::map order is (op, target): already sorted by target within an op
}

std::vector<std::pair<std::string, std::string>> Registry::builder_keys() const {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& [key, _] : tables_.builders) keys.push_back(key);
  return keys;
}

bool Registry::knows(const std::string& target) const {
  std::lock_guard lock(mutex_);
  if (tables_.detectors.contains(target)) return true;
  return std::any_of(tables_.builders.begin(), tables_.builders.end(),
                     [&](const auto& entry) { return entry.first.second == target; });
}

std::vector<std::pair<std::string, NamedHandle>> Registry::detectors() const {
  std::lock_guard lock(mutex_);
  return {tables_.detectors.begin(), tables_.detectors.end()};
}

std::optional<NamedHandle> Registry::detector(const std::string& target) const {
  std::lock_guard lock(mutex_);
  auto it = tables_.detectors.find(target);
  if (it == tables_.detectors.end()) return std::nullopt;
  return it->second;
}

std::optional<NamedHandle> Registry::builder(const std::string& op, const std::string& target) const {
  std::lock_guard lock(mutex_);
  auto it = tables_.builders.find({op, target});
  if (it == tables_.builders.end()) return std::nullopt;
  return it->second;
}

void Registry::set_default(DefaultTarget target) {
  if (target.kind == DefaultTarget::Kind::kNamed && !knows(target.name)) {
    throw EngineError(EngineError::Kind::kUnknownTarget,
                      messages::unknown_target(target.name, targets()) + failure_note());
  }
  std::lock_guard lock(mutex_);
  tables_.default_target = std::move(target);
}

DefaultTarget Registry::default_target() const {
  std::lock_guard lock(mutex_);
  return tables_.default_target;
}

void Registry::add_load_failure(std::string line) {
  std::lock_guard lock(mutex_);
  load_failures_.push_back(std::move(line));
}

std::vector<std::string> Registry::load_failures() const {
  std::lock_guard lock(mutex_);
  return load_failures_;
}

std::string Registry::failure_note() const {
  std::lock_guard lock(mutex_);
  return messages::load_failure_note(load_failures_.size());
}

void Registry::begin_transaction() {
  std::lock_guard lock(mutex_);
  if (snapshot_) {
    throw EngineError(EngineError::Kind::kBackend, "a backend import began while another was still registering");
  }
  snapshot_ = tables_;
}

void Registry::commit_transaction() {
  std::optional<Tables> dropped;  // destroyed after the lock is released
  std::lock_guard lock(mutex_);
  dropped.swap(snapshot_);
}

void Registry::rollback_transaction() {
  Tables dropped;  // the half-registered tables die outside the lock: their deleters run host code
  {
    std::lock_guard lock(mutex_);
    if (!snapshot_) return;
    dropped = std::exchange(tables_, std::move(*snapshot_));
    snapshot_.reset();
  }
}

bool Registry::in_transaction() const {
  std::lock_guard lock(mutex_);
  return snapshot_.has_value();
}

void Registry::clear() {
  Tables dropped;
  std::optional<Tables> dropped_snapshot;
  std::lock_guard lock(mutex_);
  dropped = std::exchange(tables_, Tables{});
  dropped_snapshot.swap(snapshot_);
  load_failures_.clear();
}

}  // namespace tileops::engine
