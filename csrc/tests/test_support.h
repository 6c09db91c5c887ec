// Handles for the engine tests: plain C++ objects standing in for Python objects.
#pragma once

#include <memory>
#include <string>

#include "engine/handle.h"

namespace tileops::engine::testing {

inline NamedHandle named(std::string name) { return {std::make_shared<std::string>(name), std::move(name)}; }

inline const std::string& text_of(const Handle& handle) { return *static_cast<const std::string*>(handle.get()); }

}  // namespace tileops::engine::testing
