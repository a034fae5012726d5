// The device fleet's bookkeeping: what the devices demo's "0 double
// workers" and "longest time without a worker" rest on.

#include "fleet.hpp"

#include <gtest/gtest.h>

#include "troupe/cluster/placement_source.hpp"

namespace devices {
namespace {

using namespace std::chrono_literals;

TEST(DeviceFleet, ASecondWorkerOnOneDeviceIsCountedAsADoubleWithBothWorkersNamed) {
  auto t0 = Steady::now();
  Fleet f(3, 500ms, t0);
  ASSERT_TRUE(f.attach("dev-00001", "n1/5", t0));
  ASSERT_TRUE(f.attach("dev-00002", "n1/6", t0));
  EXPECT_EQ(f.doubles(), 0u);
  ASSERT_TRUE(f.attach("dev-00001", "n2/9", t0 + 1ms));
  EXPECT_EQ(f.doubles(), 1u);
  auto s = f.stats(t0 + 2ms);
  EXPECT_EQ(s["doubles"], 1);
  EXPECT_EQ(s["double_samples"][0]["device"], "dev-00001");
  EXPECT_EQ(s["double_samples"][0]["workers"], nlohmann::json::array({"n1/5", "n2/9"}));
  // One after the other is no double: the first detaches, then another attaches.
  f.detach("dev-00002", "n1/6", t0 + 3ms);
  ASSERT_TRUE(f.attach("dev-00002", "n3/10", t0 + 4ms));
  EXPECT_EQ(f.doubles(), 1u);
  EXPECT_EQ(f.stats(t0 + 5ms)["connections"], 3);
}

TEST(DeviceFleet, GapsAfterAWorkerAndWaitsBeforeTheFirstAreKeptApartIncludingOpenOnes) {
  auto t0 = Steady::now();
  Fleet f(2, 500ms, t0);
  ASSERT_TRUE(f.attach("dev-00001", "a", t0 + 300ms));  // waited 300 ms
  f.detach("dev-00001", "a", t0 + 1s);
  ASSERT_TRUE(f.attach("dev-00001", "b", t0 + 1s + 1200ms));  // a gap of 1.2 s
  auto s = f.stats(t0 + 3s);
  EXPECT_EQ(s["longest_gap_ms"], 1200);
  // dev-00002 never had a worker: an open wait of 3 s.
  EXPECT_EQ(s["longest_wait_ms"], 3000);
  EXPECT_EQ(s["running"], 1);
  EXPECT_EQ(s["workerless"], 1);
  EXPECT_EQ(s["gaps"], 1);
  // A mark starts the records afresh; what is open counts from it.
  f.mark(t0 + 3s);
  s = f.stats(t0 + 3s + 100ms);
  EXPECT_EQ(s["longest_gap_ms"], 0);
  EXPECT_EQ(s["longest_wait_ms"], 100);
}

TEST(DeviceFleet, RemovedDevicesLeaveTheDesiredSetAndRefuseNewWorkers) {
  auto t0 = Steady::now();
  Fleet f(4, 250ms, t0);
  ASSERT_TRUE(f.attach("dev-00002", "a", t0));
  auto removed = f.remove(2, t0);
  EXPECT_EQ(removed, (std::vector<std::string>{"dev-00001", "dev-00002"}));
  EXPECT_FALSE(f.contains("dev-00002"));
  EXPECT_FALSE(f.attach("dev-00001", "b", t0));
  auto added = f.add(1, t0);
  EXPECT_EQ(added, std::vector<std::string>{"dev-00005"});
  // The desired set is what a worker group's source reads.
  auto set = troupe::cluster::parse_desired_set(f.desired_set(), "fleet");
  ASSERT_TRUE(set.ok()) << set.error().to_string();
  EXPECT_EQ(set->size(), 3u);
  EXPECT_EQ(set->count("dev-00003"), 1u);
  EXPECT_EQ(set->at("dev-00005"), R"({"model":"m3","interval_ms":250})");
  // The removed device's worker still counts until it detaches; then it is gone.
  auto s = f.stats(t0);
  EXPECT_EQ(s["devices"], 3);
  EXPECT_EQ(s["connections"], 1);
  EXPECT_EQ(s["refused"], 1);
  f.detach("dev-00002", "a", t0);
  EXPECT_EQ(f.stats(t0)["connections"], 0);
  EXPECT_EQ(f.stats(t0)["workerless"], 3);
}

}  // namespace
}  // namespace devices
