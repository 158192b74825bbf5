// Unit tests of SLURM's list parsers (src/comm/bootstrap/hostlist.h) and of detectSlurm()
// against hand-written SLURM environments.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

#include "comm/bootstrap/hostlist.h"
#include "tessera/comm/bootstrap/init.h"

using tessera::slurm::expandHostlist;
using tessera::slurm::expandTasksPerNode;
using Names = std::vector<std::string>;

namespace {

// Expects `fn` to throw tessera::Error whose message contains every one of `parts`.
template <typename F>
void expectError(F fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one mentioning " << parts.front();
  } catch (const tessera::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Hostlist, SingleAndPlainLists) {
  EXPECT_EQ(expandHostlist("vm"), Names({"vm"}));
  EXPECT_EQ(expandHostlist("a,b,c.example.org"), Names({"a", "b", "c.example.org"}));
}

TEST(Hostlist, RangesKeepPaddingAndOrder) {
  EXPECT_EQ(expandHostlist("node[01-04,07],gpu-a[1-2]"),
            Names({"node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"}));
  EXPECT_EQ(expandHostlist("n[8-11]"), Names({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expandHostlist("n[08-10]"), Names({"n08", "n09", "n10"}));
  EXPECT_EQ(expandHostlist("n[5]"), Names({"n5"}));
  EXPECT_EQ(expandHostlist("n[3,1]"), Names({"n3", "n1"}));
}

TEST(Hostlist, SuffixAndSeveralBracketGroups) {
  EXPECT_EQ(expandHostlist("n[1-2]-ib"), Names({"n1-ib", "n2-ib"}));
  EXPECT_EQ(expandHostlist("r[1-2]-n[1-2]"), Names({"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(expandHostlist("x,r[0-1]n0,y"), Names({"x", "r0n0", "r1n0", "y"}));
}

TEST(Hostlist, MalformedNamesTheVariable) {
  for (std::string bad : {"", "n[1-3", "n1-3]", "n[]", "n[3-1]", "n[a-b]", "n[1-2-3]", "n[[1]]", "a,,b", "n[1,]",
                          "a b", ",a", "n[1-99999999]"}) {
    SCOPED_TRACE(bad);
    expectError([&] { expandHostlist(bad, "SLURM_JOB_NODELIST"); }, {"SLURM_JOB_NODELIST", "'" + bad + "'"});
  }
}

TEST(TasksPerNode, Expands) {
  EXPECT_EQ(expandTasksPerNode("2"), std::vector<int>({2}));
  EXPECT_EQ(expandTasksPerNode("2(x3),1"), std::vector<int>({2, 2, 2, 1}));
  EXPECT_EQ(expandTasksPerNode("4,3(x2)"), std::vector<int>({4, 3, 3}));
}

TEST(TasksPerNode, MalformedNamesTheVariable) {
  for (std::string bad : {"", "x", "2(3)", "2(x)", "2(x3", "2(y3)", "0", "2(x0)", "2,,1", "-1", "2(x3)1"}) {
    SCOPED_TRACE(bad);
    expectError([&] { expandTasksPerNode(bad, "SLURM_STEP_TASKS_PER_NODE"); },
                {"SLURM_STEP_TASKS_PER_NODE", "'" + bad + "'"});
  }
}

// detectSlurm() on a synthetic environment; restores the variables afterwards.
class SlurmEnv : public ::testing::Test {
 protected:
  const std::vector<const char*> vars_ = {
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID",
      "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST",
      "SLURM_JOB_ID", "SLURMD_NODENAME", "TESSERA_STORE_PORT", "TESSERA_STORE_HOST", "MASTER_PORT"};
  std::map<std::string, std::string> saved_;

  void SetUp() override {
    for (auto v : vars_) {
      if (const char* x = getenv(v)) saved_[v] = x;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (auto v : vars_) unsetenv(v);
    for (auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  void set(const std::map<std::string, std::string>& env) {
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  }
  // Two nodes with 2 tasks each; this is rank `rank` on node `node`.
  void twoByTwo(int rank, int local, int node, const std::string& nodename) {
    set({{"SLURM_PROCID", std::to_string(rank)}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", std::to_string(local)},
         {"SLURM_NODEID", std::to_string(node)}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
         {"SLURM_TASKS_PER_NODE", "8(x2)"}, {"SLURM_STEP_NODELIST", "gpu[07-08]"},
         {"SLURM_JOB_NODELIST", "gpu[01-08]"}, {"SLURM_JOB_ID", "123456"}, {"SLURMD_NODENAME", nodename}});
  }
};

TEST_F(SlurmEnv, AbsentWithoutSlurm) { EXPECT_FALSE(tessera::detectSlurm().has_value()); }

TEST_F(SlurmEnv, ReadsStepEnvironment) {
  twoByTwo(3, 1, 1, "gpu08");
  auto l = tessera::detectSlurm();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "slurm");
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->worldSize, 4);
  EXPECT_EQ(l->localRank, 1);
  EXPECT_EQ(l->localWorldSize, 2);  // the step's list, not the job's
  EXPECT_EQ(l->storeHost, "gpu07");  // first host of the step, not of the job
  EXPECT_EQ(l->storePort, 29500 + 123456 % 20000);
  EXPECT_FALSE(l->hostsStore);
}

TEST_F(SlurmEnv, RankZeroHostsAndPortOverrides) {
  twoByTwo(0, 0, 0, "gpu07");
  set({{"MASTER_PORT", "41000"}});
  auto l = tessera::detectSlurm();
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->hostsStore);
  EXPECT_EQ(l->storePort, 41000);
  set({{"TESSERA_STORE_PORT", "42000"}});
  EXPECT_EQ(tessera::detectSlurm()->storePort, 42000);
}

TEST_F(SlurmEnv, FallsBackToJobLists) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"},
       {"SLURM_STEPID", "2"}, {"SLURM_TASKS_PER_NODE", "3"}, {"SLURM_JOB_NODELIST", "vm"}, {"SLURM_JOB_ID", "7"},
       {"SLURMD_NODENAME", "vm"}});
  auto l = tessera::detectSlurm();
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->localWorldSize, 3);
  EXPECT_EQ(l->storeHost, "vm");
}

TEST_F(SlurmEnv, ErrorsNameTheVariable) {
  twoByTwo(1, 1, 0, "gpu07");
  set({{"SLURM_NTASKS", "four"}});
  expectError([] { tessera::detectSlurm(); }, {"SLURM_NTASKS", "four"});
  twoByTwo(5, 1, 0, "gpu07");
  expectError([] { tessera::detectSlurm(); }, {"SLURM_PROCID", "5"});
  twoByTwo(1, 1, 2, "gpu07");
  expectError([] { tessera::detectSlurm(); }, {"SLURM_NODEID=2", "SLURM_STEP_TASKS_PER_NODE"});
  twoByTwo(1, 1, 0, "gpu07");
  set({{"SLURM_STEP_NODELIST", "gpu[07-"}});
  expectError([] { tessera::detectSlurm(); }, {"SLURM_STEP_NODELIST", "gpu[07-"});
  twoByTwo(1, 1, 0, "gpu07");
  set({{"MASTER_PORT", "70000"}});
  expectError([] { tessera::detectSlurm(); }, {"MASTER_PORT", "70000"});
}

TEST_F(SlurmEnv, BatchScriptIsNotAStep) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "vm"}});
  expectError([] { tessera::detectSlurm(); }, {"SLURM_STEP_ID", "srun"});
}

TEST_F(SlurmEnv, RankZeroOnWrongHostFailsFast) {
  twoByTwo(0, 0, 1, "gpu08");
  set({{"SLURM_NODEID", "1"}});
  expectError([] { tessera::detectSlurm(); }, {"rank 0", "gpu08", "gpu07", "TESSERA_STORE_HOST"});
  set({{"TESSERA_STORE_HOST", "gpu08"}});
  EXPECT_EQ(tessera::detectSlurm()->storeHost, "gpu08");
}
