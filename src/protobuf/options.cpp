// The (troupe.protobuf.version) option of a message type, read from its
// descriptor (troupe/protobuf/codecs.hpp).

#include "troupe/protobuf/codecs.hpp"
#include "troupe/protobuf/options.pb.h"

namespace troupe::protobuf {

std::uint32_t version_of(const google::protobuf::Descriptor& message) {
  const auto& options = message.options();
  if (!options.HasExtension(troupe::protobuf::version)) return 1;
  return options.GetExtension(troupe::protobuf::version);
}

}  // namespace troupe::protobuf
