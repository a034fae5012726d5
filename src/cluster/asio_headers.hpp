#pragma once
// Standalone Asio for the cluster layer's sources, included first in each
// of them: the network layer's header, which says why it comes first.

// clang-format off
#include "../net/asio_headers.hpp"
// clang-format on
