#pragma once
// The persist layer: event-sourced entities and their journals.
#include "troupe/persist/codec.hpp"
#include "troupe/persist/effect.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/forwarding_journal.hpp"
#include "troupe/persist/journal.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/outbox.hpp"
#include "troupe/persist/outbox_dispatcher.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/persist/sqlite_read_model.hpp"
