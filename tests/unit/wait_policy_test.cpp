// The OpenMP wait policy the `onnxtrain` command chooses from its command line (cli/wait_policy.h).
#include "cli/wait_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace onnxtrain::cli {
namespace {

bool fixes(std::vector<const char*> args, const char* omp_num_threads = nullptr) {
  args.insert(args.begin(), "onnxtrain");
  return fixes_thread_count(static_cast<int>(args.size()), args.data(), omp_num_threads);
}

TEST(WaitPolicy, DefaultFollowsTheLoad) {
  EXPECT_FALSE(fixes({}));
  EXPECT_FALSE(fixes({"train", "model.onnx", "--data", "d.npz", "--batch-size", "32"}));
  EXPECT_EQ(openmp_spin_count(1, std::vector<const char*>{"onnxtrain"}.data(), nullptr), kSpinFollowingLoad);
}

TEST(WaitPolicy, ThreadsFlagFixesTheCount) {
  EXPECT_TRUE(fixes({"train", "model.onnx", "--threads", "2"}));
  EXPECT_TRUE(fixes({"run", "model.onnx", "--threads=1", "--input", "x=x.npy"}));
  std::vector<const char*> argv{"onnxtrain", "train", "m.onnx", "--threads", "2"};
  EXPECT_EQ(openmp_spin_count(static_cast<int>(argv.size()), argv.data(), nullptr), kSpinFixedCount);
}

TEST(WaitPolicy, ZeroOrInvalidThreadsFollowTheLoad) {
  // --threads 0 is the commands' "default"; a bad value is the parser's to reject.
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads", "0"}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads=0"}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads", "two"}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads", "2x"}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads", "-2"}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads="}));
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threads"}));  // no value
  EXPECT_FALSE(fixes({"train", "m.onnx", "--threadsx", "2"}));
}

TEST(WaitPolicy, OperandsAfterDoubleDashAreNotFlags) {
  EXPECT_FALSE(fixes({"run", "--", "--threads", "2"}));
}

TEST(WaitPolicy, OmpNumThreadsFixesTheCount) {
  EXPECT_TRUE(fixes({"train", "m.onnx"}, "2"));
  EXPECT_TRUE(fixes({"train", "m.onnx"}, ""));  // set, even empty: the sessions do not follow the load either
}

}  // namespace
}  // namespace onnxtrain::cli
