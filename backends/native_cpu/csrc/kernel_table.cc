#include "kernel_table.h"

#include <stdexcept>
#include <string>

namespace tnc {

void KernelTable::put(const Entry& entry, bool replace) {
  for (Entry& e : entries_) {
    if (e.name != std::string_view(entry.name) || e.dtype != entry.dtype || e.variant != entry.variant) continue;
    if (!replace || e.args != entry.args)
      throw std::logic_error(std::string("native_cpu: kernel '") + entry.name + "' (" + dtype_name(entry.dtype) +
                             ", variant " + std::to_string(entry.variant) +
                             ") is registered twice, or replaced with another signature");
    e.fn = entry.fn;
    return;
  }
  if (replace)
    throw std::logic_error(std::string("native_cpu: an ISA extension replaces kernel '") + entry.name +
                           "', which no family registered");
  entries_.push_back(entry);
}

KernelTable::Erased KernelTable::get(std::string_view name, DType dtype, int variant, const char* args) const {
  for (const Entry& e : entries_)
    if (e.name == name && e.dtype == dtype && e.variant == variant && e.args == args) return e.fn;
  return nullptr;
}

void KernelTable::add_member(const char* enumeration, const char* name) { members_.push_back({enumeration, name}); }

std::vector<const char*> KernelTable::members(std::string_view enumeration) const {
  std::vector<const char*> names;
  for (const Member& m : members_)
    if (m.enumeration == enumeration) names.push_back(m.name);
  return names;
}

}  // namespace tnc
