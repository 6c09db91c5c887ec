#include "engine/selection.h"

#include <exception>
#include <vector>

#include "engine/errors.h"

namespace tileops::engine {
namespace {

bool ask_one(const Registry& registry, const std::string& target, const NamedHandle& detector,
             const std::string& device_text, const AskDetector& ask) {
  try {
    return ask(detector);
  } catch (const PassThrough&) {
    throw;
  } catch (...) {
    // Keep the detector's own exception as the cause: the host chains it.
    std::throw_with_nested(
        EngineError(EngineError::Kind::kBackend,
                    messages::detector_raised(target, detector.name, device_text) + registry.failure_note()));
  }
}

}  // namespace

TargetChoice check_requested(const Registry& registry, const TargetChoice& requested) {
  if (requested.kind == TargetChoice::Kind::kNamed && !registry.knows(requested.name)) {
    throw EngineError(EngineError::Kind::kUnknownTarget,
                      messages::unknown_target(requested.name, registry.targets()) + registry.failure_note());
  }
  return requested;
}

TargetChoice settle_target(const Registry& registry, const TargetChoice& requested, const std::string& device_text,
                           const AskDetector& ask) {
  if (requested.kind != TargetChoice::Kind::kDetect) return check_requested(registry, requested);

  const DefaultTarget fallback = registry.default_target();
  switch (fallback.kind) {
    case DefaultTarget::Kind::kBuiltin: return TargetChoice::builtin();
    case DefaultTarget::Kind::kNamed:
      // A default is validated when set, but its backend may have been reset since.
      return check_requested(registry, TargetChoice::named(fallback.name));
    case DefaultTarget::Kind::kNone: break;
  }

  std::vector<std::string> claimants;
  for (const auto& [target, detector] : registry.detectors()) {
    if (ask_one(registry, target, detector, device_text, ask)) claimants.push_back(target);
  }
  if (claimants.empty()) return TargetChoice::builtin();
  if (claimants.size() > 1) {
    throw EngineError(EngineError::Kind::kAmbiguousTarget,
                      messages::ambiguous_target(device_text, claimants) + registry.failure_note());
  }
  return TargetChoice::named(claimants.front());
}

bool target_claims(const Registry& registry, const std::string& target, const std::string& device_text,
                   const AskDetector& ask) {
  auto detector = registry.detector(target);
  if (!detector) return true;
  return ask_one(registry, target, *detector, device_text, ask);
}

}  // namespace tileops::engine
