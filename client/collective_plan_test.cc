#include "client/collective_plan.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace gradsync::client {
namespace {

CollectiveSettings Read(std::map<std::string, std::string> flags) {
  StatusOr<CollectiveSettings> s = CollectiveSettings::FromConfig(Config::FromMap(flags));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : CollectiveSettings{};
}

std::string Refusal(std::map<std::string, std::string> flags) {
  StatusOr<CollectiveSettings> s = CollectiveSettings::FromConfig(Config::FromMap(flags));
  EXPECT_FALSE(s.ok());
  return s.ok() ? "" : s.status().message();
}

TEST(CollectivePlanTest, ReadsEverySettingOnceIntoWhatItMeans) {
  const CollectiveSettings d = Read({});
  EXPECT_EQ(d.way, SyncPath::kRing);
  EXPECT_TRUE(d.shm && d.shm_segments && d.measured_order);
  EXPECT_EQ(d.lanes, 1);
  EXPECT_FALSE(d.lanes_auto);
  EXPECT_EQ(d.algorithm, RingAlgorithm::kAuto);
  const CollectiveSettings s = Read({{"path", "ps"},
                                     {"ring_shm", "false"},
                                     {"ring_shm_allreduce", "ring"},
                                     {"ring_order", "rank"},
                                     {"ring_lanes", "auto"},
                                     {"ring_algorithm", "halving_doubling"}});
  EXPECT_EQ(s.way, SyncPath::kPs);
  EXPECT_FALSE(s.shm || s.shm_segments || s.measured_order);
  EXPECT_EQ(s.lanes, kAutoRingLanes);
  EXPECT_TRUE(s.lanes_auto);
  EXPECT_EQ(s.algorithm, RingAlgorithm::kHalvingDoubling);
  EXPECT_EQ(Read({{"backend", "nccl"}}).way, SyncPath::kNccl);
  EXPECT_EQ(Read({{"ring_lanes", "3"}}).lanes, 3);
}

TEST(CollectivePlanTest, RefusesAValueNamingTheSettingAndItsChoices) {
  EXPECT_EQ(Refusal({{"path", "ring"}}), "path must be allreduce or ps, got 'ring'");
  EXPECT_EQ(Refusal({{"backend", "gloo"}}), "backend must be ring or nccl, got 'gloo'");
  EXPECT_EQ(Refusal({{"ring_algorithm", "tree"}}),
            "ring_algorithm must be ring, halving_doubling or auto, got 'tree'");
  EXPECT_EQ(Refusal({{"ring_order", "random"}}),
            "ring_order must be measured or rank, got 'random'");
  EXPECT_EQ(Refusal({{"ring_shm_allreduce", "tree"}}),
            "ring_shm_allreduce must be segments or ring, got 'tree'");
  EXPECT_EQ(Refusal({{"ring_lanes", "0"}}), "ring_lanes must be auto or in [1, 16], got 0");
}

TEST(CollectivePlanTest, OneHostWithSharedMemoryGoesThroughSegmentsOnOneLane) {
  CollectiveSettings s = Read({{"ring_lanes", "auto"}});
  const CollectivePlan p = PlanCollectives(s, {8, 1});
  EXPECT_TRUE(p.same_host && p.segments);
  EXPECT_EQ(p.lanes, 1);
  EXPECT_FALSE(p.lanes_auto);
  EXPECT_EQ(p.algorithm, RingAlgorithm::kRing);
  EXPECT_FALSE(p.measured_order);
  EXPECT_EQ(p.Labels().at("same_host"), "segments");
  s.shm_segments = false;
  EXPECT_EQ(PlanCollectives(s, {8, 1}).Labels().at("same_host"), "ring");
  // Without shared memory the ring's streams carry everything, lanes and all.
  s.shm = false;
  const CollectivePlan streams = PlanCollectives(s, {8, 1});
  EXPECT_FALSE(streams.same_host);
  EXPECT_TRUE(streams.lanes_auto);
  EXPECT_EQ(streams.algorithm, RingAlgorithm::kAuto);
}

TEST(CollectivePlanTest, HalvingAndDoublingOnlyWherePowersOfTwoOfAtLeastFourSpanHosts) {
  CollectiveSettings s = Read({{"ring_algorithm", "halving_doubling"}});
  EXPECT_EQ(PlanCollectives(s, {8, 2}).algorithm, RingAlgorithm::kHalvingDoubling);
  const CollectivePlan six = PlanCollectives(s, {6, 2});
  EXPECT_EQ(six.algorithm, RingAlgorithm::kRing);
  EXPECT_NE(six.Describe().find("needs a power of two of at least 4 workers"), std::string::npos)
      << six.Describe();
  EXPECT_EQ(PlanCollectives(s, {2, 2}).algorithm, RingAlgorithm::kRing);
  s.way = SyncPath::kNccl;  // the ring beside NCCL: one lane, round the ring
  const CollectivePlan nccl = PlanCollectives(s, {8, 2});
  EXPECT_EQ(nccl.algorithm, RingAlgorithm::kRing);
  EXPECT_EQ(nccl.lanes, 1);
  EXPECT_FALSE(nccl.same_host);
}

TEST(CollectivePlanTest, TheOrderIsMeasuredFromFourHostsToSixtyFour) {
  const CollectiveSettings s = Read({});
  EXPECT_FALSE(PlanCollectives(s, {3, 3}).measured_order);
  EXPECT_TRUE(PlanCollectives(s, {4, 4}).measured_order);
  EXPECT_TRUE(PlanCollectives(s, {128, 64}).measured_order);
  const CollectivePlan many = PlanCollectives(s, {130, 65});
  EXPECT_FALSE(many.measured_order);
  EXPECT_NE(many.Describe().find("at most 64 hosts"), std::string::npos) << many.Describe();
  EXPECT_FALSE(PlanCollectives(Read({{"ring_order", "rank"}}), {8, 8}).measured_order);
}

TEST(CollectivePlanTest, DescribesThePlanInOneLineAndLabelsIt) {
  const CollectivePlan p = PlanCollectives(Read({{"path", "ps"}, {"ring_lanes", "2"}}), {4, 4});
  const std::string line = p.Describe();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("buckets to the parameter servers; 4 workers on 4 hosts; ring of 2 lanes "
                      "in measured host order"),
            std::string::npos)
      << line;
  const std::map<std::string, std::string> want = {{"path", "ps"},
                                                   {"algorithm", "auto"},
                                                   {"lanes", "2"},
                                                   {"order", "measured"},
                                                   {"same_host", "no"}};
  EXPECT_EQ(p.Labels(), want);
}

}  // namespace
}  // namespace gradsync::client
