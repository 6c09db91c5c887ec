// A reference to an object owned by the host language (a Python object in production).
// The engine never looks inside a handle: it keeps the object alive and hands it back.
// Releasing the last reference runs the deleter the host installed (which, for Python,
// takes the GIL), so the engine never destroys handles while it holds its own locks.
#pragma once

#include <memory>
#include <string>

namespace tileops::engine {

using Handle = std::shared_ptr<void>;

// A handle plus the name errors print for it ("module.qualname" for a Python function).
struct NamedHandle {
  Handle object;
  std::string name;
};

}  // namespace tileops::engine
