// troupe::version(): the version the library was built as, compiled in from
// the generated troupe/version.hpp.

#include "troupe/version.hpp"

namespace troupe {

std::string_view version() noexcept { return TROUPE_VERSION_STRING; }

}  // namespace troupe
