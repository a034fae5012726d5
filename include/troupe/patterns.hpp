#pragma once
// The patterns layer: keyed lock (doc/lock.md), back-pressured process
// manager (doc/process_manager.md) and job service (doc/jobs.md).
#include "troupe/patterns/job_service.hpp"
#include "troupe/patterns/keyed_lock.hpp"
#include "troupe/patterns/process_manager.hpp"
