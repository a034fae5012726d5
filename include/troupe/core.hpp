#pragma once
// The actor core in one include: typed actors, the actor system, clocks,
// error values and the library's version.
#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/version.hpp"
