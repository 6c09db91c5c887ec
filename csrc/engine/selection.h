// Layer one of dispatch: which set of kernels serves an op instance. Precedence is the
// constructor's target=, then the process default, then device detection; detection
// asks every registered detector about the device and needs exactly one "yes".
#pragma once

#include <functional>
#include <string>

#include "engine/registry.h"

namespace tileops::engine {

// What an op instance asked for, or what was decided for it.
struct TargetChoice {
  enum class Kind { kDetect, kBuiltin, kNamed };
  Kind kind = Kind::kDetect;
  std::string name;

  static TargetChoice detect() { return {}; }
  static TargetChoice builtin() { return {Kind::kBuiltin, {}}; }
  static TargetChoice named(std::string target) { return {Kind::kNamed, std::move(target)}; }
  bool operator==(const TargetChoice&) const = default;
};

// Asks one detector about the call's device; the host passes the device object through
// untouched. May throw: a raising detector is reported as a BackendError.
using AskDetector = std::function<bool(const NamedHandle& detector)>;

// Validates a constructor's target= (a name must be registered); BUILTIN and "detect"
// pass through. Throws EngineError(kUnknownTarget).
TargetChoice check_requested(const Registry& registry, const TargetChoice& requested);

// Settles the target for an instance's first call on `device_text`'s device.
// Never returns kDetect: detection ends in a name, or in kBuiltin when nobody claims the
// device. Throws kUnknownTarget, kAmbiguousTarget, or kBackend (nested on the detector's
// own exception) as the spec words them.
TargetChoice settle_target(const Registry& registry, const TargetChoice& requested, const std::string& device_text,
                           const AskDetector& ask);

// Asks only `target`'s detector whether it claims the device (C4's check for a settled
// instance meeting a new device). A target without a detector claims every device it
// was named for. Raising detectors are reported like in settle_target.
bool target_claims(const Registry& registry, const std::string& target, const std::string& device_text,
                   const AskDetector& ask);

}  // namespace tileops::engine
